"""Per-device memory of a model under a pipeline schedule (no torch): :func:`estimate`.

The layer model (what a layer, a chunk and a device hold in bytes) is :mod:`pipeloom.memory.layers`; what a
device holds besides the schedule's activations, and a size in bytes as a limit in units, is
:mod:`pipeloom.memory.budget`. Here the schedule is built (by the registry, with the memory model of this
estimate) and its order-based memory trace (:func:`pipeloom.sim.simulate.memory_profile`) gives each
device's peak held activations, scaled by the unit ``U = sum_c A_c / pp``.

The names of the layer model and of the budget are re-exported, so ``pipeloom.memory.analytic`` keeps
offering everything it did.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..core.costs import MemLimit, parse_size
from ..models.config import ModelConfig
from ..models.flops import active_params, embedding_params, head_params, layer_params, total_params  # noqa: F401
from ..models.hf_config import resolve_model
from ..models.presets import PRESETS, preset  # noqa: F401  (re-exported: `pipeloom memory --model`)
from .budget import DeviceBudget, activation_trace, device_budget, device_params, mem_model_for  # noqa: F401
from .budget import limit_units as limit_of, mem_limit_units, plan_mem_model  # noqa: F401
from .sharding import ZERO_LEVELS, shard_transient_bytes, sharded  # noqa: F401
from .layers import (DTYPE_BYTES, ChunkMemory, Item, MemoryConfigError, TrainConfig, check_tp,  # noqa: F401
                     chunk_input_bytes, chunk_memory, chunk_rope_bytes, embedding_activations, head_activations,
                     head_w_grads, layer_activations, layer_w_grads, layer_w_held, split_layers, static_bytes,
                     transient_bytes)

GiB = 1024 ** 3

#: the sequence length assumed when none is given and the model's context (``max_position_embeddings``) is longer:
#: 8192, the pre-training length of Llama 3 (Dubey et al. 2024, sec. 3.4: 8K tokens, then long-context training
#: in stages up to 128K). A model's published context is what long-context extension reaches at the end of
#: training (with context parallelism), not what a pre-training step holds; estimating a 131072-token step
#: is rarely what the user meant, and says "does NOT fit" for every layout.
DEFAULT_TRAINING_SEQ = 8192


def training_seq(model: ModelConfig, seq: int | None) -> tuple[int, str | None]:
    """(the sequence length to estimate, a one-line warning or None): ``seq`` when given; else the model's
    context when it is at most :data:`DEFAULT_TRAINING_SEQ`, or that default with a warning saying so."""
    if seq is not None:
        return seq, None
    if model.seq <= DEFAULT_TRAINING_SEQ:
        return model.seq, None
    return DEFAULT_TRAINING_SEQ, (f"--seq not given: {model.name}'s context is {model.seq} tokens; estimating a "
                                  f"training step of {DEFAULT_TRAINING_SEQ} (a typical pre-training length); give "
                                  f"--seq {model.seq} for the full context")


def parse_bytes(text: str | int | float, *, what: str = "memory size") -> int:
    """``80GiB``, ``80GB`` (10^9), ``512MiB``, ``1.5TiB`` or a plain number of bytes -> bytes
    (:func:`pipeloom.core.costs.parse_size`, the one size grammar; a bad size is a :class:`MemoryConfigError`)."""
    try:
        return parse_size(text, what=what)
    except ValueError as e:
        raise MemoryConfigError(str(e)) from None


def is_byte_size(text) -> bool:
    """True when ``text`` is a memory limit in bytes (has a B/KiB/GiB... unit), not units or Xp."""
    try:
        return MemLimit.parse(text).is_bytes
    except ValueError:
        return False


# ------------------------------------------------------------------------------------- schedule
@dataclass(slots=True)
class DeviceMemory:
    device: int
    chunks: list[int]
    layers: int
    params: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: float
    """peak held activations over the schedule (from the memory trace)"""
    transient_bytes: float
    peak_bytes: float
    peak_units: float
    """peak activations in schedule units (one full-stage microbatch activation)"""
    fits: bool | None = None

    def to_dict(self) -> dict:
        return {"device": self.device, "chunks": self.chunks, "layers": self.layers, "params": self.params,
                "params_bytes": self.params_bytes, "grads_bytes": self.grads_bytes,
                "optimizer_bytes": self.optimizer_bytes, "activations_bytes": int(round(self.activations_bytes)),
                "transient_bytes": int(round(self.transient_bytes)), "peak_bytes": int(round(self.peak_bytes)),
                "peak_units": self.peak_units, "fits": self.fits}


@dataclass(slots=True)
class MemoryReport:
    model: ModelConfig
    train: TrainConfig
    schedule_name: str
    pp: int
    vpp: int
    microbatches: int
    layers_per_chunk: list[int]
    unit_bytes: float
    mem_a: list[float]
    mem_b: list[float]
    devices: list[DeviceMemory]
    total_params: int
    gpu_bytes: int | None = None
    reserve_bytes: int = 0
    limit_units_available: float | None = None
    mem_limit_units: float | None = None
    notes: list[str] = field(default_factory=list)
    schedule: object = None
    """the :class:`~pipeloom.core.ir.Schedule` whose memory trace was used"""

    @property
    def fits(self) -> bool | None:
        if self.gpu_bytes is None:
            return None
        return all(d.fits for d in self.devices)

    def largest_limit_level(self) -> str | None:
        """Largest of the standard limits 1p/1.5p/2p whose units fit in every device's free memory."""
        if self.limit_units_available is None:
            return None
        best = None
        for lvl in (1.0, 1.5, 2.0):
            if lvl * self.pp <= self.limit_units_available + 1e-9:
                best = f"{lvl:g}p"
        return best

    def to_dict(self) -> dict:
        t = self.train
        return {
            "model": self.model.name, "total_params": int(self.total_params),
            "active_params": int(active_params(self.model)), "schedule": self.schedule_name,
            "pp": self.pp, "vpp": self.vpp, "microbatches": self.microbatches, "tp": t.tp, "dp": t.dp,
            "zero": t.zero, "sharded": sorted(sharded(t)), "dtype": t.dtype, "seq": t.seq or self.model.seq, "micro_batch": t.micro_batch,
            "recompute": t.recompute, "sequence_parallel": t.sequence_parallel, "attention": t.attention,
            "impl": t.impl, "free_stage_io": t.free_stage_io, "layers_per_chunk": self.layers_per_chunk, "unit_bytes": self.unit_bytes,
            "mem_model": {"a": self.mem_a, "b": self.mem_b}, "mem_limit_units": self.mem_limit_units,
            "gpu_memory_bytes": self.gpu_bytes, "reserve_bytes": self.reserve_bytes,
            "limit_units_available": self.limit_units_available,
            "largest_limit_level": self.largest_limit_level(), "fits": self.fits,
            "devices": [d.to_dict() for d in self.devices], "notes": self.notes,
        }




def estimate(model: ModelConfig | str, train: TrainConfig | None = None, *, schedule: str = "1f1b", pp: int,
             microbatches: int, vpp: int | None = None, layers_per_chunk: Sequence[int] | None = None,
             gpu_bytes: int | str | None = None, reserve_bytes: int | str = 0,
             mem_limit: str | float | None = None, options: dict | None = None) -> MemoryReport:
    """Per-device memory of ``model`` trained with ``train`` under schedule ``schedule``.

    ``model``: a :class:`ModelConfig`, a preset name, a shipped published config's name or a path to a
    Hugging Face ``config.json`` (:func:`pipeloom.models.hf_config.resolve_model`).

    The schedule is built by the registry with a :class:`~pipeloom.core.costs.MemModel` made from
    this estimate (so memory-aware builders plan with the model's real a/b), and its order-based
    memory trace gives the peak number of live microbatch activations per device.
    ``mem_limit``: schedule units, ``Xp``, or bytes per device (``"60GiB"``: converted with
    :func:`mem_limit_units`). ``gpu_bytes``: device memory to check the peak against.
    """
    from ..schedule.planning import make_spec, plan
    from ..schedule import registry
    from ..core.ir import Kind
    from ..core.costs import MemModel

    model = resolve_model(model)
    train = train or TrainConfig()
    if vpp is None:
        vpp = registry.default_vpp(schedule)
    if not isinstance(pp, int) or pp < 1 or not isinstance(vpp, int) or vpp < 1:
        raise MemoryConfigError(f"pp and vpp must be integers >= 1, got pp={pp!r} vpp={vpp!r}")
    nc = pp * vpp
    lpc = list(layers_per_chunk) if layers_per_chunk is not None else split_layers(model.layers, nc)
    if len(lpc) != nc:
        raise MemoryConfigError(f"layers per chunk has {len(lpc)} entries but pp*vpp = {nc} chunks")
    # the chunk placement is the builder's declaration (tests/partition/test_builder_declarations.py holds
    # every builder to it), so what a device holds is known before anything is planned
    placement = registry.get(schedule).placement_at(vpp, options)
    budget = device_budget(model, train, (pp, vpp, placement, lpc))
    U, a, b = budget.unit_bytes, list(budget.a), list(budget.b)
    notes = []
    a_model, b_model = a, [min(max(y, 0.0), x) for x, y in zip(a, b)]
    gpu = parse_size(gpu_bytes, what="gpu memory") if gpu_bytes is not None else None
    reserve = parse_size(reserve_bytes, what="reserve")
    lim = MemLimit.parse(mem_limit)
    limit_units = limit_of(lim, pp, budget, reserve_bytes=reserve)
    if lim.is_bytes:
        notes.append(f"--mem-limit {lim} = {limit_units:.3g} units ({limit_units / pp:.3g}p)")
    if limit_units is not None:  # planned so that the limit holds in the real model (B's allocation on F)
        a_model, b_model = plan_mem_model(a, b, digits=9)
    spec = make_spec(pp=pp, microbatches=microbatches, vpp=vpp, mem=MemModel(a=tuple(a_model), b=tuple(b_model)),
                     mem_limit=limit_units, options=options)
    sched = plan(schedule, spec, check=False)
    peaks, _ = activation_trace(sched, a, b)
    if limit_units is not None and max(peaks) > limit_units + 1e-9:
        notes.append(f"schedule {sched.name!r} peaks at {max(peaks):.3g} units, above the limit of "
                     f"{limit_units:.3g} units (only memory-aware schedules honour --mem-limit)")
    if any(y < 0 for y in b) and any(j.kind is Kind.B for seq in sched.devices for j in seq):
        notes.append("B allocates more than it frees for this config (W needs the GEMM inputs and output grads: "
                     "H > A, e.g. with full recompute or sequence parallel); the schedule was planned with "
                     + ("B's allocation charged to F (a - b, b = 0) to keep the limit" if limit_units is not None
                        else "b = 0") + ", the peak is traced with the real b")
    devices = []
    for d in range(pp):
        mine = budget.chunks[d]
        pb, gb, ob = budget.static[d]
        act = peaks[d] * U
        has_b = any(j.kind is Kind.B for j in sched.devices[d])
        tr = budget.transient_bytes(d, split=has_b)
        peak = pb + gb + ob + act + tr
        devices.append(DeviceMemory(d, [c.chunk for c in mine], sum(c.layers for c in mine), budget.params[d],
                                    pb, gb, ob, act, tr, peak, peaks[d],
                                    None if gpu is None else peak + reserve <= gpu))
    rep = MemoryReport(model=model, train=train, schedule_name=sched.name, pp=pp, vpp=vpp,
                       microbatches=microbatches, layers_per_chunk=lpc, unit_bytes=U, mem_a=a, mem_b=b,
                       devices=devices, total_params=total_params(model), gpu_bytes=gpu, reserve_bytes=reserve,
                       mem_limit_units=limit_units, notes=notes, schedule=sched)
    if gpu is not None:
        rep.limit_units_available = budget.limit_units(gpu, reserve)
    return rep

