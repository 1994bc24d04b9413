"""V-shape zero-bubble schedules under a memory limit: ZB-V (``zbv``), V-Half, V-Min (no torch).

Placement is V / zigzag (see :mod:`pipeloom.core.ir`): chunk 0 runs down devices
0..pp-1, chunk 1 back up pp-1..0, chunk 2 down again, ... for any ``vpp >= 2`` (ZB-V
beyond the official vpp = 2). The backward is split into B (input grad) and W
(weight grad); W is postponed to fill bubbles as long as memory allows.

Memory (units of one full-stage microbatch activation, :mod:`pipeloom.core.costs`): F on chunk
c allocates ``a(c)`` (default 1/vpp), B frees ``b(c)``, W frees ``a(c) - b(c)``. A job is
inserted only when the device's current memory plus the job's peak fits the limit.
Limits: none, ``1p`` (= pp units, 1F1B's peak), ``1.5p``, ``2p`` or any number.

The schedules are made by the event-driven greedy list scheduler of
:mod:`pipeloom.schedule.search.greedy` over a grid of policies (B/F priority, chunk order, W
filling, admission caps, and the official generator's capped warm-up as extra variants),
keeping the smallest makespan, then the smallest peak memory. For vpp = 2 the official
generator's lock-step construction (:mod:`pipeloom.schedule.search.lockstep`, our own
implementation of its rules) adds its passes as candidates (shapes up to 7 500 jobs with the
default budget), so there ``zbv`` is never slower than the official ZB-V wherever that
construction reproduces it (it does on all 96 reference cases). With costs that differ between chunks
the lock-step passes are also built with every chunk at the mean costs (the official generator's and
torch's ``ZBVZeroBubble``'s view) and timed with the real ones.
Options (``spec.options``): ``budget`` (job placements for the policy search; by default 60 000 for
the memory trimming, lock-step and building-block candidates, while the policy grid and a descent in
the policy space from its best (:func:`pipeloom.schedule.search.portfolio.default_grid_jobs`) get up to
1 000 000 placements on shapes of at most 12 288 jobs: the whole grid up to about 1 250 jobs; an
explicit ``budget`` is the budget of all of them, as before) and ``insert_budget`` (job re-timings for an extra, slower insertion local search,
default 2 000 000 on shapes of at most 400 jobs at the fast effort without ``polish``, else 0 = off; e.g. 3 000 000 takes pp 4, m 8, F/B/W
4/6/3, comm 1 at 1p from 240 to 238 in about 1 s). Where memory allows, a device
runs as many forwards before its first B as fit (unlike the official generator, which
caps that count).

Lower bound and polish (:mod:`pipeloom.schedule.search.polish`; option ``effort``: ``high`` only, unless
``polish`` is given; the default ``fast`` computes the bound and runs no search, except on shapes of at most
:data:`FAST_POLISH_MAX_JOBS` jobs under a limit below 1p): the result carries
``meta['lower_bound']``, a proven makespan lower bound under the memory limit (critical path, device load
and two memory terms; every shape up to :data:`BOUND_MAX_CHUNKS` chunks, where it also stops the search
from adding candidates once met), and for shapes of at most 400 jobs ``meta['polished']``. When the
bound does not already prove the greedy schedule optimal, a deterministic CP-SAT search
hinted with it looks for a strictly shorter valid one (option ``polish``: CP-SAT
deterministic seconds; default 0.1 on shapes of at most 200 jobs, 0 = off; explicit values
are accepted up to 400 jobs); by default shapes of 201 to 400 jobs get the tail-window
search ``_polish.lns`` instead (0.6 deterministic seconds; off when ``polish`` is given).
A shorter schedule is kept only if it validates under the limit; ``meta['polished_from']`` then holds the greedy makespan.

``vhalf`` and ``vmin`` are the same ``zbv`` planned under the activation-memory budgets of V-Half
and V-Min in Qi et al. 2024, "Pipeline Parallelism with Controllable Memory" (table of the
paper's released code: V-Half ``(p+2)//2`` and V-Min ``(p+4)//3`` microbatch activations, against
1F1B's ``p``), raised to the smallest feasible limit where the budget is below it; a tighter
``--mem-limit`` than the budget is honoured.

Building blocks (:mod:`pipeloom.schedule.search.vblock`): with vpp = 2 and a memory limit the
search also builds the paper's kind of schedule, a per-device block repeated every 6 unit slots
with fixed lifespans, over a family of block shapes whose repeated pattern fits the limit,
squeezed in the warm-up and cool-down and re-timed with the real costs. Such a candidate is kept
only when it beats the greedy / lock-step ones; below 1p it usually does (pp 4, m 16, V-Min
budget: 107 instead of 126, the proven optimum).

Uneven costs at low memory (:data:`pipeloom.schedule.search.portfolio.EXTRA_CANDIDATES`): the blocks are laid
out in unit slots, which fits F = B = W; with B about 2F and comm a microbatch's way down and up the V is
longer than the slots assume. Two more candidates run under any memory limit below 1p (at every size) and at
any limit on shapes of at most 12 288 jobs: a *paced* list scheduler (:mod:`pipeloom.schedule.search.paced`:
one microbatch's earliest timetable repeated every period gives each job a target; a device starts the ready
job with the smallest target, not much before it, and keeps room for the V's return leg) and *modulo*
patterns (:mod:`pipeloom.schedule.search.modulo`: one microbatch's timetable with real costs, repeated every
period without two jobs of a device colliding, at the shortest period whose memory fits). With F/B/W 1/2/1,
comm 0.5: ``zbv`` pp 32, m 128 at 0.5p 1929 -> 1570 (bound 1275), ``vmin`` pp 16, m 32 585 -> 553.
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..core.ir import Placement, make_schedule
from .registry import (EFFORT_OPTION, Option, PlanSpec, effective_limit, effort_option, get, infeasible_limit,
                       int_option, register)
from ..core.errors import ScheduleError
from ..core.limits import MAX_SEARCH_BUDGET, MAX_SOLVER_SECONDS
from .search import greedy as _greedy, localsearch as _localsearch, portfolio as _portfolio

#: default greedy work budget (job placements summed over all policies tried) ...
DEFAULT_BUDGET = 60_000
#: ... or this many placements per job where that is more (shapes above 7 500 jobs): the lock-step and
#: building-block candidates then run at every size (they need 8 and 4 placements per job). Without them
#: V-Min at pp 32-128, m 4pp was 21-31% slower than 1F1B; with them it meets its proven bound
BUDGET_PER_JOB = 8


def default_budget(njobs: int) -> int:
    """The default ``budget`` of a shape of ``njobs`` jobs: :data:`DEFAULT_BUDGET` or :data:`BUDGET_PER_JOB`
    placements per job, whichever is more (deterministic: counted in placements, not time)."""
    return max(DEFAULT_BUDGET, BUDGET_PER_JOB * njobs)


def _fmt_units(x: float, pp: int) -> str:
    return f"{x:g} units ({x / pp:.3g}p)"


def plan_v(name: str, spec: PlanSpec, limit: float | None, *, placement: Placement = Placement.V,
           target: str | None = None):
    """Plan a V-shape B/W-split schedule for ``spec`` under ``limit`` (units or None)."""
    pp, vpp, m = spec.pp, spec.vpp, spec.microbatches
    if vpp < 2:
        raise ScheduleError(f"schedule {name!r} needs vpp >= 2 (V placement), got vpp={vpp}")
    try:
        prob = _greedy.make_problem(pp, vpp, m, placement, spec.costs, spec.mem, limit)
    except ValueError as e:
        raise ScheduleError(str(e)) from None
    lo = _greedy.min_feasible_limit(prob)
    if limit is not None and limit < lo - 1e-9:
        raise infeasible_limit(name, pp, vpp, limit, lo)
    njobs = 3 * m * pp * vpp
    budget = int_option(spec.options, "budget", default_budget(njobs))
    high = effort_option(spec) == "high"
    # (effort=high and an explicit polish run their own insertion step between two polishes instead)
    insert_budget = int_option(spec.options, "insert_budget", DEFAULT_FAST_INSERT if (
        njobs <= DEFAULT_LNS_MAX_JOBS and not high and "polish" not in spec.options) else 0)
    polish_det = _polish_option(spec, njobs, high or (njobs <= FAST_POLISH_MAX_JOBS and limit is not None
                                                     and limit < pp - 1e-9))
    grid = None if "budget" in spec.options else _portfolio.default_grid_jobs(prob, budget)
    bound = None
    if polish_det is None and pp * vpp <= BOUND_MAX_CHUNKS:  # above the polish's sizes: the bound, cheap here
        from .search.bounds import lower_bound

        bound = lower_bound(spec if spec.mem_limit == limit else replace(spec, mem_limit=limit), placement).value
    best = _portfolio.search(prob, budget, insert_budget=insert_budget, grid_jobs=grid, target=bound)
    if best is None:  # cannot happen: the 'reserve' policy is always tried and never deadlocks
        raise ScheduleError(f"{name}: no schedule found under the memory limit {limit}")
    pol = best.policy
    meta = {"builder": name, "mem_limit": limit, "policy": _policy_dict(pol), "local_search": best.improved}
    if target:
        meta["target"] = target
    if polish_det is None:  # large shape: the bound, no polish (the greedy path is all there is)
        meta["lower_bound"] = bound
        return make_schedule(name, pp, vpp, m, placement, best.seqs, witness=best.order, **meta)
    from .search import polish as _polish  # CP-SAT machinery: imported only when a shape is small enough to polish

    pspec = spec if spec.mem_limit == limit else replace(spec, mem_limit=limit)
    sched = make_schedule(name, pp, vpp, m, placement, best.seqs, witness=best.order, **meta)
    res = _polish.polish(pspec, sched, polish_det)
    first = res.makespan
    if res.schedule is not None:
        sched = res.schedule
    if ((high or "polish" in spec.options) and res.status in ("improved", "no improvement")
            and "insert_budget" not in spec.options
            and njobs <= DEFAULT_POLISH_MAX_JOBS):
        # not proven optimal: the insertion search from the best so far, then a second polish from its
        # result (a different start helps CP-SAT: pp 4, m 8, F/B/W/comm 4/6/3/1 at 1p: the greedy's 240
        # -> 238 by insertion -> 237 by the polish, about 1 s in all)
        seqs = _localsearch.insertion_search(prob, [list(d) for d in sched.devices], DEFAULT_INSERT_BUDGET // njobs)
        r = _localsearch.result_of(prob, seqs, best.policy)
        if r is not None and r.makespan < res.makespan - 1e-9 and r.makespan > res.bound + 1e-9:
            again = _polish.polish(pspec, make_schedule(name, pp, vpp, m, placement, r.seqs), polish_det)
            sched = again.schedule or make_schedule(name, pp, vpp, m, placement, r.seqs)
            res = _polish.PolishResult(sched, first, max(res.bound, again.bound),
                                       again.status if again.status != "no improvement" else "improved")
        elif r is not None and r.makespan < res.makespan - 1e-9:  # meets the bound: optimal
            sched = make_schedule(name, pp, vpp, m, placement, r.seqs)
            res = _polish.PolishResult(sched, first, res.bound, "optimal")
    elif (high and res.status == "off" and "polish" not in spec.options and "insert_budget" not in spec.options
            and njobs <= DEFAULT_LNS_MAX_JOBS):
        # above the default polish's size, not proven optimal: the tail-window search (pp 4, m 12,
        # F/B/W/comm 4/6/3/1 at 1p: 344 -> 341 in about 1.5 s; the full-model polish needs 17 s for 341)
        again = _polish.lns(pspec, sched, DEFAULT_LNS)
        if again.schedule is not None:
            sched = again.schedule
        res = _polish.PolishResult(again.schedule, first, again.bound, again.status, again.det_time)
    meta["lower_bound"] = res.bound
    meta["polished"] = res.status
    if res.schedule is not None:
        meta["polished_from"] = first
        return make_schedule(name, pp, vpp, m, placement, res.schedule.devices, **meta)
    return make_schedule(name, pp, vpp, m, placement, best.seqs, witness=best.order, **meta)


#: the most chunks (pp * vpp) for which a shape above the polish's sizes gets its proven bound while planning (its
#: cost grows with the chunks, not the microbatches: pp 128 about 0.1 s; pp 16 384, m 1 would add seconds to a
#: one-second plan); ``pipeloom plan/simulate --json`` report the bound at every size
BOUND_MAX_CHUNKS = 4096
#: default polish budget (CP-SAT deterministic seconds) and the largest shape (jobs) it runs on by default
#: (pp 4, m 8, vpp 2 = 192 jobs). Nothing runs where the bound proves the greedy optimal; elsewhere the
#: polish, the insertion search and a second polish cost about 0.05-1.5 s (docs/bench/zb_vs_official.md)
DEFAULT_POLISH = 0.1
#: job re-timings of the insertion search run before a default polish on shapes the bound does not settle
DEFAULT_INSERT_BUDGET = 2_000_000
#: ... and by the default fast effort (no ``polish`` option) on shapes of at most DEFAULT_LNS_MAX_JOBS jobs: about 0.1-0.2 s there; it moves
#: jobs past each other, a later microbatch past an earlier one on a chunk included, which the greedy never does
#: (low-memory grid of bench/optimality_gap.py --low-memory: pp 2, m 2, F/B/W 1/2/1 at 0.75p 21 -> 20, the optimum)
DEFAULT_FAST_INSERT = 2_000_000
#: the largest shape (jobs) that the default ``fast`` effort polishes too (as ``high`` does) under a memory limit
#: below 1F1B's (1p): there the greedy's order is weakest and a tiny CP-SAT model settles it in 0.1-0.7 s
#: (pp 3, m 3, F/B/W 1/2/1, comm 0.5 at 0.5p: 50 -> 48; pp 4, m 4, F/B/W 1/2/1 at 0.75p: 44 -> 42, both optimal)
FAST_POLISH_MAX_JOBS = 96
DEFAULT_POLISH_MAX_JOBS = 200
#: budget (CP-SAT deterministic seconds) of the default tail-window search (``_polish.lns``) on the unproven
#: shapes above DEFAULT_POLISH_MAX_JOBS jobs and up to DEFAULT_LNS_MAX_JOBS (pp 4, m 16, vpp 2 = 384 jobs)
DEFAULT_LNS = 0.6
DEFAULT_LNS_MAX_JOBS = 400
#: the largest shape (jobs) that gets a lower bound (always) and accepts an explicit ``polish`` option
POLISH_MAX_JOBS = 400


#: the options the V-shape builders read (see the module docstring)
V_OPTIONS = (
    Option(name="budget", type="int", min=0, max=MAX_SEARCH_BUDGET, default=None,
           help=f"job placements for the greedy policy search (default: {DEFAULT_BUDGET} for the candidates, the "
                f"policy grid and its descent up to {_portfolio.GRID_JOBS} on shapes of at most "
                f"{_portfolio.GRID_MAX_SHAPE} jobs)"),
    Option(name="insert_budget", type="int", min=0, max=MAX_SEARCH_BUDGET, default=None,
           help=f"job re-timings for the insertion local search (0 = off; default {DEFAULT_FAST_INSERT} on shapes of "
                f"at most {DEFAULT_LNS_MAX_JOBS} jobs at effort=fast without polish, else 0)"),
    Option(name="polish", type="float", min=0, max=MAX_SOLVER_SECONDS, default=None,
           help=f"CP-SAT deterministic seconds of polish (0 = off; default with effort=high {DEFAULT_POLISH:g} up "
                f"to {DEFAULT_POLISH_MAX_JOBS} jobs, with effort=fast 0)"),
    EFFORT_OPTION)


def _polish_option(spec: PlanSpec, njobs: int, high: bool = True) -> float | None:
    """Polish budget in CP-SAT deterministic seconds (0: bound only), or None (no bound, no polish).
    Without the ``polish`` option: ``high`` effort polishes small shapes, ``fast`` effort never does."""
    if "polish" not in spec.options:
        if njobs > POLISH_MAX_JOBS:
            return None
        return DEFAULT_POLISH if high and njobs <= DEFAULT_POLISH_MAX_JOBS else 0.0
    v = spec.options["polish"]
    try:
        x = float(v)
    except (TypeError, ValueError):
        x = math.nan
    if isinstance(v, bool) or not (math.isfinite(x) and x >= 0):
        raise ScheduleError(f"option polish must be a number >= 0 (CP-SAT deterministic seconds, 0 = off), got {v!r}")
    if x > 0 and njobs > POLISH_MAX_JOBS:
        raise ScheduleError(f"option polish: the shape has {njobs} jobs; polish runs on at most {POLISH_MAX_JOBS} "
                            f"(e.g. pp 4, m 16, vpp 2); use polish=0 or a smaller shape")
    return x if njobs <= POLISH_MAX_JOBS else None


def _policy_dict(pol) -> dict:
    d = {k: getattr(pol, k) for k in pol.__slots__}
    if d.get("cap") == float("inf"):
        d["cap"] = None
    return d


@register("zbv", description="ZB-V: V placement, B/W split, greedy under the memory limit (any vpp >= 2)",
          vpp=">=2", memory_aware=True, options=V_OPTIONS, placement=Placement.V)
def zbv(spec: PlanSpec):
    return plan_v("zbv", spec, effective_limit("zbv", spec))


def _budget_limit(name: str, spec: PlanSpec, text: str):
    """Plan at the builder's declared budget (raised to the floor, capping a given limit: ``limit_caps``)."""
    limit = effective_limit(name, spec)
    units = float(get(name).default_limit(spec.pp))
    return plan_v(name, spec, limit, target=f"{text} = {units:g} units, used {limit:g}")


@register("vhalf", description="V-Half: zbv greedy at (p+2)//2 microbatch activations (about 1/2 of 1F1B)",
          vpp=">=2", memory_aware=True, options=V_OPTIONS, placement=Placement.V,
          no_limit="V-Half budget (p+2)//2 units, raised to the smallest feasible limit",
          default_limit=lambda pp: float((pp + 2) // 2), limit_caps=True)
def vhalf(spec: PlanSpec):
    return _budget_limit("vhalf", spec, "V-Half budget (p+2)//2")


@register("vmin", description="V-Min: zbv greedy at (p+4)//3 microbatch activations (about 1/3 of 1F1B)",
          vpp=">=2", memory_aware=True, options=V_OPTIONS, placement=Placement.V,
          no_limit="V-Min budget (p+4)//3 units, raised to the smallest feasible limit",
          default_limit=lambda pp: float((pp + 4) // 3), limit_caps=True)
def vmin(spec: PlanSpec):
    return _budget_limit("vmin", spec, "V-Min budget (p+4)//3")
