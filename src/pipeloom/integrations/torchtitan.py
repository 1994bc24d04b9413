"""A pipeloom plan as what torchtitan 0.3 loads through its own config machinery (no torch).

torchtitan 0.3 has no TOML files: a run is ``--module M --config F`` (``F`` a function of module ``M``'s
``config_registry`` returning a ``Trainer.Config``) plus command-line overrides ``--section.field value``
(``torchtitan/config/manager.py``). For a plan pipeloom writes both forms:

* :func:`config_module_text` - a module ``pipeloom_torchtitan.py`` whose function ``pipeloom_plan`` starts from
  a torchtitan config function (``llama3_70b`` ... or yours, :data:`BASE_ENV`) and sets what the plan decides;
  run it as ``--module pipeloom_torchtitan --config pipeloom_plan`` with its folder on ``PYTHONPATH``;
* :func:`overrides` - the same settings as overrides to put after any ``--module ... --config ...``.

What the plan decides, and how torchtitan 0.3 is made to do it (its ``distributed/pipeline_parallel.py``):

* **the order**: the plan's compute-only CSV (``parallelism.pipeline_parallel_schedule_csv``), run by torch's
  ``_PipelineScheduleRuntime``;
* **which rank builds which stage**: torchtitan picks it from ``pipeline_parallel_schedule`` even when a CSV is
  given (``_get_pp_rank_to_stage_indices_mapping``): ``ZBVZeroBubble``/``DualPipeV`` give the V placement
  (exactly 2 stages per rank), any other name the looped one. pipeloom names ``ZBVZeroBubble`` for V plans with
  2 chunks per device and ``Interleaved1F1B`` (``1F1B`` at one chunk) for looped ones. A V plan with more than
  2 chunks per device has no torchtitan placement: :class:`TorchtitanUnsupported`;
* **the layer split**: ``module_fqns_per_model_part`` whenever the plan's split is not the one torchtitan
  generates by default (:func:`default_split`: by default the first and last stage hold one layer less, and
  multi-stage schedules get 2 stages per rank);
* **data parallelism**: pipeloom's memory model is plain replication or ZeRO-1 (optimizer state sharded,
  weights and gradients whole). torchtitan 0.3 has no ZeRO-1: its data parallelism is FSDP
  (``data_parallel_shard_degree``: weights, gradients and optimizer state sharded) or replication
  (``data_parallel_replicate_degree``). pipeloom writes replication (``replicate = dp, shard = 1``) and says so:
  every rank then keeps the whole optimizer state, more than a ZeRO-1 plan counted.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Sequence

from ..core.ir import Placement

#: the torchtitan version these files are written for (``pyproject.toml``'s ``titan`` extra pins it)
TORCHTITAN_VERSION = "0.3.0"
#: the environment variable that names another base config function, ``module:function``
BASE_ENV = "PIPELOOM_TORCHTITAN_BASE"
#: torchtitan's own config functions by number of layers (``torchtitan/models/llama3/config_registry.py``)
TITAN_LLAMA3 = {32: "llama3_8b", 80: "llama3_70b", 126: "llama3_405b"}
#: pipeloom's recompute modes as torchtitan's ``activation_checkpoint`` choice (a tyro subcommand)
RECOMPUTE = {"none": "none", "selective": "selective", "full": "full"}


class TorchtitanUnsupported(ValueError):
    """A plan torchtitan 0.3 cannot run as planned (the message says why, in one line)."""


@dataclass(frozen=True, kw_only=True)
class TitanJob:
    """What torchtitan needs to know of a plan: its shape, its layer split and the training settings."""

    pp: int
    vpp: int
    placement: Placement
    seg_layer_num: tuple[int, ...]
    """decoder layers per global chunk (the embedding in chunk 0, the norm and head in the last)"""
    microbatches: int
    microbatch_size: int = 1
    tp: int = 1
    dp: int = 1
    zero: int = 0
    recompute: str = "none"
    seq: int | None = None
    global_batch: int | None = None
    model: str | None = None
    schedule: str = ""
    """the pipeloom builder (for messages)"""

    @property
    def layers(self) -> int:
        return sum(self.seg_layer_num)

    @classmethod
    def from_schedule(cls, schedule, seg_layer_num: Sequence[int], **kw) -> "TitanJob":
        """The job of a pipeloom :class:`~pipeloom.core.ir.Schedule` with ``seg_layer_num`` layers per chunk
        (``kw``: the other fields: ``microbatch_size``, ``tp``, ``dp``, ...)."""
        return cls(pp=schedule.pp, vpp=schedule.vpp, placement=Placement(schedule.placement),
                   seg_layer_num=tuple(int(n) for n in seg_layer_num), microbatches=schedule.microbatches,
                   schedule=kw.pop("schedule", schedule.name), **kw)


def check_version(installed: str) -> None:
    """Refuse a torchtitan other than :data:`TORCHTITAN_VERSION` (major.minor): its config surface moves."""
    want = TORCHTITAN_VERSION.split(".")[:2]
    got = str(installed).split("+")[0].split(".")[:2]
    if got != want:
        raise TorchtitanUnsupported(
            f"these files are for torchtitan {TORCHTITAN_VERSION}; torchtitan {installed} is installed "
            f"(install torchtitan=={TORCHTITAN_VERSION}, or re-run pipeloom for your version)")


def installed_version() -> str | None:
    """The installed torchtitan's version (read from its package metadata, nothing imported), or None."""
    from importlib import metadata

    try:
        return metadata.version("torchtitan")
    except metadata.PackageNotFoundError:
        return None


def placement_schedule(job: TitanJob) -> str:
    """The ``pipeline_parallel_schedule`` name that makes torchtitan build the plan's stages on its ranks."""
    if job.vpp == 1:
        return "1F1B"
    if job.placement is Placement.V:
        if job.vpp != 2:
            raise TorchtitanUnsupported(
                f"{job.schedule or 'the plan'}: V placement with {job.vpp} chunks per device; torchtitan 0.3 places "
                f"V stages only 2 per rank (distributed/pipeline_parallel.py, _get_pp_rank_to_stage_indices_mapping)"
                f": plan it with --vpp 2 or a looped schedule")
        return "ZBVZeroBubble"
    return "Interleaved1F1B"


def default_split(num_stages: int, num_layers: int, first_less: int = 1, last_less: int = 1) -> list[int] | None:
    """Decoder layers per stage that torchtitan 0.3 generates itself (``_generate_llm_fqn_per_model_part``),
    or ``None`` where it refuses the shape."""
    if num_stages == 1:
        return [num_layers]
    eff = num_layers + first_less + last_less
    if num_stages > eff:
        return None
    per, extra = divmod(eff, num_stages)
    if per == 0 or first_less > per or last_less > per:
        return None
    out, left = [], num_layers
    for s in range(num_stages):
        n = per + (1 if s < extra else 0)
        if s == 0:
            n -= first_less
        elif s == num_stages - 1:
            n -= last_less
        n = max(0, min(n, left))
        out.append(n)
        left -= n
    return out


def fqns_per_model_part(counts: Sequence[int]) -> list[list[str]]:
    """torchtitan's module names per stage for a split (``tok_embeddings`` first, ``norm``, ``lm_head`` last)."""
    out, k = [], 0
    for s, n in enumerate(counts):
        part = ["tok_embeddings"] if s == 0 else []
        part += [f"layers.{i}" for i in range(k, k + int(n))]
        k += int(n)
        if s == len(counts) - 1:
            part += ["norm", "lm_head"]
        out.append(part)
    return out


def base_config(job: TitanJob) -> tuple[str, str | None]:
    """(``module:function`` of the torchtitan config to start from, a note when it is not the plan's model)."""
    name = (job.model or "").lower()
    fn = TITAN_LLAMA3.get(job.layers)
    if fn is None:
        return ("torchtitan.models.llama3.config_registry:llama3_debugmodel",
                f"torchtitan has no config with {job.layers} layers; set {BASE_ENV}=your.module:function "
                f"(a config function whose model has {job.layers} layers) before launching")
    note = None
    if not name.startswith("llama3") and "llama-3" not in name:
        note = (f"torchtitan has no {job.model or 'such'} config; the base is its {fn} (the same depth, "
                f"{job.layers} layers); set {BASE_ENV}=your.module:function for your own model")
    return f"torchtitan.models.llama3.config_registry:{fn}", note


def settings(job: TitanJob, csv_path: str) -> dict:
    """The torchtitan fields the plan decides, by section: ``{"parallelism": {...}, "training": {...},
    "activation_checkpoint": "none"|"selective"|"full"}`` (raises :class:`TorchtitanUnsupported`)."""
    if job.recompute not in RECOMPUTE:
        raise TorchtitanUnsupported(f"recompute {job.recompute!r}; torchtitan knows {', '.join(RECOMPUTE)}")
    if len(job.seg_layer_num) != job.pp * job.vpp or min(job.seg_layer_num, default=0) < 1:
        raise TorchtitanUnsupported(f"the split {list(job.seg_layer_num)} is not pp*vpp = {job.pp * job.vpp} "
                                    f"chunks of >= 1 layer")
    name = placement_schedule(job)
    par: dict = {"pipeline_parallel_degree": job.pp, "tensor_parallel_degree": job.tp,
                 "data_parallel_replicate_degree": job.dp, "data_parallel_shard_degree": 1,
                 "pipeline_parallel_schedule": name, "pipeline_parallel_schedule_csv": csv_path,
                 "pipeline_parallel_microbatch_size": job.microbatch_size}
    # torchtitan's default: 1 stage per rank for single-stage names, 2 for multi-stage ones
    default_stages = job.pp * (1 if name == "1F1B" else 2)
    if len(job.seg_layer_num) != default_stages or default_split(default_stages, job.layers) != list(job.seg_layer_num):
        par["module_fqns_per_model_part"] = fqns_per_model_part(job.seg_layer_num)
    local = job.microbatch_size * job.microbatches
    tr: dict = {"local_batch_size": local, "global_batch_size": job.global_batch or local * job.dp,
                # Trainer.Config refuses CUDA graphs with pipeline parallelism (trainer.py, _validate_cuda_graphs)
                "disable_cuda_graphs": True}
    if job.seq:
        tr["seq_len"] = job.seq
    return {"parallelism": par, "training": tr, "activation_checkpoint": RECOMPUTE[job.recompute]}


def notes(job: TitanJob) -> list[str]:
    """What the torchtitan files do differently from the plan, one line each."""
    out = []
    if job.dp > 1 or job.zero:
        out.append(
            f"data parallelism: data_parallel_replicate_degree = {job.dp}, data_parallel_shard_degree = 1 "
            f"(replication); torchtitan 0.3 has no ZeRO-1, so every rank keeps the whole optimizer state"
            + (" (this ZeRO-1 plan counted 1/dp of it: more memory than planned; tune with --zero 0 for a plan "
               "whose memory is torchtitan's replication, or set data_parallel_shard_degree (FSDP: weights and "
               "gradients sharded too, more communication than planned))" if job.zero == 1 else
               f" (this ZeRO-{job.zero} plan counted 1/dp of the optimizer states and gradients"
               f"{' and weights' if job.zero == 3 else ''}: set data_parallel_shard_degree = {job.dp} and "
               f"data_parallel_replicate_degree = 1 (FSDP) for its sharding)" if job.zero else ""))
    _, note = base_config(job)
    if note:
        out.append(note)
    got = installed_version()
    if got is not None:
        try:
            check_version(got)
        except TorchtitanUnsupported as e:
            out.append(str(e))
    return out


def _flag_value(v) -> list[str]:
    if isinstance(v, list):
        return [",".join(part) for part in v]
    return [str(v)]


def overrides(st: dict) -> list[str]:
    """``st`` (from :func:`settings`) as torchtitan command-line overrides (tyro: ``--section.field value``;
    ``module_fqns_per_model_part`` one comma-joined argument per stage; the checkpointing choice is the
    subcommand ``activation_checkpoint:none|selective|full``, given last)."""
    args: list[str] = []
    for sec in ("parallelism", "training"):
        for k, v in st[sec].items():
            if isinstance(v, bool):
                args.append(f"--{sec}.{k}" if v else f"--{sec}.no-{k}")
                continue
            args.append(f"--{sec}.{k}")
            args += _flag_value(v)
    args.append(f"activation-checkpoint:{st['activation_checkpoint']}")
    return args


def shell_join(args: Sequence[str]) -> str:
    """One shell line (arguments quoted where needed)."""
    import shlex

    return " ".join(shlex.quote(a) for a in args)


_MODULE = '''"""torchtitan {version} config for a plan pipeloom wrote: {summary}.

Run from torchtitan's repository, with this folder on PYTHONPATH:

    PYTHONPATH={here} {launcher} -m torchtitan.train --module pipeloom_torchtitan --config pipeloom_plan

pipeloom_plan() starts from torchtitan's {base_fn} (set {env}=your.module:function to start from
your own config function; its model must have {layers} layers) and sets what the plan decides: the
parallel degrees, the batch, the plan's own schedule CSV, the placement of the stages on the ranks and
the layer split. Written for torchtitan {version}; another version is refused.
"""
import importlib
import os

TORCHTITAN_VERSION = {version!r}
BASE = {base!r}
HERE = os.path.dirname(os.path.abspath(__file__))
LAYERS = {layers}
CSV = {csv!r}
PARALLELISM = {parallelism}
TRAINING = {training}
ACTIVATION_CHECKPOINT = {ac!r}


def _check_version():
    import torchtitan

    got = str(getattr(torchtitan, "__version__", "unknown")).split("+")[0]
    if got.split(".")[:2] != TORCHTITAN_VERSION.split(".")[:2]:
        raise RuntimeError(f"pipeloom wrote this config for torchtitan {{TORCHTITAN_VERSION}}; "
                           f"torchtitan {{got}} is installed")


def apply_plan(config):
    """Set the plan's fields on a torchtitan Trainer.Config (or any config with the same sections)."""
    _check_version()
    spec = getattr(config, "model_spec", None)
    layers = getattr(getattr(spec, "model", None), "layers", None)
    if layers is not None and len(layers) != LAYERS:
        raise ValueError(f"the base config's model has {{len(layers)}} layers; this plan splits {{LAYERS}}: "
                         f"set {env}=your.module:function to a config of the planned model")
    for key, value in PARALLELISM.items():
        setattr(config.parallelism, key, value)
    config.parallelism.pipeline_parallel_schedule_csv = os.path.join(HERE, CSV)
    for key, value in TRAINING.items():
        setattr(config.training, key, value)
    if hasattr(config, "activation_checkpoint"):
        from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

        config.activation_checkpoint = {{"none": None, "selective": SelectiveAC.Config,
                                         "full": FullAC.Config}}[ACTIVATION_CHECKPOINT]
        if config.activation_checkpoint is not None:
            config.activation_checkpoint = config.activation_checkpoint()
    return config


def pipeloom_plan():
    """torchtitan's config function for the plan (``--module pipeloom_torchtitan --config pipeloom_plan``)."""
    module, _, function = os.environ.get({env!r}, BASE).partition(":")
    return apply_plan(getattr(importlib.import_module(module), function)())
'''


def _py(obj) -> str:
    """A Python literal of ``obj`` (JSON's form is valid Python for str/int/list/dict; booleans fixed)."""
    text = json.dumps(obj, indent=4)
    return re.sub(r"\b(true|false|null)\b", lambda m: {"true": "True", "false": "False", "null": "None"}[m.group(1)],
                  text)


def config_module_text(job: TitanJob, csv_name: str, *, summary: str = "", launcher: str = "torchrun",
                       here: str = "THIS_FOLDER") -> str:
    """The source of ``pipeloom_torchtitan.py`` (see the module docstring)."""
    st = settings(job, csv_name)
    par = dict(st["parallelism"])
    par.pop("pipeline_parallel_schedule_csv")
    base, _ = base_config(job)
    return _MODULE.format(version=TORCHTITAN_VERSION, summary=summary or _summary(job), here=here,
                          launcher=launcher, base_fn=base.split(":")[1], env=BASE_ENV, layers=job.layers,
                          base=base, csv=csv_name, parallelism=_py(par), training=_py(st["training"]),
                          ac=st["activation_checkpoint"])


#: the files :func:`write_files` writes beside the plan's torch CSV
FILES = ("pipeloom_torchtitan.py", "torchtitan_args.txt")


def write_files(job: TitanJob, out_dir: str, csv_name: str, *, launcher: str = "torchrun") -> tuple[list[str], dict]:
    """Write :data:`FILES` into ``out_dir``, where the plan's torch CSV ``csv_name`` lies (``tune --out`` and
    ``plan --torchtitan`` call this); returns (the written paths, what ``launch.json`` records: the command,
    the overrides and settings, or ``unsupported`` with the one-line reason, when nothing is written)."""
    import os

    from ..core.files import write_text

    titan: dict = {"version": TORCHTITAN_VERSION, "notes": notes(job)}
    try:
        st = settings(job, os.path.abspath(os.path.join(out_dir, csv_name)))
    except TorchtitanUnsupported as e:
        titan.update(unsupported=str(e), config_module=None, command=None, overrides=None)
        return [], titan
    module = os.path.join(out_dir, FILES[0])
    write_text(module, config_module_text(job, csv_name, launcher=launcher, here=out_dir))
    base, _ = base_config(job)
    mod, fn = base.rsplit(".config_registry:", 1)
    ov = ["--module", mod.rsplit(".", 1)[1], "--config", fn] + overrides(st)
    args = os.path.join(out_dir, FILES[1])
    write_text(args, shell_join(ov) + "\n")
    titan.update(unsupported=None, config_module=FILES[0],
                 command=f"PYTHONPATH={out_dir} {launcher} -m torchtitan.train --module pipeloom_torchtitan "
                         f"--config pipeloom_plan",
                 overrides=ov, settings=st)
    return [module, args], titan


def _summary(job: TitanJob) -> str:
    return (f"{job.schedule or 'plan'} pp={job.pp} vpp={job.vpp} ({job.placement.value} placement) "
            f"m={job.microbatches} tp={job.tp} dp={job.dp}, layers per chunk {list(job.seg_layer_num)}")


__all__ = ["BASE_ENV", "FILES", "RECOMPUTE", "TITAN_LLAMA3", "TORCHTITAN_VERSION", "TitanJob", "TorchtitanUnsupported",
           "base_config", "check_version", "config_module_text", "default_split", "fqns_per_model_part",
           "installed_version", "notes",
           "overrides", "placement_schedule", "settings", "shell_join", "write_files"]
