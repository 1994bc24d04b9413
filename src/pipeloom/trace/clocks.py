"""Align the clocks of a run's machines and clip the waits their timers covered (no torch).

Clock alignment. Ranks on one machine share a clock; machines do not. Offsets are found per
clock domain (machine index, else host name):

1. ``sync`` events: every rank writes one right after a barrier at the start of each profiled
   step, so all of them mark (nearly) the same instant. offset_k = median over steps of
   (median sync time of machine k - that of the reference machine).
2. Without syncs, the first P2P pairs: a job that needs another machine's output cannot start
   before that output ends. For machines a, b let g_ab = min over cross edges a->b of
   (consumer start - producer end) in raw clocks. With edges both ways the offset is the
   NTP-style midpoint (g_ab - g_ba) / 2; one way only, g_ab (the tightest edge taken as zero wait).

Then :func:`clip_waits` moves out of each job the part of its interval before its input existed.
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict

from ..sim.replay import dependencies, produces
from .run import RankLog, RunLog


def align_clocks(run: RunLog) -> None:
    """Shift every rank's times so that all machines share machine 0's clock (see the module docstring)."""
    domains = sorted({r.domain for r in run.ranks}, key=lambda d: int(d[7:]))
    if len(domains) == 1:
        run.alignment = "single clock"
        run.offsets = {domains[0]: 0.0}
        return
    ref = domains[0]
    offsets: dict[str, float] = {ref: 0.0}
    by_dom: dict[str, list[RankLog]] = defaultdict(list)
    for r in run.ranks:
        by_dom[r.domain].append(r)

    def sync_medians(dom: str) -> dict[int, float]:
        per: dict[int, list[float]] = defaultdict(list)
        for r in by_dom[dom]:
            for s, t in r.syncs.items():
                per[s].append(t)
        return {s: statistics.median(v) for s, v in per.items()}

    ref_sync = sync_medians(ref)
    methods = set()
    for dom in domains[1:]:
        ms = sync_medians(dom)
        common = sorted(set(ms) & set(ref_sync))
        if common:
            offsets[dom] = statistics.median(ms[s] - ref_sync[s] for s in common)
            methods.add("sync")
    missing = [d for d in domains if d not in offsets]
    if missing:
        p2p = _p2p_offsets(run, by_dom, offsets)
        for d in missing:
            if d in p2p:
                offsets[d] = p2p[d]
                methods.add("p2p")
            else:
                offsets[d] = 0.0
                run.warnings.append(f"{d}: no sync events and no P2P pair with an aligned machine; clock left as is")
    for r in run.ranks:
        off = offsets[r.domain]
        if off:
            for j in r.jobs:
                j.start -= off
                j.end -= off
                if j.done is not None:
                    j.done -= off
            r.syncs = {s: t - off for s, t in r.syncs.items()}
            r.step_ends = {s: t - off for s, t in r.step_ends.items()}
    run.offsets = offsets
    run.alignment = "+".join(sorted(methods)) or "none"


def _p2p_offsets(run: RunLog, by_dom: dict[str, list[RankLog]], known: dict[str, float]) -> dict[str, float]:
    """Offsets from cross-machine dependency edges (module docstring, method 2)."""
    sched = run.schedule
    nc = sched.num_chunks
    ends: dict[tuple, tuple[str, float]] = {}
    for r in run.ranks:
        for j in r.jobs:
            for ev in produces(j.job()):
                ends[(r.dp_rank, j.step) + ev] = (r.domain, j.end)
    gap: dict[tuple[str, str], float] = {}
    for r in run.ranks:
        for j in r.jobs:
            for ev in dependencies(j.job(), nc):
                src = ends.get((r.dp_rank, j.step) + ev)
                if src is None or src[0] == r.domain:
                    continue
                key = (src[0], r.domain)
                g = j.start - src[1]
                if key not in gap or g < gap[key]:
                    gap[key] = g
    # pairwise offset estimates off_b - off_a, then breadth-first from the machines already aligned
    est: dict[tuple[str, str], float] = {}
    for (a, b), g_ab in gap.items():
        g_ba = gap.get((b, a))
        est[(a, b)] = (g_ab - g_ba) / 2 if g_ba is not None else g_ab
        est[(b, a)] = -est[(a, b)]
    out = dict(known)
    frontier = list(known)
    while frontier:
        a = frontier.pop()
        for (x, b), v in est.items():
            if x == a and b not in out:
                out[b] = out[a] + v
                frontier.append(b)
    return {d: v for d, v in out.items() if d not in known}


def clip_waits(run: RunLog, eps: float = 1e-6) -> None:
    """Start every job no earlier than the end of the jobs it depends on (same step and pipeline).

    The log format asks for start/end around the compute only; a runtime whose timer also covers
    the receive of the job's input logs the wait as busy time and hides the bubble. A job cannot
    compute before its input exists, so the part of its interval before the latest dependency
    ended is moved out of the job (kept in ``LogJob.wait`` and drawn as a wait). Logs that follow
    the format are left unchanged. Run after :func:`align_clocks`.
    """
    nc = run.schedule.num_chunks
    ends: dict[tuple, float] = {}
    for r in run.ranks:
        for j in r.jobs:
            for ev in produces(j.job()):
                ends[(r.dp_rank, j.step) + ev] = j.end
    n, tot = 0, 0.0
    for r in run.ranks:
        for j in r.jobs:
            if j.chunk >= nc:
                continue
            ready = max((ends.get((r.dp_rank, j.step) + ev, -math.inf) for ev in dependencies(j.job(), nc)),
                        default=-math.inf)
            if ready > j.start + eps:
                cut = min(ready, j.end) - j.start
                j.start += cut
                j.wait += cut
                n += 1
                tot += cut
    run.clipped_jobs, run.clipped_s = n, tot
    if n:
        run.warnings.append(f"{n} job interval(s) began before their input existed (the timer covered the receive); "
                            f"{tot * 1e3:.3g} ms of waiting moved out of the jobs")
