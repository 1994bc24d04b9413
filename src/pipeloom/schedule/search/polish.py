"""Makespan lower bounds under a memory limit, and a deterministic CP-SAT polish (private, no torch).

Used by :mod:`pipeloom.schedule.v_shape` (``zbv``, ``vhalf``, ``vmin``) and by
``bench/zb_bounds.py``. Works on the integer job graph of :mod:`pipeloom.schedule.optimal`
(:class:`~pipeloom.schedule.optimal.JobGraph`: the same jobs, lags, durations and memory
deltas as the exact solver and the simulator; ortools is imported only when CP-SAT runs).

Lower bound (:func:`lower_bound`)
---------------------------------
Notation, per device d: ``head[j]`` / ``tail[j]`` the longest dependency path before job j's
start / from its start to the end (j included); ``hF``, ``hB`` the smallest head of a forward /
of an input-grad backward B on d; ``Ftot``, ``BWtot`` the total forward / backward (B and W)
work on d; ``L`` the memory limit. Memory follows the device's order (the level after each
job is at most ``L``; F adds ``a_c``, B frees ``b_c``, W frees ``a_c - b_c``). Every term below
holds for every valid schedule, so their maximum is a lower bound of the makespan T:

1. critical path ``max_j head[j] + tail[j]`` and the device bound
   ``min head + work on d + min (tail - own duration)`` (as in ``optimal``);
2. warm-up (memory): no B or W can start before ``hB`` (W needs its B). The jobs before d's
   first B in d's order are forwards only; their memory is never freed before that B, so their
   ``a`` sum to at most ``L``, and they run inside ``[hF, s_B]`` where ``s_B >= hB`` is that B's
   start. Let ``Fpre(s)`` = the most forward work whose ``a`` fit in ``L`` (a knapsack over the
   local chunks, m copies each) capped at ``s - hF``. Everything else on d (all B and W, the
   other forwards) runs after ``s_B``, one job at a time, so
   ``T >= s_B + BWtot + Ftot - Fpre(s_B) >= hB + BWtot + Ftot - Fpre(hB)`` (the middle
   expression does not decrease with ``s_B``: ``Fpre`` grows by at most the time added);
3. last forward (memory): let P be the last forward in d's order. When P has run, every forward
   of d has run, so the memory after P is ``m * need_d - freed`` with ``need_d = sum_{c on d}
   a_c`` and ``freed`` what the B and W before P released; it is at most ``L``, so the B and W
   before P must free ``X = m*need_d - L``. Freeing costs time: per (microbatch, chunk) either
   nothing, B (frees ``b``, costs ``dB``) or B and W (frees ``a``, costs ``dB + dW``; W needs
   its B); ``Wfree`` = the least work that frees ``X`` (a small knapsack, exact or its LP
   relaxation, both lower bounds). If ``X > 0`` some B runs before P, so ``s_B < start(P)``;
   those B/W and every forward but P run before P, all of the B/W after ``s_B``; so by the
   argument of 2, ``start(P) >= hB + Wfree + max(0, Ftot - dF(P) - Fpre(hB))`` (when
   ``X <= 0`` no B need precede P and the term is skipped). P is the last forward of its
   microbatch on d, so it is on d's highest local chunk (a microbatch's forwards go up the
   chunks), and ``T >= start(P) + tail[F on that chunk]``.

Example (``zbv`` pp 4, m 8, F=B=W=comm=1, limit 1p = 4 units, a = 1/2, b = 1/4): on the
last device, ``hB = 20``, ``Fpre = 8`` (8 forwards fit), ``X = 8 - 4 = 4`` units = 16 jobs of
1/4, so ``start(P) >= 20 + 16 + (16 - 1 - 8) = 43`` and ``T >= 43 + 22 = 65``: the official
generator's 65 is optimal there (CP-SAT alone proves only 54 in 90 s).

The bounds are checked against the exact optimum on small shapes (tests/schedule/test_polish.py).

Polish (:func:`polish`)
-----------------------
CP-SAT (the ``interval`` model of ``optimal``: NoOverlap per device, a reservoir for memory),
hinted with the given schedule, asked for a strictly shorter one. One worker, a fixed seed
and a *deterministic* time limit (``max_deterministic_time``, CP-SAT's own work measure), so
the result is the same on any machine and under any load. The answer is re-timed by the
simulator and accepted only if it is valid, within the limit and strictly shorter.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

from ...core.ir import Job, Kind, Placement, Schedule
from ..registry import PlanSpec


@dataclass(frozen=True, slots=True)
class Bound:
    """A lower bound of the makespan and which term gave it."""

    value: float
    term: str
    """'critical path / device', 'warm-up (memory)' or 'last forward (memory)'"""
    device: int | None = None


def _graph(spec: PlanSpec, placement: Placement):
    from ..optimal import job_graph

    return job_graph(spec, placement, split=True)


def _max_f_work(g, chunks: list[int], cap_mem: int) -> int:
    """Most forward work on ``chunks`` (m copies each) whose memory sums to at most ``cap_mem``.

    Exact enumeration for few chunk kinds; else the LP relaxation (an upper bound, so still valid).
    """
    items = [(g.ia[c], g.iF[c]) for c in chunks]
    if not items:
        return 0
    if all(a <= 0 for a, _ in items):
        return g.m * sum(f for _, f in items)
    if len(items) <= 2 or (g.m + 1) ** (len(items) - 1) <= 20_000:
        first, rest = items[0], items[1:]
        best = 0
        for counts in product(range(g.m + 1), repeat=len(rest)):
            used = sum(n * a for n, (a, _) in zip(counts, rest))
            if used > cap_mem:
                continue
            work = sum(n * f for n, (_, f) in zip(counts, rest))
            a0, f0 = first
            n0 = g.m if a0 <= 0 else min(g.m, (cap_mem - used) // a0)
            best = max(best, work + n0 * f0)
        return best
    # LP relaxation: most work per unit of memory first (zero-memory chunks fit entirely)
    best, room = 0.0, float(cap_mem)
    for a, f in sorted(items, key=lambda x: -(x[1] / x[0]) if x[0] > 0 else -math.inf):
        take = g.m if a <= 0 else min(g.m, room / a)
        best += take * f
        room -= take * max(a, 0)
    return int(math.ceil(best - 1e-9))


def _min_free_work(g, chunks: list[int], need: int) -> float:
    """Least B/W work on ``chunks`` that frees at least ``need`` memory (per microbatch and chunk:
    nothing, B alone, or B and W). Exact by dynamic programming when small, else the LP relaxation
    of that choice problem (a lower bound)."""
    if need <= 0:
        return 0.0
    opts = []  # per chunk: (freed, cost) of B alone and of B+W
    for c in chunks:
        opts.append(((g.ib[c], g.iB[c]), (g.ia[c], g.iB[c] + g.iW[c])))
    total_free = g.m * sum(o[1][0] for o in opts)
    if total_free < need:  # cannot happen for a feasible limit; be safe
        return 0.0
    groups = len(chunks) * g.m
    if need * groups <= 2_000_000:
        INF = math.inf
        dp = [0.0] + [INF] * need  # dp[x]: least cost to free at least x (capped at need)
        for (fb, cb), (fw, cw) in opts:
            for _ in range(g.m):
                new = dp[:]
                for x in range(need + 1):
                    if dp[x] == INF:
                        continue
                    for fr, co in ((fb, cb), (fw, cw)):
                        y = min(need, x + fr)
                        if dp[x] + co < new[y]:
                            new[y] = dp[x] + co
                dp = new
        return dp[need]
    # LP relaxation: per chunk the cheaper-per-unit of "B then W" increments, convexified
    incs = []
    for (fb, cb), (fw, cw) in opts:
        if fb > 0 and cb / fb <= cw / fw:
            incs += [(cb / fb, fb), ((cw - cb) / (fw - fb) if fw > fb else math.inf, fw - fb)]
        else:
            incs.append((cw / fw, fw))
    cost, left = 0.0, float(need)
    for rate, fr in sorted(incs):
        take = min(left, g.m * fr)
        cost += take * rate
        left -= take
        if left <= 0:
            break
    return cost


def graph_bound(g) -> tuple[int, str, int | None]:
    """(bound in the graph's integer time, term, device) of :func:`lower_bound` on a job graph."""
    best = (g.lb, "critical path / device", None)
    if g.ilimit is None:
        return best
    for d in range(g.pp):
        chunks = [c for c in range(g.nc) if g.dev[c] == d]
        if not chunks:
            continue
        fs = [Job(Kind.F, 0, c) for c in chunks]
        bs = [Job(Kind.B, 0, c) for c in chunks]
        hF = min(g.head[j] for j in fs)
        hB = min(g.head[j] for j in bs)   # heads do not depend on the microbatch
        ftot = g.m * sum(g.iF[c] for c in chunks)
        bwtot = g.m * sum(g.iB[c] + g.iW[c] for c in chunks)
        fpre = min(_max_f_work(g, chunks, g.ilimit), max(0, hB - hF))
        warm = hB + bwtot + ftot - fpre
        if warm > best[0]:
            best = (warm, "warm-up (memory)", d)
        top = max(chunks)
        need = g.m * sum(g.ia[c] for c in chunks) - g.ilimit
        wfree = int(math.ceil(_min_free_work(g, chunks, need) - 1e-9))
        if wfree <= 0:  # nothing must be freed: P may come before every B (the device bound covers it)
            continue
        last = hB + wfree + max(0, ftot - g.iF[top] - fpre) + g.tail[Job(Kind.F, 0, top)]
        if last > best[0]:
            best = (last, "last forward (memory)", d)
    return best


def lower_bound(spec: PlanSpec, placement: Placement | str = Placement.V) -> Bound:
    """A lower bound of the makespan of every valid B/W-split schedule of ``spec`` (under
    ``spec.mem_limit``) with ``placement`` (see the module docstring for the proof)."""
    g = _graph(spec, Placement(placement))
    v, term, d = graph_bound(g)
    if g.rounded:  # durations rounded to 1/tscale: every path or sum has < 2*len(jobs) terms, each off by <= 1/2
        return Bound(max(0.0, (v - len(g.jobs)) / g.tscale), term, d)
    return Bound(v / g.tscale, term, d)


@dataclass(slots=True)
class PolishResult:
    schedule: Schedule | None
    """a strictly shorter valid schedule, or None"""
    makespan: float
    """makespan of the input schedule"""
    bound: float
    """best lower bound known (analytic, raised by CP-SAT's proof where it ran)"""
    status: str
    """'proven optimal' (the input meets the analytic bound: no search), 'improved' (shorter found),
    'optimal' (CP-SAT proved the returned or the input schedule optimal), 'no improvement', 'off'
    (budget 0: bound only) or 'skipped (...)' (costs the integer model cannot take exactly)"""
    det_time: float = 0.0


def _from_starts(sched: Schedule, g, starts: dict) -> Schedule:
    """``sched``'s shape and meta with each device's jobs in order of the solver's ``starts`` (ties: topological)."""
    from ..optimal import _topo_key

    devices = []
    for d in range(g.pp):
        on = [j for j in g.jobs if g.dev[j.chunk] == d]
        on.sort(key=lambda j: (starts[j], _topo_key(j, g.nc)))
        devices.append(tuple(on))
    return Schedule(sched.name, sched.pp, sched.vpp, sched.microbatches, sched.placement, tuple(devices),
                    meta=dict(sched.meta))


#: CP-SAT parameters of every polish and window solve: symmetry detection on the expanded reservoir
#: (pairwise order literals) took half the wall time of a short polish (pp 4, m 12: 0.8 of 1.6 s) and
#: did not change the results we measured
_PARAMS = {"symmetry_level": 0}


def _prepare(spec: PlanSpec, sched: Schedule, det_time: float):
    """What :func:`polish` and :func:`lns` share before searching: (early result or None, job graph,
    integer bound, simulation in integer costs, makespan of ``sched``). The early result says why no
    search runs: costs rounded, the bound met ('proven optimal'), no budget ('off'), zero durations."""
    from ...sim.simulate import simulate

    g = _graph(spec, sched.placement)
    before = simulate(sched, spec.costs).makespan
    if g.rounded:  # costs that are no small fraction: the integer model is not exact, leave the schedule
        return (PolishResult(None, before, lower_bound(spec, sched.placement).value, "skipped (costs rounded)"),
                g, None, None, before)
    lb, _, _ = graph_bound(g)
    ires = simulate(sched, g.int_costs())
    early = None
    if lb >= int(round(ires.makespan)):
        early = PolishResult(None, before, lb / g.tscale, "proven optimal")
    elif det_time <= 0:
        early = PolishResult(None, before, lb / g.tscale, "off")
    elif min(g.iF + g.iB + g.iW) <= 0:  # the reservoir needs distinct start times on a device
        early = PolishResult(None, before, lb / g.tscale, "skipped (zero durations)")
    return early, g, lb, ires, before


def polish(spec: PlanSpec, sched: Schedule, det_time: float, *, seed: int = 0,
           params: dict | None = None) -> PolishResult:
    """Look for a strictly shorter valid schedule than ``sched`` with CP-SAT (see the module docstring).

    ``det_time``: CP-SAT's deterministic time limit (about seconds of one worker; 0: bound only).
    Deterministic: one worker, fixed ``seed``. The answer is re-timed with the simulator and
    returned only if it passes :func:`pipeloom.schedule.validate.validate` under ``spec.mem_limit``
    and is strictly shorter than ``sched``.
    """
    from ...sim.simulate import simulate
    from ..optimal import _hint_starts, _relabel_hint, solve_graph
    from ..validate import validate

    early, g, lb, ires, before = _prepare(spec, sched, det_time)
    if early is not None:
        return early
    horizon = int(round(ires.makespan))
    hint = _relabel_hint(_hint_starts(ires), g.m, g.nc)
    res = solve_graph(g, "interval", hint, horizon, det_time=det_time, workers=1, seed=seed, extra_lb=lb,
                      params={**_PARAMS, **(params or {})})
    if res is None:
        return PolishResult(None, before, lb / g.tscale, "no improvement", det_time)
    status, vals, obj, bound = res
    bound = max(lb, min(bound, obj))
    out = PolishResult(None, before, bound / g.tscale, "optimal" if bound >= obj else "no improvement", det_time)
    if obj >= horizon:
        return out
    cand = _from_starts(sched, g, vals)
    if validate(cand, mem=spec.mem, mem_limit=spec.mem_limit):
        return out
    after = simulate(cand, spec.costs, spec.mem).makespan
    if after < before - 1e-9:
        out.schedule = cand
        out.status = "optimal" if bound >= obj else "improved"
    return out


#: tail windows of :func:`lns`: the share of the makespan, from the end, whose jobs are re-solved
LNS_FRACS = (0.2, 0.3, 0.4, 0.5)
#: CP-SAT deterministic seconds per window solve of :func:`lns`
LNS_STEP = 0.1


def lns(spec: PlanSpec, sched: Schedule, det_time: float, *, fracs: tuple[float, ...] = LNS_FRACS,
        step: float = LNS_STEP, seed: int = 0) -> PolishResult:
    """Tail-window large-neighbourhood search for a strictly shorter valid schedule than ``sched``.

    Every job that starts before ``t0 = (1 - f) * makespan`` keeps its start; CP-SAT re-solves the
    others (the tail, where the makespan is decided; a model of a few dozen free jobs, so a short
    solve goes far), ``step`` deterministic seconds per window, windows ``f`` in ``fracs`` in
    turn, a window again after each improvement, until ``det_time`` deterministic seconds are
    spent or the analytic bound is met. Deterministic (one worker, fixed ``seed``, CP-SAT's
    deterministic time); every answer is re-timed and validated under ``spec.mem_limit`` like
    :func:`polish`. Example: ``zbv`` pp 4, m 12, F/B/W/comm 4/6/3/1 at 1p: 344 -> 341 in about
    0.05 deterministic seconds (a full-model polish needs 8 for 341).
    """
    from ...sim.simulate import simulate
    from ..optimal import _hint_starts, solve_graph
    from ..validate import validate

    early, g, lb, ires, before = _prepare(spec, sched, det_time)
    if early is not None:
        return early
    horizon = int(round(ires.makespan))
    vals = _hint_starts(ires)
    best, best_ms, used, i = None, before, 0.0, 0
    while i < len(fracs) and used < det_time - 1e-9 and horizon > lb:
        t0 = int(horizon * (1 - fracs[i]))
        stats: dict = {}
        res = solve_graph(g, "interval", vals, horizon, det_time=min(step, det_time - used), workers=1, seed=seed,
                          extra_lb=lb, params=_PARAMS, fixed_before=t0, stats=stats)
        used += stats.get("det_time", 0.0)
        ok = False
        if res is not None and res[2] < horizon:
            cand = _from_starts(sched, g, res[1])
            if not validate(cand, mem=spec.mem, mem_limit=spec.mem_limit):
                after = simulate(cand, spec.costs, spec.mem).makespan
                ir = simulate(cand, g.int_costs())
                if after < best_ms - 1e-9:
                    best, best_ms, ok = cand, after, True
                    horizon, vals = int(round(ir.makespan)), _hint_starts(ir)
        if not ok:
            i += 1
    status = "no improvement" if best is None else ("optimal" if horizon <= lb else "improved")
    return PolishResult(best, before, lb / g.tscale, status, used)
