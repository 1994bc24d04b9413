"""Settings files: the schedule, partition, run and tune settings as nested, typed sections that load from and
save to TOML or JSON (no torch).

One file, ``pipeloom.toml`` (``pipeloom tune --out DIR`` writes one), read by ``pipeloom plan --config FILE``
and ``pipeloom run --config FILE``; a flag given on the command line wins over the file. The sections, in
torchtitan's style (keyword-only dataclasses, one docstring per field, checked when made)::

    [schedule]    what to plan: builder, pp, vpp, microbatches, memory limit, costs, builder options
    [partition]   how the model's layers are cut into the pp*vpp chunks
    [model]       what `pipeloom run` trains
    [training]    data parallelism, steps, batch, optimizer, dtype
    [job]         checking, logs and timeouts of a run
    [tune]        what `pipeloom tune` was asked and what it predicted for this plan (a record)

A field left out of the file is the field's default; ``None`` means "not set" (the command's own default
applies) and is left out when saving, since TOML has no null. An error names the field as
``section.field`` and says what is allowed::

    >>> cfg = PipeloomConfig(schedule=ScheduleSection(name="zbv", pp=4, microbatches=8, mem_limit="1p"))
    >>> PipeloomConfig.from_toml(cfg.to_toml()) == cfg
    True
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import typing
from dataclasses import dataclass, field
from typing import ClassVar

#: the file ``pipeloom tune --out DIR`` writes into DIR
CONFIG_NAME = "pipeloom.toml"


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
    runtime: str | None = None
    """the runtime that executes the plan, for its memory model: pipeloom or torch (None: pipeloom)"""
    options: dict = field(default_factory=dict)
    """builder options (``-O KEY=VALUE``), e.g. {time_limit = 30}"""
    plan: str | None = None
    """a schedule file (relative to this settings file) to use instead of planning, e.g. the tuner's exact
    plan.json; used while no planning flag is given on the command line"""

    def __post_init__(self) -> None:
        s = self.SECTION
        _str(s, "name", self.name, none=False)
        _str(s, "plan", self.plan)
        _int(s, "pp", self.pp)
        _int(s, "vpp", self.vpp, none=True)
        _int(s, "microbatches", self.microbatches)
        for k in ("mem_limit", "costs", "mem"):
            _str(s, k, getattr(self, k))
        _str(s, "runtime", self.runtime, choices=("pipeloom", "torch"))
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
    balance: str | None = None
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
        for k in ("layers", "vocab", "hidden", "seq"):
            _int(s, k, getattr(self, k), none=True)
        for k in ("layers_per_device", "layers_per_chunk"):
            v = getattr(self, k)
            if isinstance(v, list):
                v = tuple(v)
                object.__setattr__(self, k, v)
            _ints(s, k, v)
        _str(s, "layer_costs", self.layer_costs)
        _str(s, "model", self.model)
        _str(s, "balance", self.balance, choices=("auto", "bottleneck", "makespan"))
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
        _str(s, "name", self.name)
        _int(s, "dim", self.dim, none=True)
        if self.dim is not None and self.dim % 8:
            raise ConfigError(f"{s}.dim must be a multiple of 8 (4 attention heads of an even size), got {self.dim}")
        _bool(s, "weights", self.weights)


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
    seed: int = 0
    """weights and data seed"""
    dtype: str = "fp32"
    """fp32, or bf16 (bf16 parameters, fp32 master weights and gradients)"""
    zero: int = 0
    """1: ZeRO-1 (gradients reduce-scattered, optimizer states sharded over dp); 0: replicated optimizer"""
    overlap_grad_reduce: bool = False
    """start each chunk's gradient reduction right after its last W/BW (dp > 1)"""
    rank_order: str = "dp-pp"
    """global rank -> (dp, pp): dp-pp (ranks 0..pp-1 are one pipeline) or pp-dp"""
    data: str | None = None
    """a token file (flat uint16/uint32 ids; None: synthetic data)"""
    data_dtype: str = "uint16"
    """the token file's integer type: uint16 or uint32"""

    def __post_init__(self) -> None:
        s = self.SECTION
        for k in ("dp", "steps", "microbatch_size", "seq_len"):
            _int(s, k, getattr(self, k))
        _int(s, "seed", self.seed, lo=0)
        _num(s, "lr", self.lr)
        _str(s, "dtype", self.dtype, none=False, choices=("fp32", "bf16"))
        if self.zero not in (0, 1) or isinstance(self.zero, bool):
            raise ConfigError(f"{s}.zero must be 0 (replicated optimizer) or 1 (ZeRO-1), got {self.zero!r}")
        _bool(s, "overlap_grad_reduce", self.overlap_grad_reduce)
        _str(s, "rank_order", self.rank_order, none=False, choices=("dp-pp", "pp-dp"))
        _str(s, "data", self.data)
        _str(s, "data_dtype", self.data_dtype, none=False, choices=("uint16", "uint32"))


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
        s = self.SECTION
        _bool(s, "verify", self.verify)
        _str(s, "log_dir", self.log_dir)
        _str(s, "profile_steps", self.profile_steps)
        _num(s, "timeout_s", self.timeout_s)


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
    recompute: str | None = None
    """activation recompute chosen: none, selective or full"""
    step_time_s: float | None = None
    """predicted step time (seconds)"""
    mfu: float | None = None
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
    intra_latency: float | None = None
    """seconds per message inside a node (--intra-latency)"""
    inter_bw: float | None = None
    """bytes/s between nodes (--inter-bw)"""
    inter_latency: float | None = None
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
    efficiency_half_hidden: float | None = None
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
    precision: str | None = None
    """GEMM precision, bf16 or fp8 (--precision)"""
    recompute_norms: bool | None = None
    """light recompute of norms and MLA up-projections (--recompute-norms)"""
    pair_fb: bool | None = None
    """F&B pairs added to the schedules that do not pair by themselves (--pair-fb)"""

    def __post_init__(self) -> None:
        s = self.SECTION
        if self.pair_fb is not None:
            _bool(s, "pair_fb", self.pair_fb)
        for k in ("ep", "cp", "pin_ep", "max_ep", "pin_cp", "max_cp", "route_nodes"):
            _int(s, k, getattr(self, k), none=True)
        _num(s, "capacity_factor", self.capacity_factor, none=True)
        _num(s, "moe_imbalance", self.moe_imbalance, none=True)
        _str(s, "precision", self.precision, choices=("bf16", "fp8"))
        if self.recompute_norms is not None:
            _bool(s, "recompute_norms", self.recompute_norms)
        for k in ("gpus", "global_batch", "seq", "tp", "gpus_per_node", "max_tp", "pin_tp", "pin_pp", "max_pp",
                  "max_vpp", "max_microbatch_size", "top", "pin_vpp", "pin_dp", "pin_microbatch_size",
                  "dp_bucket_size"):
            _int(s, k, getattr(self, k), none=True)
        _str(s, "tp_overlap", self.tp_overlap)
        if self.tp_comm_overlap is not None:
            _bool(s, "tp_comm_overlap", self.tp_comm_overlap)
        _num(s, "efficiency_half_hidden", self.efficiency_half_hidden, strict=False, none=True)
        for k in ("gpu_flops", "intra_bw", "inter_bw"):
            _num(s, k, getattr(self, k), none=True)
        for k in ("intra_latency", "inter_latency"):
            _num(s, k, getattr(self, k), strict=False, none=True)
        if self.efficiency is not None:
            _num(s, "efficiency", self.efficiency)
            if self.efficiency > 1:
                raise ConfigError(f"{s}.efficiency must be a share of the peak, in (0, 1]; got {self.efficiency!r}")
        for k in ("gpu_memory", "calibration", "schedules", "recompute_modes", "zero_modes", "reserve", "partitions"):
            _str(s, k, getattr(self, k))
        _str(s, "model", self.model)
        _str(s, "gpu", self.gpu)
        _str(s, "recompute", self.recompute, choices=("none", "selective", "full"))
        for k in ("step_time_s", "tokens_per_s"):
            _num(s, k, getattr(self, k), none=True)
        _num(s, "mfu", self.mfu, strict=False, none=True)


_SECTIONS = {"schedule": ScheduleSection, "partition": PartitionSection, "model": ModelSection,
             "training": TrainingSection, "job": JobSection, "tune": TuneSection}


@dataclass(kw_only=True, slots=True)
class PipeloomConfig:
    """A whole settings file: one typed section each."""

    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    """what to plan"""
    partition: PartitionSection = field(default_factory=PartitionSection)
    """how the layers are cut into chunks"""
    model: ModelSection = field(default_factory=ModelSection)
    """what a run trains"""
    training: TrainingSection = field(default_factory=TrainingSection)
    """data parallelism, steps, batch, optimizer, dtype"""
    job: JobSection = field(default_factory=JobSection)
    """checking, logs and timeouts"""
    tune: TuneSection = field(default_factory=TuneSection)
    """the tuner's record"""

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(f"{name} must be a {cls.__name__}, got {type(getattr(self, name)).__name__}")

    # ------------------------------------------------------------------ dicts
    def to_dict(self) -> dict:
        """Nested plain values: ``{section: {field: value}}``, None fields and empty sections left out."""
        out = {}
        for name in _SECTIONS:
            sec = getattr(self, name)
            d = {}
            for f in dataclasses.fields(sec):
                v = getattr(sec, f.name)
                if v is None or (isinstance(v, dict) and not v):
                    continue
                d[f.name] = list(v) if isinstance(v, tuple) else v
            if d:
                out[name] = d
        return out

    @classmethod
    def from_dict(cls, data: dict, *, where: str = "config") -> "PipeloomConfig":
        """The config of nested plain values (as :meth:`to_dict` makes); unknown sections or fields are
        errors naming them and listing the allowed ones."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a table of sections ({', '.join(_SECTIONS)}), got "
                              f"{type(data).__name__}")
        unknown = [k for k in data if k not in _SECTIONS]
        if unknown:
            raise ConfigError(f"{where}: unknown section {unknown[0]!r}; sections: {', '.join(_SECTIONS)}")
        kw = {}
        for name, sec_cls in _SECTIONS.items():
            d = data.get(name, {})
            if not isinstance(d, dict):
                raise ConfigError(f"{where}: [{name}] must be a table of fields, got {d!r}")
            names = [f.name for f in dataclasses.fields(sec_cls)]
            bad = [k for k in d if k not in names]
            if bad:
                raise ConfigError(f"{where}: {name}.{bad[0]} is not a field; [{name}] has: {', '.join(names)}")
            vals = {}
            for k, v in d.items():
                hint = _HINTS[name][k]
                if isinstance(v, list) and "tuple" in hint:
                    v = tuple(v)
                if isinstance(v, int) and not isinstance(v, bool) and "float" in hint and "int" not in hint:
                    v = float(v)
                vals[k] = v
            try:
                kw[name] = sec_cls(**vals)
            except ConfigError as e:
                raise ConfigError(f"{where}: {e}") from None
        return cls(**kw)

    @staticmethod
    def fields_in(data: dict) -> frozenset[str]:
        """``section.field`` of every field a file's nested values set (what a command line may override)."""
        return frozenset(f"{s}.{k}" for s, d in data.items() if isinstance(d, dict) for k in d)

    # ------------------------------------------------------------------ files
    def to_json(self) -> str:
        """Strict JSON text (no NaN/Infinity)."""
        return json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str, *, where: str = "config") -> "PipeloomConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not valid JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_dict(data, where=where)

    def to_toml(self, header: str = "") -> str:
        """TOML text: one ``[section]`` table each (``header``: comment lines put first)."""
        lines = [f"# {h}" if h else "#" for h in header.splitlines()] if header else []
        for name, d in self.to_dict().items():
            if lines:
                lines.append("")
            lines.append(f"[{name}]")
            for k, v in d.items():
                lines.append(f"{k} = {_toml_value(v, f'{name}.{k}')}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_toml(cls, text: str, *, where: str = "config") -> "PipeloomConfig":
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{where}: not valid TOML ({e})") from None
        return cls.from_dict(data, where=where)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PipeloomConfig":
        """Read a .toml or .json settings file; every error names the file."""
        return read_config(path)[0]

    def save(self, path: str | os.PathLike, header: str = "") -> None:
        """Write .toml or .json (by the name) whole or not at all."""
        from .files import write_text

        path = os.fspath(path)
        if path.lower().endswith(".json"):
            write_text(path, self.to_json())
        elif path.lower().endswith(".toml"):
            write_text(path, self.to_toml(header))
        else:
            raise ConfigError(f"{path}: a settings file ends in .toml or .json")


def read_config(path: str | os.PathLike) -> tuple[PipeloomConfig, frozenset[str]]:
    """A .toml or .json settings file and the ``section.field`` names it sets; every error names the file."""
    path = os.fspath(path)
    if not path.lower().endswith((".toml", ".json")):
        raise ConfigError(f"{path}: a settings file ends in .toml or .json")
    from .files import InputFileError, parse_json, read_input

    try:  # bounded, regular files only, every error naming the file (core/files.py)
        text = read_input(path, "settings file")
        if path.lower().endswith(".json"):
            data = parse_json(text, path)
    except InputFileError as e:
        raise ConfigError(f"{e} (expected TOML or JSON settings)" if "not a text file" in str(e) else str(e)) from None
    if not path.lower().endswith(".json"):
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML ({e})") from None
        except RecursionError:
            raise ConfigError(f"{path}: nested too deeply to be a settings file") from None
    cfg = PipeloomConfig.from_dict(data, where=path)
    if cfg.schedule.plan is not None and not os.path.isabs(cfg.schedule.plan):  # relative to the settings file
        cfg.schedule.plan = os.path.join(os.path.dirname(path), cfg.schedule.plan)
    return cfg, PipeloomConfig.fields_in(data)


_HINTS = {name: {f.name: str(f.type) for f in dataclasses.fields(cls)} for name, cls in _SECTIONS.items()}


def _toml_value(v, where: str) -> str:
    """A TOML value: bool, int, finite float, string (basic, escaped), array, inline table."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ConfigError(f"{where} = {v}: not a finite number (TOML and strict JSON have none)")
        return repr(v)
    if isinstance(v, str):
        # JSON's escapes are TOML's (\" \\ \b \f \n \r \t \uXXXX); DEL must be escaped in TOML too
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x, where) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x, f'{where}.{k}')}" for k, x in v.items()) + "}"
    if v is None:
        raise ConfigError(f"{where}: TOML has no null (leave the field out)")
    raise ConfigError(f"{where} = {v!r}: cannot write a {type(v).__name__} to TOML")


def _toml_key(k: str) -> str:
    import re

    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml_value(str(k), "key")


__all__ = ["PipeloomConfig", "ScheduleSection", "PartitionSection", "ModelSection", "TrainingSection", "JobSection",
           "TuneSection", "ConfigError", "CONFIG_NAME", "read_config"]
