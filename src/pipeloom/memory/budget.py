"""What one device of a pipeline holds besides the schedule's activations, in one call (no torch).

:func:`device_budget` answers, for a model, its training and a layout (pp, vpp, placement, layers of
every chunk), what each device holds

* **statically**: parameters, gradients and optimizer states of its chunks, sharded over dp per the ZeRO level
  (:func:`~.sharding.static_bytes`);
* **transiently**: the working set of one job on top of the held activations (:func:`~.layers.transient_bytes`),
  plus with ZeRO-2/3 one chunk's unsharded gradients and gathered parameters (:func:`~.sharding.shard_transient_bytes`);
* **per activation unit**: ``U = sum_c A_c / pp`` bytes (one full-stage microbatch activation) and the
  schedule's memory model in units, ``a_c = A_c / U`` (what F allocates) and ``b_c = (A_c - H_c) / U``
  (what B frees).

``pipeloom memory`` (:func:`pipeloom.memory.analytic.estimate`), ``pipeloom tune`` and the command line's
``--mem-limit 80GiB`` read these numbers from it and nowhere else: the room a device leaves for held
activations is ``(gpu - reserve - static_d - transient_d) / U`` units, its tightest device is the memory limit
a size in bytes stands for (:meth:`DeviceBudget.limit_units`), and a device's peak in bytes is
``static_d + transient_d + peak_units_d * U`` (:meth:`DeviceBudget.peak_bytes`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..core.costs import MemLimit, MemModel
from ..core.ir import Placement, device_of
from ..models.config import ModelConfig
from ..models.hf_config import resolve_model
from .layers import (ChunkMemory, MemoryConfigError, TrainConfig, chunk_memory, split_layers, static_bytes,
                     transient_bytes)
from .sharding import shard_transient_bytes


def device_params(model: ModelConfig, train: TrainConfig, mine: Sequence[ChunkMemory]) -> int:
    """Parameters of a device holding the chunks ``mine`` (a tied head next to its embedding counted once)."""
    params = sum(c.params for c in mine)
    if model.tied_embeddings and any(c.first for c in mine) and any(c.last and not c.first for c in mine):
        params -= model.vocab * model.hidden // train.tp  # tied head on the embedding's device: one copy
    return params


def _static(params: int, train: TrainConfig, mine: Sequence[ChunkMemory]) -> tuple[int, int, int]:
    """(params, grads, optimizer) bytes of a device: dense parameters sharded over dp * cp with ZeRO, routed
    experts over dp * cp / ep (:func:`pipeloom.memory.moe.split_static`)."""
    if train.ep == 1 and train.cp == 1 and not train.fp8:
        return static_bytes(params, train)
    import dataclasses

    from .moe import split_static

    dense = dataclasses.replace(train, dp=train.dp * train.cp)
    return split_static(static_bytes, params, sum(c.expert_params for c in mine), dense,
                        train.dp * train.cp // train.ep)


def mem_model_for(chunks: Sequence[ChunkMemory], pp: int) -> tuple[float, list[float], list[float]]:
    """(unit bytes U, a per chunk, b per chunk) in schedule units; b may be < 0 (B allocates)."""
    U = sum(c.activation_bytes for c in chunks) / pp
    a = [c.activation_bytes / U for c in chunks]
    b = [(c.activation_bytes - c.w_held_bytes) / U for c in chunks]
    return U, a, b


def activation_trace(schedule, a: Sequence[float], b: Sequence[float]) -> tuple[list[float], list[list[float]]]:
    """Per-device peak and running memory in units: the simulator's trace
    (:func:`pipeloom.sim.simulate.memory_profile`) when ``0 <= b <= a``; otherwise the same walk with
    ``b`` outside that range (B allocating more than it frees, e.g. full recompute + B/W split)."""
    from ..core.rules import peak_memory
    from ..sim.simulate import memory_profile

    if all(0.0 <= y <= x + 1e-12 for x, y in zip(a, b)):
        return memory_profile(schedule, MemModel(a=tuple(a), b=tuple(b)))
    walks = [peak_memory(seq, a, b) for seq in schedule.devices]  # the rules' deltas, any sign of b
    return [p for p, _ in walks], [t for _, t in walks]


def plan_mem_model(a: Sequence[float], b: Sequence[float], *, split: bool = True,
                   digits: int = 3) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The memory model (``a``, ``b`` in units, to ``digits`` decimals) a schedule is planned with so that
    a plan within a limit in it is within that limit in the exact model (``a``, ``b``) too.

    Builders account ``F: +a``, ``B: -b``, ``W: -(a - b)`` with ``0 <= b <= a``. Where ``b < 0`` (B allocates:
    the weight-gradient inputs W keeps outweigh what B releases, or full recompute) and the builder splits B
    from W (``split``), the extra ``-b`` is charged to F: ``a' = a - b``, ``b' = 0`` (then W frees ``a - b``
    as in the exact model); at every point of any job order the planned memory is then >= the exact one.
    ``a`` is rounded up and ``b`` down, which keeps that order. A fused BW never holds B's extra: ``b`` only
    matters between B and W, so a builder that never splits plans with ``a`` (rounded up) alone.
    (Clamping ``b < 0`` to 0 instead under-counted every B of such chunks: Llama 3 405B with zbvpp planned
    13.25 units under a 13.25-unit limit and peaked at 15.1, 78.2 GiB where 72.5 GiB was usable.)"""
    q = 10 ** digits
    up = [math.ceil(x * q) / q for x in a]
    if not split:
        return tuple(up), tuple(min(max(math.floor(y * q) / q, 0.0), x) for x, y in zip(up, b))
    a_r = tuple(math.ceil((x - min(y, 0.0)) * q) / q for x, y in zip(a, b))
    b_r = tuple(min(max(math.floor(y * q) / q, 0.0), x) for x, y in zip(a_r, b))
    return a_r, b_r


@dataclass(frozen=True, slots=True)
class DeviceBudget:
    """What every device of one layout holds, in bytes (see the module docstring). Per device ``d``:
    ``chunks[d]`` its chunks, ``params[d]``, ``static[d]`` = (params, grads, optimizer) bytes,
    ``transient[d]`` with a B/W split and ``transient_fused[d]`` without one."""

    pp: int
    vpp: int
    placement: Placement
    chunk_memory: tuple[ChunkMemory, ...]
    """every global chunk's memory accounting"""
    chunks: tuple[tuple[ChunkMemory, ...], ...]
    params: tuple[int, ...]
    static: tuple[tuple[int, int, int], ...]
    transient: tuple[float, ...]
    transient_fused: tuple[float, ...]
    unit_bytes: float
    """U: one full-stage microbatch activation"""
    a: tuple[float, ...]
    """what F allocates, per chunk, in units"""
    b: tuple[float, ...]
    """what B frees, per chunk, in units (< 0 where B allocates more than it frees)"""

    def static_bytes(self, d: int) -> int:
        """Parameters + gradients + optimizer states of device ``d``."""
        return sum(self.static[d])

    def transient_bytes(self, d: int, *, split: bool = True) -> float:
        return self.transient[d] if split else self.transient_fused[d]

    def room_units(self, gpu_bytes: int, reserve_bytes: int = 0) -> list[float]:
        """Per device: the units left for held activations on a device of ``gpu_bytes`` with ``reserve_bytes``
        kept aside (with a B/W split's transient, the larger one)."""
        U = self.unit_bytes
        return [(gpu_bytes - reserve_bytes - sum(st) - tr) / U for st, tr in zip(self.static, self.transient)]

    def limit_units(self, gpu_bytes: int, reserve_bytes: int = 0) -> float:
        """The memory limit in units that ``gpu_bytes`` per device stands for: the tightest device's room."""
        avail = math.inf
        for free in self.room_units(gpu_bytes, reserve_bytes):
            avail = min(avail, free)
        return avail

    def floor_units(self) -> float:
        """The smallest limit any schedule meets (:func:`pipeloom.schedule.registry.min_feasible_limit`):
        one microbatch's activations on all chunks of a device."""
        return max(sum(self.a[c.chunk] for c in mine) for mine in self.chunks)

    def lower_bound_bytes(self) -> float:
        """Bytes every schedule needs on its fullest device: statics, the transient working set and one
        microbatch's activations on each of its chunks (all held when that microbatch turns around)."""
        return max(sum(st) + tr + sum(ch.activation_bytes for ch in mine)
                   for mine, st, tr in zip(self.chunks, self.static, self.transient))

    def peak_bytes(self, peak_units: Sequence[float], *, split: Sequence[bool] | bool = True) -> list[float]:
        """Per device: statics + transient + the schedule's peak held activations (``peak_units[d] * U``)."""
        sp = [split] * self.pp if isinstance(split, bool) else list(split)
        return [sum(st) + (tr if s else tf) + pk * self.unit_bytes
                for st, tr, tf, pk, s in zip(self.static, self.transient, self.transient_fused, peak_units, sp)]


def device_budget(model: ModelConfig, training: TrainConfig, layout: tuple[int, int, Placement | str,
                  Sequence[int]] | None = None, *, pp: int | None = None, vpp: int = 1,
                  placement: Placement | str = Placement.INTERLEAVED,
                  layers_per_chunk: Sequence[int] | None = None,
                  chunks: Sequence[ChunkMemory] | None = None) -> DeviceBudget:
    """:class:`DeviceBudget` of ``model`` trained with ``training`` on ``layout`` = (pp, vpp, placement,
    layers per global chunk) (or the keywords; layers default to an even split, ``chunks`` to
    :func:`~.layers.chunk_memory` of them)."""
    if layout is not None:
        pp, vpp, placement, layers_per_chunk = layout
    if pp is None:
        raise MemoryConfigError("device_budget needs pp (the layout's pipeline degree)")
    placement = Placement(placement)
    if chunks is None:
        lpc = list(layers_per_chunk) if layers_per_chunk is not None else split_layers(model.layers, pp * vpp)
        chunks = chunk_memory(model, training, lpc)
    chunks = tuple(chunks)
    mine_of: list[list[ChunkMemory]] = [[] for _ in range(pp)]
    for c in chunks:  # ascending chunk order on every device
        mine_of[device_of(c.chunk, pp, placement)].append(c)
    params, static, tr, tf = [], [], [], []
    for mine in mine_of:
        p = device_params(model, training, mine)
        params.append(p)
        static.append(_static(p, training, mine))
        # sharded data parallel (ZeRO-2/3): the largest chunk's unsharded gradients / gathered parameters
        shard = shard_transient_bytes(training, max((c.params for c in mine), default=0))
        tr.append(transient_bytes(model, training, mine, split=True) + shard)
        tf.append(transient_bytes(model, training, mine, split=False) + shard)
    U, a, b = mem_model_for(chunks, pp)
    return DeviceBudget(pp, vpp, placement, chunks, tuple(tuple(m) for m in mine_of), tuple(params), tuple(static),
                        tuple(tr), tuple(tf), U, tuple(a), tuple(b))


def limit_units(limit: MemLimit | str | float | None, pp: int, budget: DeviceBudget | None = None, *,
                reserve_bytes: int = 0, what: str = "--mem-limit") -> float | None:
    """A :class:`~pipeloom.core.costs.MemLimit` in units for ``pp`` devices (None: no limit); a size in bytes
    through ``budget`` (the tightest device's room, :meth:`DeviceBudget.limit_units`), refused when it leaves
    no room for activations."""
    lim = MemLimit.parse(limit, what=what)
    if not lim.is_bytes:
        return lim.units(pp)
    if budget is None:
        return lim.units(pp)  # raises: bytes need a model
    units = budget.limit_units(int(lim.value), reserve_bytes)
    if units <= 0:
        raise MemoryConfigError(f"memory limit {lim.text} per device leaves no room for activations: "
                                f"parameters, gradients and optimizer states alone need more")
    return units


def mem_limit_units(model: ModelConfig | str, train: TrainConfig | None = None, *, pp: int, vpp: int = 1,
                    gpu_bytes: int | str, placement: str = "interleaved", reserve_bytes: int | str = 0,
                    layers_per_chunk: Sequence[int] | None = None) -> float:
    """A per-device memory size in bytes -> the schedulers' memory limit in units.

    ``units = min_d (gpu - reserve - static_d - transient_d) / U``: what is left for held
    activations on the tightest device, in full-stage microbatch activations ``U``
    (:meth:`DeviceBudget.limit_units`). Pass the result as ``PlanSpec.mem_limit`` (or ``--mem-limit``);
    1p = pp units.
    """
    from ..core.costs import parse_size

    model = resolve_model(model)
    train = train or TrainConfig()
    budget = device_budget(model, train, (pp, vpp, placement, layers_per_chunk or split_layers(model.layers,
                                                                                               pp * vpp)))
    return budget.limit_units(parse_size(gpu_bytes, what="gpu memory"), parse_size(reserve_bytes, what="reserve"))
