"""Where to split and where to fuse under tensor-parallel costs (``pipeloom plan/simulate --tp-fuse``; no torch).

A zero-bubble split moves a B's weight-gradient GEMMs to a later W, and with them the work that hid the B's
tensor-parallel input-gradient collective (issue 30): a split B exposes its collective, a fused BW hides it
behind the column-parallel wgrad GEMMs. The split pays where the W it frees fills a bubble later; it buys
nothing where

* the W comes right after its own B (``zbh1`` and ``zbv`` plans have such pairs), or
* the B is of global chunk 0 (the first stage's first chunk): its input gradient goes to no device, so
  nothing waits for the B to end early.

:func:`fuse_for_tp` is a post-pass on any plan: each split B (those two kinds first, then every other one, in
plan order) is tried fused, its W moved up to the B and the pair made one BW job; the plan is re-timed with the
one kernel (:func:`pipeloom.sim.kernel.time_order`, per-job durations of :mod:`pipeloom.sim.tp_jobs`) and the
fusion is kept only if the makespan does not grow and every device's peak memory stays within ``mem_limit``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ..core.costs import Costs, MemModel
from ..core.ir import Job, Kind, Schedule
from ..sim import kernel
from ..sim.simulate import memory_profile
from ..sim.tp_jobs import TPJobTerms, tp_job_durations
from ..core.rules import EPS as _EPS

__all__ = ["fuse_for_tp", "tp_makespan"]


def tp_makespan(schedule: Schedule, costs: Costs, terms: TPJobTerms) -> tuple[float, dict]:
    """Makespan of ``schedule`` with the TP collective of ``terms`` per job, and the detail of
    :func:`pipeloom.sim.tp_jobs.tp_job_durations`."""
    nc = schedule.num_chunks
    dF, dB, dW = costs.per_chunk(nc)
    dur, detail = tp_job_durations(schedule, dF, dB, dW, terms)
    pairs = {}
    ov = costs.overlap
    for d, i in schedule.overlapped:
        if 0 <= d < schedule.pp and i + 1 < len(dur[d]):
            d1, d2 = dur[d][i], dur[d][i + 1]
            pairs[(d, i)] = (d1, d2, ov * min(d1, d2))
    tm = kernel.time_order(schedule.devices, schedule.microbatches,
                           kernel.Rules.make(schedule.pp, nc, schedule.placement, costs.comm),
                           job_durations=dur, pairs=pairs)
    return tm.makespan, detail


def _candidates(schedule: Schedule) -> list[tuple[int, int]]:
    """``(device, index)`` of every split B: own-W-next and chunk-0 Bs first, then the rest, in plan order."""
    first, rest = [], []
    for d, jobs in enumerate(schedule.devices):
        for i, j in enumerate(jobs):
            if j.kind is not Kind.B:
                continue
            nxt = jobs[i + 1] if i + 1 < len(jobs) else None
            adjacent = nxt is not None and nxt.kind is Kind.W and (nxt.mb, nxt.chunk) == (j.mb, j.chunk)
            (first if adjacent or j.chunk == 0 else rest).append((d, j))
    return [(d, j) for d, j in first + rest]


def _fused(jobs: Sequence[Job], b: Job) -> tuple[Job, ...] | None:
    """``jobs`` with ``b`` made a BW and its W removed; None when the W is not on this device."""
    w = Job(Kind.W, b.mb, b.chunk)
    try:
        iw = jobs.index(w)
    except ValueError:
        return None
    out = [Job(Kind.BW, b.mb, b.chunk) if j == b else j for j in jobs]
    del out[iw]
    return tuple(out)


def fuse_for_tp(schedule: Schedule, costs: Costs, terms: TPJobTerms, *, mem: MemModel | None = None,
                mem_limit: float | None = None) -> tuple[Schedule, dict]:
    """The plan with every split B fused into a BW where that does not lengthen the makespan (TP collectives
    of ``terms`` per job) and keeps peak memory within ``mem_limit`` (units of ``mem``); and a summary:
    makespan before and after, the fused jobs (``"B3.1@0"``: microbatch 3, chunk 1, device 0), how many
    candidates were tried."""
    if schedule.overlapped:
        # an overlapped pair refers to job indices: removing a W would shift them
        return schedule, {"makespan_before": tp_makespan(schedule, costs, terms)[0], "fused": [], "tried": 0,
                          "note": "plans with overlapped pairs (DualPipe) are left as they are"}
    before, _ = tp_makespan(schedule, costs, terms)
    best, cur = before, schedule
    fused, tried = [], 0
    for d, b in _candidates(schedule):
        jobs = _fused(cur.devices[d], b)
        if jobs is None:
            continue
        tried += 1
        trial = replace(cur, devices=cur.devices[:d] + (jobs,) + cur.devices[d + 1:])
        span, _ = tp_makespan(trial, costs, terms)  # a B's inputs are a BW's; nothing waits for a W: no deadlock
        if span > best + _EPS * max(1.0, best):
            continue
        if mem_limit is not None and max(memory_profile(trial, mem)[0], default=0.0) > mem_limit + 1e-9:
            continue
        best, cur = span, trial
        fused.append(f"B{b.mb}.{b.chunk}@{d}")
    if fused:
        cur = replace(cur, name=f"{schedule.name}+tp-fuse",
                      meta={**schedule.meta, "tp_fuse": {"fused": len(fused), "mode": terms.mode}})
    return cur, {"makespan_before": before, "makespan_after": best, "fused": fused, "tried": tried}
