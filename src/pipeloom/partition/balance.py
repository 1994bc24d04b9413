"""Cost-balanced partitions (no torch).

Two objectives, both over partitions into contiguous chunks of >= 1 layer each:

``bottleneck``
    minimise the largest per-microbatch time of a chunk, ``max_k (F_k + B_k + W_k)`` (embedding in
    chunk 0, head in the last). Solved exactly by dynamic programming over (chunk, layer)::

        T[0][j] = P[j] + emb                                   P = prefix sums of layer time
        T[k][j] = min_{k <= i < j} max(T[k-1][i], P[j] - P[i] + head*[k = nc-1])
        answer  = T[nc-1][L]

    T[k-1][.] is non-decreasing and the last chunk's time non-increasing in i, so each row is found by
    binary search for all j at once: O(nc * L log L) (a row whose predecessor is not monotone, e.g.
    with negative costs, falls back to the O(L^2) scan). With vpp > 1 a device runs several chunks, so the DP
    optimum is then polished by the local search below on (max device load, max chunk).

``makespan``
    minimise the simulated makespan of a chosen schedule (builder from the registry, planned for
    the partition's per-chunk costs, then timed by :func:`pipeloom.sim.simulate.simulate`).
    Local search: start from the DP optimum and from the uniform split, repeatedly move one
    chunk boundary by one layer in the direction that most lowers (makespan, max device load,
    sum of squared device loads), stop when no move helps or ``max_evals`` plans were timed.
    This is a heuristic: it returns a local optimum, never worse than both starts.

A per-device memory budget (``mem_limit``, units of one full-stage microbatch activation as in
``--mem-limit``; 1p = pp) is checked against the planned schedule's simulated peak memory: a
partition whose peak exceeds it is infeasible; the search first minimises the overflow, then the
objective. Memory-aware builders get the budget as their own limit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..schedule import registry
from ..core.ir import Placement
from ..schedule.registry import PlanSpec
from ..core.errors import ScheduleError
from ..core.errors import DeadlockError
from ..core import progress as _progress
from ..sim.simulate import simulate
from .layer_costs import LayerCosts
from .layout import Partition, PartitionError, from_counts, uniform

OBJECTIVES = ("bottleneck", "makespan")


def placement_of(schedule: str, vpp: int, options: dict | None = None) -> Placement:
    """The placement builder ``schedule`` uses at ``vpp``, from its registry declaration (no schedule is built).

    ``options`` are the builder options (e.g. ``optimal``'s ``placement``); they can change it.
    """
    info = registry.get(schedule)
    registry.check_vpp(info, vpp)
    registry.check_options(info, dict(options or {}))
    try:
        return info.placement_at(vpp, options)
    except ValueError as e:  # e.g. an option value that names no placement
        raise PartitionError(f"cannot tell which placement schedule {schedule!r} uses at vpp={vpp}: {e}") from None


def bottleneck_dp(costs: LayerCosts, pp: int, vpp: int = 1, placement: Placement | str = Placement.INTERLEAVED,
                  *, embedding: bool = True, head: bool = True) -> Partition:
    """Exact minimum of the largest chunk time (F+B+W) over contiguous partitions (see module doc)."""
    nc = pp * vpp
    L = costs.num_layers
    if L < nc:
        raise PartitionError(f"{L} layers cannot fill pp*vpp = {nc} chunks; use more layers or fewer chunks")
    t = np.array([x.total for x in costs.layers], dtype=float)
    P = np.concatenate([[0.0], np.cumsum(t)])
    emb = costs.embedding.total if embedding else 0.0
    hd = costs.head.total if head else 0.0
    INF = math.inf
    T = np.full((nc, L + 1), INF)
    arg = np.zeros((nc, L + 1), dtype=int)
    T[0, 1:] = P[1:] + emb + (hd if nc == 1 else 0.0)
    p_monotone = bool(np.all(np.diff(P) >= 0))
    for k in range(1, nc):
        extra = hd if k == nc - 1 else 0.0
        # chunk k ends at layer j; the chunks after it need nc-1-k more layers
        jhi = L - (nc - 1 - k)
        prev = T[k - 1, k:jhi]  # the i the row reads: k <= i < j <= jhi
        if p_monotone and bool(np.all(np.diff(prev) >= 0)):
            _dp_row_monotone(T, arg, P, k, jhi, extra)
        else:
            _dp_row_scan(T, arg, P, k, jhi, extra, L)
        if _progress.active():
            _progress.report(f"balancing: exact DP, chunk boundary {k}/{nc - 1} of {L:,} layers")
    counts, j = [], L
    for k in range(nc - 1, 0, -1):
        i = int(arg[k, j])
        counts.append(j - i)
        j = i
    counts.append(j)
    counts.reverse()
    return from_counts(counts, pp, vpp, placement, embedding=embedding, head=head)


def _dp_row_scan(T, arg, P, k: int, jhi: int, extra: float, L: int) -> None:
    """Row k of the DP by scanning every split i (O(L^2)); used only when row k-1 is not monotone."""
    for j in range(k + 1, jhi + 1):
        if j % 2048 == 0 and _progress.active():
            _progress.report(f"balancing: exact DP, chunk boundary {k}, {100 * j / L:.0f}% of {L:,} layers")
        i = np.arange(k, j)
        vals = np.maximum(T[k - 1, i], P[j] - P[i] + extra)
        best = int(np.argmin(vals))
        T[k, j] = vals[best]
        arg[k, j] = i[best]


def _first_true(pred, lo, hi):
    """Per element, the least i in [lo, hi) with ``pred(i, mask)`` true (``hi`` when none); pred must be
    monotone in i (false ... false true ... true). Vectorised binary search over all elements."""
    lo, hi = lo.copy(), hi.copy()
    while True:
        act = lo < hi
        if not act.any():
            return lo
        mid = (lo + hi) // 2
        ok = pred(np.where(act, mid, lo)) & act
        hi = np.where(ok, mid, hi)
        lo = np.where(act & ~ok, mid + 1, lo)


def _dp_row_monotone(T, arg, P, k: int, jhi: int, extra: float) -> None:
    """Row k of the DP in O(L log L), the same values and the same (first) argmin as the scan.

    For a fixed end j, f(i) = T[k-1][i] is non-decreasing and g(i) = P[j] - P[i] + extra non-increasing
    in i (checked by the caller, and exact in floating point: rounding is monotone). So max(f, g) is
    g (non-increasing) before the first i* with f(i*) >= g(i*) and f (non-decreasing) from there: its
    minimum is min(g(i*-1), f(i*)), and the first index reaching it is i* or the first i with
    g(i) <= g(i*-1). Both are found by binary search, for all j at once."""
    J = np.arange(k + 1, jhi + 1)
    if J.size == 0:
        return
    f = T[k - 1]
    PJ = P[J]
    lo = np.full(J.size, k)
    istar = _first_true(lambda i: f[i] >= PJ - P[i] + extra, lo, J)
    has_f = istar < J
    has_g = istar > k
    i_f = np.minimum(istar, J - 1)
    val_f = np.where(has_f, np.maximum(f[i_f], PJ - P[i_f] + extra), np.inf)
    i_g = np.maximum(istar - 1, k)
    gm = np.where(has_g, PJ - P[i_g] + extra, np.inf)
    # the first i whose g already equals g(i*-1) (g is flat over zero-cost layers)
    first_g = _first_true(lambda i: PJ - P[i] + extra <= gm, lo, np.where(has_g, istar, lo))
    use_g = has_g & (gm <= val_f)
    best = np.where(use_g, first_g, istar)
    T[k, J] = np.where(use_g, gm, val_f)
    arg[k, J] = best


@dataclass(slots=True)
class Evaluation:
    """What one partition costs under the objective."""

    partition: Partition
    chunk_time: list[float]
    device_load: list[float]
    makespan: float | None = None
    bubble: float | None = None
    peak_memory: list[float] | None = None
    overflow: float = 0.0
    error: str | None = None

    def to_dict(self) -> dict:
        return {"seg_layer_num": self.partition.seg_layer_num, "chunk_time": self.chunk_time,
                "device_load": self.device_load, "max_chunk_time": max(self.chunk_time),
                "max_device_load": max(self.device_load), "makespan": self.makespan, "bubble": self.bubble,
                "peak_memory": self.peak_memory, "memory_overflow": self.overflow, "error": self.error}


@dataclass(slots=True)
class Evaluator:
    """Plans and times partitions for one (schedule, microbatches, comm, memory budget); caches by counts."""

    costs: LayerCosts
    pp: int
    vpp: int
    placement: Placement
    schedule: str | None = None
    microbatches: int | None = None
    comm: float = 0.0
    overlap: float = 0.0
    mem_limit: float | None = None
    embedding: bool = True
    head: bool = True
    options: dict = field(default_factory=dict)
    """builder options passed through PlanSpec.options"""
    evals: int = 0
    _cache: dict = field(default_factory=dict)

    def spec(self, part: Partition, cc: dict | None = None) -> PlanSpec:
        memory_aware = registry.get(self.schedule).memory_aware if self.schedule else False
        cc = cc if cc is not None else self.costs.chunk_costs(part)  # summed once: O(layers) in Python
        return PlanSpec(pp=self.pp, vpp=self.vpp, microbatches=self.microbatches,
                        costs=self.costs.costs(part, comm=self.comm, overlap=self.overlap, chunk_costs=cc),
                        mem=self.costs.mem_model(part, chunk_costs=cc), mem_limit=self.mem_limit if memory_aware else None,
                        options=dict(self.options))

    def __call__(self, counts: tuple[int, ...]) -> Evaluation:
        hit = self._cache.get(counts)
        if hit is not None:
            return hit
        part = from_counts(counts, self.pp, self.vpp, self.placement, embedding=self.embedding, head=self.head)
        cc = self.costs.chunk_costs(part)
        load = [sum(cc["total"][c] for c in part.chunks_of(d)) for d in range(self.pp)]
        ev = Evaluation(part, cc["total"], load)
        if self.schedule is not None:
            self.evals += 1
            try:
                spec = self.spec(part, cc)
                sched = registry.build(self.schedule, spec)
                if [sched.device_of(c) for c in range(part.num_chunks)] != \
                        [part.device_of(c) for c in range(part.num_chunks)]:
                    raise PartitionError(f"schedule {self.schedule!r} uses {sched.placement.value} placement but the "
                                         f"partition was made for {self.placement.value}")
                r = simulate(sched, spec.costs, spec.mem)
                ev.makespan, ev.bubble, ev.peak_memory = r.makespan, r.bubble, r.peak_memory
                if self.mem_limit is not None:
                    ev.overflow = max(0.0, max(r.peak_memory) - self.mem_limit)
            except PartitionError:
                raise
            except (ScheduleError, DeadlockError, ValueError) as e:
                ev.error = str(e).splitlines()[0]
                ev.overflow = math.inf
        self._cache[counts] = ev
        return ev


def _score(ev: Evaluation, objective: str) -> tuple:
    sumsq = sum(x * x for x in ev.device_load)
    if objective == "makespan":
        return (ev.overflow, round(ev.makespan if ev.makespan is not None else math.inf, 9),
                round(max(ev.device_load), 9), round(sumsq, 6))
    return (ev.overflow, round(max(ev.device_load), 9), round(max(ev.chunk_time), 9), round(sumsq, 6))


@dataclass(slots=True)
class BalanceResult:
    partition: Partition
    best: Evaluation
    uniform: Evaluation
    dp: Evaluation
    objective: str
    evals: int
    moves: int

    def to_dict(self) -> dict:
        return {"objective": self.objective, "evals": self.evals, "moves": self.moves,
                "best": self.best.to_dict(), "uniform": self.uniform.to_dict(), "dp": self.dp.to_dict()}


def local_search(ev: Evaluator, start: tuple[int, ...], objective: str, max_evals: int,
                 progress: Callable[[int], None] | None = None) -> tuple[tuple[int, ...], int]:
    """Steepest descent over "move one chunk boundary by one layer" (see module doc)."""
    cur = tuple(start)
    cur_s = _score(ev(cur), objective)
    moves = 0
    nc = len(cur)
    while ev.evals < max_evals:
        best, best_s = None, cur_s
        for k in range(nc - 1):
            for delta in (1, -1):  # +1: chunk k takes the first layer of chunk k+1
                a, b = cur[k] + delta, cur[k + 1] - delta
                if a < 1 or b < 1:
                    continue
                cand = cur[:k] + (a, b) + cur[k + 2:]
                s = _score(ev(cand), objective)
                if s < best_s:
                    best, best_s = cand, s
                if ev.evals >= max_evals:
                    break
        if progress:
            progress(ev.evals)
        if best is None:
            break
        cur, cur_s = best, best_s
        moves += 1
    return cur, moves


def balance(costs: LayerCosts, pp: int, vpp: int = 1, placement: Placement | str = Placement.INTERLEAVED, *,
            objective: str = "bottleneck", schedule: str | None = None, microbatches: int | None = None,
            comm: float = 0.0, overlap: float = 0.0, mem_limit: float | None = None, embedding: bool = True,
            head: bool = True, max_evals: int = 400, options: dict | None = None,
            progress: Callable[[int], None] | None = None) -> BalanceResult:
    """Cost-balanced partition of ``costs.layers`` onto pp devices x vpp chunks (see module doc).

    ``schedule``/``microbatches`` are needed for ``objective="makespan"`` and for a ``mem_limit``;
    with them the result also carries the simulated makespan of the uniform, DP and best partitions.
    """
    if objective not in OBJECTIVES:
        raise PartitionError(f"balance objective {objective!r} unknown; use one of: {', '.join(OBJECTIVES)}")
    placement = Placement(placement)
    if (objective == "makespan" or mem_limit is not None) and (schedule is None or microbatches is None):
        raise PartitionError("balancing for makespan or under a memory budget needs a schedule and a microbatch "
                             "count (--schedule, --microbatches)")
    if schedule is not None:
        placement = placement_of(schedule, vpp, options)
    dp = bottleneck_dp(costs, pp, vpp, placement, embedding=embedding, head=head)
    uni = uniform(costs.num_layers, pp, vpp, placement, embedding=embedding, head=head)
    timed = objective == "makespan" or mem_limit is not None
    args = (costs, pp, vpp, placement)
    kw = dict(microbatches=microbatches, comm=comm, overlap=overlap, mem_limit=mem_limit, embedding=embedding,
              head=head, options=dict(options or {}))
    search = Evaluator(*args, schedule if timed else None, **kw)
    report = search if timed or schedule is None else Evaluator(*args, schedule, **kw)
    starts = [tuple(dp.seg_layer_num), tuple(uni.seg_layer_num)]
    results, total_moves = [], 0
    for s in starts:
        if timed or vpp > 1:
            s, moves = local_search(search, s, objective, max_evals, progress)
            total_moves += moves
        results.append(s)
    best = min(results, key=lambda c: _score(search(c), objective))
    return BalanceResult(report(best).partition, report(best), report(tuple(uni.seg_layer_num)),
                         report(tuple(dp.seg_layer_num)), objective, search.evals, total_moves)
