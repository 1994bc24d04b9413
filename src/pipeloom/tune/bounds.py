"""Every lower bound of a tuner configuration, in one place (no torch).

The search (:mod:`.search`) simulates configurations in increasing order of a lower bound and stops when
the bound passes the ``top``-th best step time found, so the tighter the bound, the fewer schedules are
built. Three bounds, each holding for every schedule of the configuration **that fits the GPU** (the others
cannot enter the ranking anyway):

* :func:`memory_lower_bound` (bytes): statics + transient + one microbatch's activations on each of the
  fullest device's chunks (:meth:`pipeloom.memory.budget.DeviceBudget.lower_bound_bytes`; the same fact as the
  feasibility floor :func:`pipeloom.schedule.registry.min_feasible_limit`);
* :func:`lower_bound` (seconds, cheap): per device the forward chain before its first chunk plus its busy time
  ``m sum(F+B+W)``; the last microbatch's ``(m-1) F_0`` plus one forward and backward chain; plus the optimizer;
* :func:`memory_bound` = :func:`step_bound` (seconds): the terms of :mod:`pipeloom.schedule.search.bounds`
  -- critical path, device busy time, warm-up under the memory limit, last forward under the memory limit
  (the proofs are there, on the integer job graph for one limit) -- here in seconds, in closed form in
  O(nc), with one limit per device: ``L_d`` = the room for activations on d, (GPU - reserve - static_d -
  transient_d) / unit (or, for the builders of :data:`BOUNDED`, the limit they plan under,
  :func:`pipeloom.schedule.registry.effective_limit`), the knapsacks replaced by their LP relaxations
  (:func:`max_forward_work` an upper bound, :func:`min_free_work` a lower bound, so the terms stay bounds);
  plus what the tuner adds: each term ends with a W of some chunk, whose DP bucket then runs (the least
  bucket of the device, or of all for the last-forward term), then the optimizer step.

Notation: chunk ``k`` of ``nc``, per-chunk seconds ``F, B, W``, ``comm`` on every cross-device edge, ``m``
microbatches, ``a_k``/``b_k`` what F allocates / B frees (units; b may be < 0), ``hF_k``/``hB_k`` the earliest
start of an F / a B on chunk k from microbatch 0's chain, ``tailF_k`` the longest path from an F on k to the end.
"""
from __future__ import annotations

import math
from typing import Sequence

from ..core.costs import MemModel
from ..core.errors import ScheduleError
from ..schedule import registry
from ..schedule.registry import PlanSpec
from .costs import backward_fused, chunk_costs, comm_p2p, dp_tail, optimizer_time


def chains(F: Sequence[float], B: Sequence[float], W: Sequence[float], comm: float, cross: Sequence[bool]):
    """Microbatch 0's earliest starts ``hF``, ``hB`` per chunk and ``tailF`` (longest path from an F's
    start to the end); ``cross[k]``: the edge between chunks k-1 and k runs between devices."""
    nc = len(F)
    hF = [0.0] * nc
    for k in range(1, nc):
        hF[k] = hF[k - 1] + F[k - 1] + (comm if cross[k] else 0.0)
    hB = [0.0] * nc
    hB[nc - 1] = hF[nc - 1] + F[nc - 1]
    for k in range(nc - 2, -1, -1):
        hB[k] = hB[k + 1] + B[k + 1] + (comm if cross[k + 1] else 0.0)
    # tails: B on k, then (B on k-1 ... or its own W); F on k climbs to the top, then the B chain
    tB = [0.0] * nc
    for k in range(nc):
        down = (tB[k - 1] + (comm if cross[k] else 0.0)) if k > 0 else 0.0
        tB[k] = B[k] + max(W[k], down)
    tF = [0.0] * nc
    tF[nc - 1] = F[nc - 1] + tB[nc - 1]
    for k in range(nc - 2, -1, -1):
        tF[k] = F[k] + tF[k + 1] + (comm if cross[k + 1] else 0.0)
    return hF, hB, tF


def max_forward_work(F: Sequence[float], a: Sequence[float], chunks: Sequence[int], m: int, room: float) -> float:
    """An upper bound of the forward work of at most ``m`` forwards per chunk whose ``a`` sum to at most
    ``room`` (LP relaxation of the knapsack: most work per unit of memory first)."""
    work, left = 0.0, room
    free = [c for c in chunks if a[c] <= 0]
    work += m * sum(F[c] for c in free)
    for c in sorted((c for c in chunks if a[c] > 0), key=lambda c: -F[c] / a[c]):
        if left <= 0:
            break
        take = min(float(m), left / a[c])
        work += take * F[c]
        left -= take * a[c]
    return work


def min_free_work(B: Sequence[float], W: Sequence[float], a: Sequence[float], b: Sequence[float],
                  chunks: Sequence[int], m: int, need: float) -> float:
    """A lower bound of the B/W work that frees at least ``need`` units (per microbatch and chunk:
    nothing, B alone freeing ``b``, or B and W freeing ``a``): the LP relaxation, the cheapest
    increments of the convex hull of (0, 0), (b, B), (a, B + W) first. ``inf`` if even every B and W
    cannot free ``need``."""
    if need <= 0:
        return 0.0
    incs = []  # (seconds per unit freed, units freed per microbatch)
    for c in chunks:
        fa, fb, cb, cw = a[c], b[c], B[c], B[c] + W[c]
        if 0 < fb < fa:
            if cb / fb <= cw / fa:
                incs.append((cb / fb, fb))
                incs.append(((cw - cb) / (fa - fb), fa - fb))
            else:
                incs.append((cw / fa, fa))
        elif fa > 0 or fb > 0:
            # b <= 0 (B allocates: B alone never helps) or b >= a: up to the larger release at the
            # cheaper rate of the two options, a relaxation of them
            rates = [x / y for x, y in ((cb, fb), (cw, fa)) if y > 0]
            incs.append((min(rates), max(fa, fb)))
    cost, left = 0.0, need
    for rate, fr in sorted(incs):
        take = min(left, m * fr)
        cost += take * rate
        left -= take
        if left <= 1e-12 * need:
            return cost
    return math.inf


def step_bound(F: Sequence[float], B: Sequence[float], W: Sequence[float], comm: float, cross: Sequence[bool],
               owned: Sequence[Sequence[int]], m: int, a: Sequence[float], b: Sequence[float],
               room: Sequence[float] | None, dp_bucket: Sequence[float], optimizer: float) -> float:
    """Seconds no fitting schedule's step beats (module docstring). ``owned[d]``: d's chunks in
    increasing order; ``room[d]``: activation units d may peak at (None: no memory terms);
    ``dp_bucket[k]``: seconds of chunk k's DP reduction; ``optimizer``: the optimizer step."""
    nc = len(F)
    hF, hB, tF = chains(F, B, W, comm, cross)
    best = (m - 1) * F[0] + hB[0] + B[0] + W[0] + dp_bucket[0]
    min_bucket = min(dp_bucket)
    for d, mine in enumerate(owned):
        if not mine:
            continue
        ftot = m * sum(F[k] for k in mine)
        bwtot = m * sum(B[k] + W[k] for k in mine)
        h_f = min(hF[k] for k in mine)
        dev = h_f + ftot + bwtot
        if room is not None:
            L = room[d]
            h_b = min(hB[k] for k in mine)
            fpre = min(max_forward_work(F, a, mine, m, max(L, 0.0)), max(0.0, h_b - h_f))
            dev = max(dev, h_b + bwtot + ftot - fpre)
            top = mine[-1]
            need = m * sum(a[k] for k in mine) - L
            if need > 0:
                wfree = min_free_work(B, W, a, b, mine, m, need)
                # this path ends with a W of any chunk, whose bucket follows
                best = max(best, h_b + wfree + max(0.0, ftot - F[top] - fpre) + tF[top] + min_bucket)
        best = max(best, dev + min(dp_bucket[k] for k in mine))
    return best + optimizer


__all__ = ["chains", "max_forward_work", "min_free_work", "step_bound"]

# ------------------------------------------------------------------------------------------ bounds of a configuration
def memory_lower_bound(space, c) -> float:
    """Bytes every schedule of ``c`` needs on its fullest device: parameters, gradients, optimizer states,
    the transient working set, and microbatch 0's activations on each of the device's chunks (all held
    when that microbatch's backward starts at the last chunk): :meth:`~pipeloom.memory.budget.DeviceBudget.lower_bound_bytes`."""
    return space.summary(c)[2]


def _shape(space, c):
    """Per (costs, partition, placement): prefix sums of F and of the device crossings, each device's
    first chunk and work per microbatch sum(F+B+W), sum(B), F of chunk 0 (what :func:`lower_bound` reads)."""
    from .moe_costs import PAIRED, hideable

    k = (c.tp, c.microbatch_size, c.recompute, c.seg_layer_num, c.pp, c.vpp, c.placement,
         backward_fused(c.schedule), c.ep, c.cp, c.schedule in PAIRED)
    hit = space.shapes.get(k)
    if hit is None:
        F, B, W, _ = chunk_costs(space, c)
        F, B = hideable(space, c, F, B)  # what overlapped pairs can hide is not work a bound may count
        owned, cross = space.owned(c.pp, c.vpp, c.placement)
        fp, cc = [0.0], [0]
        for x, y in zip(F, cross):
            fp.append(fp[-1] + x)
            cc.append(cc[-1] + (1 if y else 0))
        dev = [(mine[0], sum(F[j] + B[j] + W[j] for j in mine)) for mine in owned]
        hit = space.shapes[k] = (fp, cc, dev, sum(B), F[0])
    return hit


def lower_bound(space, c) -> float:
    """Seconds no schedule of ``c`` can beat (module docstring): the larger of
    * per device: the forward chain before its first chunk can start, plus its busy time;
    * the last microbatch: chunk 0 runs m-1 other forwards first, then that microbatch's forward and
      backward traverse every chunk (with the cross-device latencies);
    plus the optimizer step."""
    fp, cc, dev, sum_b, f0 = _shape(space, c)
    comm = comm_p2p(space, c)
    m = c.microbatches
    best = (m - 1) * f0 + fp[-1] + sum_b + 2 * comm * cc[-1]
    for first, work in dev:
        best = max(best, fp[first] + comm * cc[first] + m * work)
    return best + optimizer_time(space, c, space.summary(c)[1])




#: builders whose plans are expensive enough to be worth a memory-aware bound before building them
BOUNDED = ("zbvpp", "zbv", "vhalf", "vmin")


def builder_limit(space, c, a_r: tuple[float, ...], b_r: tuple[float, ...] = ()) -> float | None:
    """The memory limit (units of the rounded model the plan is built with) that the builder of ``c``
    plans under: :func:`pipeloom.schedule.registry.effective_limit` of its declaration with the limit the
    tuner gives it (None in the 'default' mode, the GPU's room in 'fit', ``--mem-limit`` in 'given'); None
    when it plans without one. A given limit below the floor is returned as it is (the builder refuses it and
    builds nothing, so any bound under it holds)."""
    info = registry.get(c.schedule)
    if not info.memory_aware:
        return None
    given = space.given_limit(c)
    if c.mem_limit_mode != "default" and given is None:
        return None
    spec = PlanSpec(pp=c.pp, vpp=c.vpp, microbatches=c.microbatches, mem=MemModel(a=a_r, b=b_r or None),
                    mem_limit=given, options={})
    try:
        return registry.effective_limit(info, spec)
    except ScheduleError:
        return given


def _rounded_mem(a, bfree, split: bool = True) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The memory model plans are built with: :func:`pipeloom.memory.budget.plan_mem_model` (3 decimals)."""
    from ..memory.budget import plan_mem_model
    return plan_mem_model(a, bfree, split=split)


def memory_bound(space, c) -> float:
    """A step-time lower bound of ``c`` (:func:`pipeloom.tune.bounds.step_bound`) with its memory terms:
    the larger of the bound under each device's room on the GPU (in the exact memory model: holds for every
    schedule of ``c`` that fits) and, for the builders of :data:`BOUNDED`, the bound under the limit the
    builder plans with (in the rounded model it plans with: holds for its plan)."""
    from .moe_costs import hideable

    F, B, W, comm = chunk_costs(space, c)
    B0 = B  # the longest a chunk's last weight-gradient job can be (the DP tail below): nothing hidden
    F, B = hideable(space, c, F, B)
    owned, cross = space.owned(c.pp, c.vpp, c.placement)
    owned = [sorted(o) for o in owned]
    budget = space.budget(c)
    a, bfree = budget.a, budget.b
    room = budget.room_units(space.p.gpu.memory, space.p.reserve)
    chm = budget.chunk_memory
    # dense parameters only: the routed experts reduce over the smaller expert-data-parallel group, so leaving them
    # out keeps the tail a lower bound (the dense group has dp x cp >= dp ranks)
    dev_params = {k: sum(chm[j].params - chm[j].expert_params for j in mine) for mine in owned for k in mine}
    # B + W: the longest the chunk's last weight-gradient job can be (a BW; a W alone is shorter), so the tail holds
    buckets = [dp_tail(space, c, ch.params - ch.expert_params, dev_params[k], B0[k] + W[k],
                       c.seg_layer_num[k] if c.seg_layer_num else 1)
               for k, ch in enumerate(budget.chunk_memory)]
    opt = max(optimizer_time(space, c, p) for p in budget.params)
    m = c.microbatches
    best = step_bound(F, B, W, comm, cross, owned, m, a, bfree, room, buckets, opt)
    if c.schedule in BOUNDED:
        a_r, b_r = _rounded_mem(a, bfree, not backward_fused(c.schedule))
        lim = builder_limit(space, c, a_r, b_r)
        if lim is not None:
            best = max(best, step_bound(F, B, W, comm, cross, owned, m, a_r, b_r, [lim] * c.pp, buckets, opt))
    return best

