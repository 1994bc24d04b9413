"""The sections of a settings file ([schedule], [partition], [model], [training], [job], [tune]) and the one check
of their fields (no torch).

Each section is a keyword-only dataclass, one docstring per field, checked when made by :func:`check_fields`
from the field's declared type (rules no type says, e.g. ``training.zero`` in {0, 1}, stay in the section's
``__post_init__``). :mod:`pipeloom.core.config` puts them together into a file (:class:`~pipeloom.core.config.PipeloomConfig`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import ClassVar


class ConfigError(ValueError):
    """A settings file or value that is not allowed; the message names the field (``section.field``)."""


def _int(sec: str, name: str, v, lo: int = 1, *, none: bool = False) -> None:
    if v is None and none:
        return
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ConfigError(f"{sec}.{name} must be an integer >= {lo}{' (or left out)' if none else ''}, got {v!r}")


def _num(sec: str, name: str, v, lo: float = 0.0, *, strict: bool = True, none: bool = False) -> None:
    if v is None and none:
        return
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v > lo if strict else v >= lo)
    if not ok:
        raise ConfigError(f"{sec}.{name} must be a finite number {'>' if strict else '>='} {lo:g}, got {v!r}")


def _str(sec: str, name: str, v, *, none: bool = True, choices: tuple | None = None) -> None:
    if v is None and none:
        return
    if not isinstance(v, str) or not v.strip():
        raise ConfigError(f"{sec}.{name} must be a non-empty string{' (or left out)' if none else ''}, got {v!r}")
    if choices is not None and v not in choices:
        raise ConfigError(f"{sec}.{name} must be one of {', '.join(map(str, choices))}; got {v!r}")


def _bool(sec: str, name: str, v) -> None:
    if not isinstance(v, bool):
        raise ConfigError(f"{sec}.{name} must be true or false, got {v!r}")


def _ints(sec: str, name: str, v) -> None:
    if v is None:
        return
    if not isinstance(v, tuple) or not v or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v):
        raise ConfigError(f"{sec}.{name} must be a list of integers >= 1 (or left out), got {v!r}")


#: a field's metadata: the section's own ``__post_init__`` checks it (a rule no type says)
OWN_CHECK = {"own": True}


def check_fields(sec) -> None:
    """Check every field of a settings section by its declared type, the one validation shape of all sections:
    ``int`` an integer >= 1 (``metadata={"lo": 0}``: another floor), ``float`` a finite number > 0
    (``{"strict": False}``: >= 0), ``str`` a non-empty string (``{"choices": (...)}``: one of those), ``bool`` true
    or false, ``tuple[int, ...]`` a list of integers >= 1 (a list becomes a tuple); ``... | None`` may also be left
    out. A field with :data:`OWN_CHECK` is left to the section; a type without a rule here is a TypeError, so a
    new field cannot go unchecked."""
    s = sec.SECTION
    for f in dataclasses.fields(sec):
        meta = f.metadata
        if meta.get("own"):
            continue
        t = str(f.type)
        none = t.endswith(" | None")
        base = t.removesuffix(" | None")
        v = getattr(sec, f.name)
        if base == "int":
            _int(s, f.name, v, meta.get("lo", 1), none=none)
        elif base == "float":
            _num(s, f.name, v, strict=meta.get("strict", True), none=none)
        elif base == "str":
            _str(s, f.name, v, none=none, choices=meta.get("choices"))
        elif base == "bool":
            if not (v is None and none):
                _bool(s, f.name, v)
        elif base == "tuple[int, ...]":
            if isinstance(v, list):
                v = tuple(v)
                object.__setattr__(sec, f.name, v)
            _ints(s, f.name, v)
        else:
            raise TypeError(f"{s}.{f.name}: no check for a field of type {t}; mark it OWN_CHECK and check it in "
                            f"the section's __post_init__")


@dataclass(kw_only=True, slots=True)
class ScheduleSection:
    """What to plan (``pipeloom plan``'s and ``run``'s planning options)."""

    SECTION: ClassVar[str] = "schedule"
    name: str = "1f1b"
    """schedule builder from the registry (``pipeloom compare`` lists them), e.g. zbv, interleaved"""
    pp: int = 2
    """pipeline stages (devices)"""
    vpp: int | None = None
    """chunks per device (None: the builder's default: 2 for interleaved and V-shape schedules, else 1)"""
    microbatches: int = 4
    """microbatches per step"""
    mem_limit: str | None = None
    """peak activation memory per device: none, 1p (1F1B's peak), 1.5p, Xp or units (None: the builder's
    default)"""
    costs: str | None = None
    """F=..,B=..,W=..,comm=.. per chunk pass (None: unit costs)"""
    mem: str | None = None
    """activation memory model a=..,b=.. per chunk pass (None: a = 1/vpp, b = a/2)"""
    runtime: str | None = field(default=None, metadata={"choices": ("pipeloom", "torch")})
    """the runtime that executes the plan, for its memory model: pipeloom or torch (None: pipeloom)"""
    options: dict = field(default_factory=dict, metadata=OWN_CHECK)
    """builder options (``-O KEY=VALUE``), e.g. {time_limit = 30}"""
    plan: str | None = None
    """a schedule file (relative to this settings file) to use instead of planning, e.g. the tuner's exact
    plan.json; used while no planning flag is given on the command line"""

    def __post_init__(self) -> None:
        s = self.SECTION
        check_fields(self)
        if self.mem_limit is not None:
            from .costs import parse_mem_limit
            try:
                parse_mem_limit(self.mem_limit, self.pp)
            except ValueError as e:
                raise ConfigError(f"{s}.mem_limit {self.mem_limit!r}: {e}") from None
        if self.costs is not None:
            from .costs import Costs
            try:
                Costs.parse(self.costs)
            except ValueError as e:
                raise ConfigError(f"{s}.costs {self.costs!r}: {e}") from None
        if not isinstance(self.options, dict) or not all(isinstance(k, str) for k in self.options):
            raise ConfigError(f"{s}.options must be a table of KEY = VALUE, got {self.options!r}")


@dataclass(kw_only=True, slots=True)
class PartitionSection:
    """How the model's layers are cut into the pp*vpp chunks (``pipeloom partition``'s options). Without any
    field set every chunk costs ``schedule.costs``."""

    SECTION: ClassVar[str] = "partition"
    layers: int | None = None
    """transformer layers, split uniformly (counts differ by at most one, extras on the first chunks)"""
    layers_per_device: tuple[int, ...] | None = None
    """layers of each device, dealt round-robin over its chunks"""
    layers_per_chunk: tuple[int, ...] | None = None
    """layers of every global chunk (the split itself, e.g. the one ``tune`` chose); the costs follow it"""
    layer_costs: str | None = None
    """a per-layer cost file (.json or .csv)"""
    balance: str | None = field(default=None, metadata={"choices": ("auto", "bottleneck", "makespan")})
    """choose the per-chunk counts by cost: bottleneck, makespan or auto"""
    model: str | None = None
    """cost the layers from a model: a preset or a Hugging Face config.json"""
    vocab: int | None = None
    """vocabulary size (costs the head, with ``hidden``)"""
    hidden: int | None = None
    """hidden size (with ``vocab``)"""
    seq: int | None = None
    """sequence length (the attention term of the head/layer ratio)"""

    def __post_init__(self) -> None:
        s = self.SECTION
        check_fields(self)
        given = [k for k in ("layers_per_device", "layers_per_chunk", "balance") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ConfigError(f"{s}: {' and '.join(f'{s}.{k}' for k in given)} each choose the split; give one")
        if self.layers_per_chunk is not None and self.layers is not None and sum(self.layers_per_chunk) != self.layers:
            raise ConfigError(f"{s}.layers_per_chunk sums to {sum(self.layers_per_chunk)} layers but {s}.layers is "
                              f"{self.layers}; make them agree (or leave out {s}.layers)")

    def given(self) -> bool:
        """True when any field is set (then the chunks' costs come from the layers)."""
        return any(getattr(self, f.name) is not None for f in dataclasses.fields(self))


@dataclass(kw_only=True, slots=True)
class ModelSection:
    """What ``pipeloom run`` trains."""

    SECTION: ClassVar[str] = "model"
    name: str | None = None
    """llama-tiny (the built-in example), or a path to a transformers config.json or its directory (None:
    llama-tiny)"""
    dim: int | None = None
    """width of the example model, a multiple of 8 (None: 64)"""
    weights: bool = False
    """load the weights from the *.safetensors files next to config.json (a transformers model only)"""

    def __post_init__(self) -> None:
        s = self.SECTION
        check_fields(self)
        if self.dim is not None and self.dim % 8:
            raise ConfigError(f"{s}.dim must be a multiple of 8 (4 attention heads of an even size), got {self.dim}")


@dataclass(kw_only=True, slots=True)
class TrainingSection:
    """Data parallelism, steps, batch, optimizer and dtype of a run."""

    SECTION: ClassVar[str] = "training"
    dp: int = 1
    """data-parallel replicas; world size = pp * dp"""
    steps: int = 3
    """optimizer steps"""
    microbatch_size: int = 2
    """sequences per microbatch"""
    seq_len: int = 16
    """tokens per sequence"""
    lr: float = 1e-3
    """AdamW learning rate"""
    seed: int = field(default=0, metadata={"lo": 0})
    """weights and data seed"""
    dtype: str = field(default="fp32", metadata={"choices": ("fp32", "bf16")})
    """fp32, or bf16 (bf16 parameters, fp32 master weights and gradients)"""
    zero: int = field(default=0, metadata=OWN_CHECK)
    """1: ZeRO-1 (gradients reduce-scattered, optimizer states sharded over dp); 0: replicated optimizer"""
    overlap_grad_reduce: bool = False
    """start each chunk's gradient reduction right after its last W/BW (dp > 1)"""
    rank_order: str = field(default="dp-pp", metadata={"choices": ("dp-pp", "pp-dp")})
    """global rank -> (dp, pp): dp-pp (ranks 0..pp-1 are one pipeline) or pp-dp"""
    data: str | None = None
    """a token file (flat uint16/uint32 ids; None: synthetic data)"""
    data_dtype: str = field(default="uint16", metadata={"choices": ("uint16", "uint32")})
    """the token file's integer type: uint16 or uint32"""

    def __post_init__(self) -> None:
        s = self.SECTION
        check_fields(self)
        if self.zero not in (0, 1) or isinstance(self.zero, bool):
            raise ConfigError(f"{s}.zero must be 0 (replicated optimizer) or 1 (ZeRO-1), got {self.zero!r}")


@dataclass(kw_only=True, slots=True)
class JobSection:
    """Checking, logs and timeouts of a run."""

    SECTION: ClassVar[str] = "job"
    verify: bool = False
    """compare the first step with a single-process reference"""
    log_dir: str | None = None
    """write per-rank job logs DIR/workerlog.<rank>"""
    profile_steps: str | None = None
    """with log_dir: log the jobs of steps A..B-1 only (A:B)"""
    timeout_s: float = 120.0
    """fail when a rank waits longer than this on a peer (seconds)"""

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(kw_only=True, slots=True)
class TuneSection:
    """What ``pipeloom tune`` was asked and what it predicted for this plan (a record; plan and run read the
    other sections)."""

    SECTION: ClassVar[str] = "tune"
    model: str | None = None
    """the model tuned for: a preset or a config.json"""
    gpus: int | None = None
    """GPUs of the run"""
    gpu: str | None = None
    """the GPU preset"""
    global_batch: int | None = None
    """sequences per optimizer step (= dp x microbatch size x microbatches)"""
    seq: int | None = None
    """tokens per sequence"""
    tp: int | None = None
    """tensor-parallel degree chosen"""
    recompute: str | None = field(default=None, metadata={"choices": ("none", "selective", "full")})
    """activation recompute chosen: none, selective or full"""
    step_time_s: float | None = None
    """predicted step time (seconds)"""
    mfu: float | None = field(default=None, metadata={"strict": False})
    """predicted model FLOPs utilisation (0..1)"""
    tokens_per_s: float | None = None
    """predicted throughput"""
    # the rest of the question (tune's flags of the same names; left out = the flag's default)
    gpus_per_node: int | None = None
    """GPUs per node (--gpus-per-node)"""
    gpu_flops: float | None = None
    """peak FLOP/s of one GPU, replacing the preset's (--gpu-flops)"""
    gpu_memory: str | None = None
    """memory per GPU, e.g. "80GiB", replacing the preset's (--gpu-memory)"""
    intra_bw: float | None = None
    """bytes/s between GPUs of a node (--intra-bw)"""
    intra_latency: float | None = field(default=None, metadata={"strict": False})
    """seconds per message inside a node (--intra-latency)"""
    inter_bw: float | None = None
    """bytes/s between nodes (--inter-bw)"""
    inter_latency: float | None = field(default=None, metadata={"strict": False})
    """seconds per message between nodes (--inter-latency)"""
    efficiency: float | None = None
    """share of peak FLOP/s a GEMM reaches, 0..1 (--efficiency)"""
    calibration: str | None = None
    """a calibration file (--calibration)"""
    max_tp: int | None = None
    """largest tensor-parallel degree searched (--max-tp)"""
    pin_tp: int | None = None
    """the tensor-parallel degree, fixed (--tp)"""
    pin_pp: int | None = None
    """the pipeline degree, fixed (--pp)"""
    max_pp: int | None = None
    """largest pipeline degree searched (--max-pp)"""
    max_vpp: int | None = None
    """largest number of chunks per device searched (--max-vpp)"""
    max_microbatch_size: int | None = None
    """largest micro-batch size searched (--max-microbatch-size)"""
    schedules: str | None = None
    """schedules searched, comma-separated (--schedules)"""
    recompute_modes: str | None = None
    """recompute modes searched, comma-separated (--recompute)"""
    zero_modes: str | None = None
    """ZeRO settings searched, comma-separated (--zero)"""
    reserve: str | None = None
    """memory kept free per GPU, e.g. "2GiB" (--reserve)"""
    top: int | None = None
    """configurations ranked (--top)"""
    pin_vpp: int | None = None
    """chunks per device, fixed (--vpp)"""
    pin_dp: int | None = None
    """the data-parallel degree, fixed (--dp)"""
    pin_microbatch_size: int | None = None
    """the micro-batch size, fixed (--microbatch-size)"""
    partitions: str | None = None
    """layer partitions searched, comma-separated (--partitions)"""
    tp_overlap: str | None = None
    """how TP collectives overlap compute: off, async, chunked:K, fill (--tp-overlap)"""
    tp_comm_overlap: bool | None = None
    """Megatron's --tp-comm-overlap, forward collectives behind the GEMMs (--tp-comm-overlap)"""
    dp_bucket_size: int | None = None
    """parameters per DP gradient bucket (--dp-bucket-size)"""
    efficiency_half_hidden: float | None = field(default=None, metadata={"strict": False})
    """hidden size at which a layer reaches half the efficiency (--efficiency-half-hidden)"""
    # mixture of experts, long context, FP8 (docs/moe.md): the chosen degrees and the question's flags
    ep: int | None = None
    """expert-parallel degree chosen"""
    cp: int | None = None
    """context-parallel degree chosen"""
    pin_ep: int | None = None
    """the expert-parallel degree, fixed (--ep)"""
    max_ep: int | None = None
    """largest expert-parallel degree searched (--max-ep)"""
    pin_cp: int | None = None
    """the context-parallel degree, fixed (--cp)"""
    max_cp: int | None = None
    """largest context-parallel degree searched (--max-cp)"""
    capacity_factor: float | None = None
    """expert capacity over the mean load (--capacity-factor)"""
    moe_imbalance: float | None = None
    """dropless: the busiest rank's expert load over the mean (--moe-imbalance)"""
    route_nodes: int | None = None
    """node-limited routing: nodes per token (--route-nodes)"""
    precision: str | None = field(default=None, metadata={"choices": ("bf16", "fp8")})
    """GEMM precision, bf16 or fp8 (--precision)"""
    recompute_norms: bool | None = None
    """light recompute of norms and MLA up-projections (--recompute-norms)"""
    pair_fb: bool | None = None
    """F&B pairs added to the schedules that do not pair by themselves (--pair-fb)"""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.efficiency is not None and self.efficiency > 1:
            raise ConfigError(f"{self.SECTION}.efficiency must be a share of the peak, in (0, 1]; got "
                              f"{self.efficiency!r}")
