"""A deterministic CP-SAT polish of a schedule, and a large-neighbourhood search (no torch).

Used by :mod:`pipeloom.schedule.v_shape` and ``bench/zb_bounds.py``. Works on the integer job graph of
:mod:`.cpsat` and the lower bounds of :mod:`.bounds` (ortools is imported only when CP-SAT runs).

Polish (:func:`polish`)
-----------------------
CP-SAT (the ``interval`` model of ``optimal``: NoOverlap per device, a reservoir for memory),
hinted with the given schedule, asked for a strictly shorter one. One worker, a fixed seed
and a *deterministic* time limit (``max_deterministic_time``, CP-SAT's own work measure), so
the result is the same on any machine and under any load. The answer is re-timed by the
simulator and accepted only if it is valid, within the limit and strictly shorter.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...core.ir import Schedule
from ...sim.simulate import simulate
from ..registry import PlanSpec
from ..validate import validate
from .bounds import graph_bound, lower_bound, split_graph
from ...core import progress
from .cpsat import hint_starts, relabel_hint, solve_graph, topo_key


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
    devices = []
    for d in range(g.pp):
        on = [j for j in g.jobs if g.dev[j.chunk] == d]
        on.sort(key=lambda j: (starts[j], topo_key(j, g.nc)))
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
    g = split_graph(spec, sched.placement)
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
    early, g, lb, ires, before = _prepare(spec, sched, det_time)
    if early is not None:
        return early
    horizon = int(round(ires.makespan))
    hint = relabel_hint(hint_starts(ires), g.m, g.nc)
    # ortools loaded before the report that says Ctrl-C stops the solve: an interrupt inside its module
    # initialisation would surface as an ImportError
    from ortools.sat.python import cp_model  # noqa: F401
    progress.report(f"polishing with CP-SAT ({len(g.jobs)} jobs, {det_time:g} deterministic s; Ctrl-C stops)")
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
    early, g, lb, ires, before = _prepare(spec, sched, det_time)
    if early is not None:
        return early
    horizon = int(round(ires.makespan))
    vals = hint_starts(ires)
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
                    horizon, vals = int(round(ir.makespan)), hint_starts(ir)
        if not ok:
            i += 1
    status = "no improvement" if best is None else ("optimal" if horizon <= lb else "improved")
    return PolishResult(best, before, lb / g.tscale, status, used)
