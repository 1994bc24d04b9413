"""Local search over a finished schedule's job orders, timed by the simulator (no torch).

The builders plan under pipeloom's memory model (F allocates ``a``, B frees ``b``, W frees the rest). A
runtime can hold memory that model has no term for: measured in torch's runtime, a last stage with a
vocabulary head keeps part of each microbatch's saved tensors after its W until the step ends
(:func:`pipeloom.integrations.torch_calibrate.peak_with_retention`). :func:`reorder` takes any valid
schedule and a peak function of the caller's choosing and moves single jobs within their device's list
(a job moves at most ``max_shift`` places) while that makes the schedule better, in this order:

1. the peak's excess over ``limit`` (a schedule over the limit is first brought under it: while it is over,
   only moves that lower the excess are taken),
2. the simulated makespan,
3. the sum of the devices' finish times (lets the search cross plateaus of equal makespan).

Every accepted order is simulated (so it cannot deadlock) and keeps each job exactly once: the result is
as valid as the input and never worse on these three keys, compared in that order (so a schedule over the
limit may get longer on its way under it). Overlapped pairs (DualPipe) keep their two jobs
together: a pair's jobs do not move and single jobs do not move between them.
"""
from __future__ import annotations

import random
import time
from dataclasses import replace
from typing import Callable, Sequence

from ...core.costs import Costs, MemModel
from ...core.ir import Job, Kind, Schedule
from ...sim.simulate import DeadlockError, memory_profile, simulate

PeakFn = Callable[[Schedule], Sequence[float]]
#: meta keys that state a builder's proof about its own order (v_shape/zb_looped polish, the exact solver)
STALE_WHEN_CHANGED = ("polished", "status", "objective")


def _key(s: Schedule, costs: Costs, mem: MemModel | None, limit: float | None, peak: PeakFn):
    try:
        r = simulate(s, costs, mem)
    except DeadlockError:
        return None
    over = 0.0 if limit is None else max(0.0, max(peak(s)) - limit)
    return (round(over, 9), round(r.makespan, 9), round(sum(e[-1] for e in r.end if e), 9))


def _pinned(s: Schedule, d: int) -> set[int]:
    """Positions on device ``d`` that belong to an overlapped pair."""
    out: set[int] = set()
    for dd, i in s.overlapped:
        if dd == d:
            out.update((i, i + 1))
    return out


def reorder(schedule: Schedule, costs: Costs, mem: MemModel | None = None, *, limit: float | None = None,
            peak: PeakFn | None = None, max_shift: int = 6, budget_s: float = 5.0, seed: int = 0) -> Schedule:
    """A schedule no worse than ``schedule`` on (peak excess over ``limit``, makespan, sum of finish times),
    found by moving single jobs within their device's list (see the module doc).

    ``peak(s)`` gives per-device peaks (default: the memory model's, :func:`memory_profile`); ``limit`` None
    ignores memory. Stops at a local optimum or after ``budget_s`` seconds. ``meta['reorder']`` of the result
    records the moves accepted and the keys before and after."""
    peak_fn: PeakFn = peak or (lambda s: memory_profile(s, mem)[0])
    best = _key(schedule, costs, mem, limit, peak_fn)
    if best is None:
        raise ValueError("reorder needs a schedule that runs: this one deadlocks in the simulator")
    start_key = best
    rng = random.Random(seed)
    devs = [list(d) for d in schedule.devices]
    cur = schedule
    moves = 0
    t_end = time.perf_counter() + budget_s
    pinned = [_pinned(schedule, d) for d in range(schedule.pp)]  # (pairs never move)
    improved = True
    while improved and time.perf_counter() < t_end:
        improved = False
        cand_moves = [(d, i, sh) for d in range(schedule.pp) for i in range(len(devs[d]))
                      for sh in range(-max_shift, max_shift + 1) if sh and 0 <= i + sh < len(devs[d])]
        rng.shuffle(cand_moves)
        for d, i, sh in cand_moves:
            if time.perf_counter() >= t_end:
                break
            lo, hi = min(i, i + sh), max(i, i + sh)
            if pinned[d] and any(p in pinned[d] for p in range(lo, hi + 1)):
                continue
            seq = devs[d][:]
            job = seq.pop(i)
            seq.insert(i + sh, job)
            trial_devs = devs[:d] + [seq] + devs[d + 1:]
            trial = replace(cur, devices=tuple(tuple(x) for x in trial_devs), witness=None)
            k = _key(trial, costs, mem, limit, peak_fn)
            # over the limit, only a move that lowers the excess counts (a shorter or tidier order could lead
            # the descent into a local optimum that is still over it)
            if k is not None and (k[0] < best[0] if best[0] > 0 else k < best):
                best, cur, devs = k, trial, trial_devs
                moves += 1
                improved = True
                break
    meta = dict(schedule.meta)
    meta["reorder"] = {"moves": moves, "before": list(start_key), "after": list(best)}
    return replace(cur, meta=meta, witness=None)


def fuse_backward(schedule: Schedule, chunks) -> Schedule:
    """``schedule`` with the backward of every chunk in ``chunks`` fused: each of their B jobs becomes a BW at
    its place and their W jobs are dropped (chunks already fused, BW, are left as they are).

    A BW needs what its B needed and nothing waits for a W, so the result is as valid as the input; it frees a
    chunk's whole activation at the B's place instead of part of it, and its W time moves there. What it is
    for: torch's split backward (``stage_backward_input`` then ``stage_backward_weight``) leaves part of a head
    with the loss saved until the step ends, its fused backward nothing
    (:func:`pipeloom.integrations.torch_calibrate.peak_with_retention`); fusing such a chunk and then
    :func:`reorder` trades a little time for that memory. Schedules with overlapped pairs are refused (the
    pairs' positions would shift). ``meta`` keeps the builder's provenance but not its optimality status."""
    chunks = {int(c) for c in chunks}
    bad = sorted(c for c in chunks if not 0 <= c < schedule.num_chunks)
    if bad:
        raise ValueError(f"fuse_backward: chunk {bad[0]} is not in 0..{schedule.num_chunks - 1}")
    if schedule.overlapped:
        raise ValueError("fuse_backward: the schedule has overlapped pairs (DualPipe); fusing would move them")
    devices = [[Job(Kind.BW, j.mb, j.chunk) if j.chunk in chunks and j.kind is Kind.B else j
                for j in seq if not (j.chunk in chunks and j.kind is Kind.W)] for seq in schedule.devices]
    # what the builder proved of its order (the polish's or solver's status, objective) is not true of this one
    meta = {k: v for k, v in schedule.meta.items() if k not in STALE_WHEN_CHANGED}
    meta["fused_backward"] = sorted(chunks)
    return replace(schedule, devices=tuple(tuple(d) for d in devices), meta=meta, witness=None)
