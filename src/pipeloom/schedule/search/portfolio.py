"""The greedy's portfolio: the best schedule over a grid of policies and the other constructions (no torch).

:func:`search` runs a grid of policies (the role of the official ``try_v_schedule(fill_f,
fill_b)`` variants, widened) within a deterministic work budget; for V placement with two
chunks per device it also takes the lock-step passes of :mod:`pipeloom.schedule.search.lockstep`
(the official ZB-V generator's construction, which wins where memory binds hardest, e.g. pp 4
at 1p with m >= 2pp). It keeps the schedule with the
smallest makespan (then stage bubble, then peak memory), tries to keep that makespan under
tighter memory limits ("memory trimming"), and finishes with a budgeted local search of
adjacent swaps (:func:`.localsearch.local_search`). Everything is deterministic: the same input gives the
same schedule on any machine.
"""
from __future__ import annotations

import functools
from dataclasses import replace
from itertools import product

from . import lockstep as _vlockstep
from . import modulo as _modulo
from . import paced as _paced
from . import paper_blocks as _paper_blocks
from . import vblock as _vblock
from .gcpause import paused
from .greedy import INF, _EPS, PassResult, Policy, Problem, _better, min_feasible_limit, run_pass
from .localsearch import insertion_search, polish_result, result_of

#: policies that, in this order, cover the best result on every case of the official reference
#: set (../shared/reference/official_zb.json) found by the full grid below; tried first
_LEADERS = (
    Policy(),
    Policy(admit="reserve", w_fill="always", lookahead=0.5),
    Policy(h1=1, h_warm=True, b_first=False),
    Policy(h0=1, b_first=False, w_fill="always"),
    Policy(b_late=False),
    Policy(h0=1, h_warm=True, b_first=False),
    Policy(h0=1, h1=0.5, h_warm=True, b_first=False, b_late=False, w_fill="always", lookahead=0.5),
    Policy(b_first=False, w_fill="always"),
    Policy(h0=1, b_first=False),
)


def policy_grid(prob: Problem) -> list[Policy]:
    """Every policy of the search, most useful first (see :data:`_LEADERS`)."""
    return list(_grid(prob.nc))


@functools.lru_cache(maxsize=64)
def _grid(nc: int) -> tuple[Policy, ...]:
    """:func:`policy_grid` for ``nc`` chunks (only the warm-up caps depend on the shape; the policies are
    frozen, so one tuple serves every search of that many chunks)."""
    out = list(_LEADERS)
    seen = set(out)
    for admit, h0, h1, h_warm, b_first, f_late, b_late, w_fill, look in product(
            ("plain", "reserve"), (0.0, 1.0, 2.0), (0.0, 0.5, 1.0, 2.0), (False, True), (True, False),
            (True, False), (True, False), ("fit", "always"), (0.0, 0.5)):
        if admit == "reserve" and (h0 or h1 or h_warm):
            continue
        if h_warm and not (h0 or h1):
            continue
        p = Policy(admit=admit, h0=h0, h1=h1, h_warm=h_warm, b_first=b_first, f_late=f_late, b_late=b_late,
                   w_fill=w_fill, lookahead=look)
        if p not in seen:
            seen.add(p)
            out.append(p)
    # the official generator's style: a fixed number of warm-up forwards before the first B
    for w in range(1, 2 * nc + 1):
        out.append(Policy(warmup=w))
    return tuple(out)


#: job placements the policy grid may use by default (:func:`default_grid_jobs`): the whole grid (about
#: 800 policies) on shapes of up to about 1 250 jobs, e.g. pp 3, vpp 3, m 41 (1 107 jobs), where the first
#: 54 policies (the former 60 000 placements) gave 388 against 1F1B's 387 and the whole grid gives 380.5;
#: about 0.1 s of CPU in the C pass at most (0.07-0.15 us a placement)
GRID_JOBS = 1_000_000
#: shapes above this many jobs keep the caller's budget (pp 64, m 512: one policy, about 0.1 s); this is
#: pp 16, m 64, vpp 4
GRID_MAX_SHAPE = 12_288


def default_grid_jobs(prob: Problem, budget_jobs: int) -> int:
    """Placements for the policy grid when the caller set no budget: the whole grid where it costs at most
    :data:`GRID_JOBS` placements, else as many policies as fit in that (never fewer than ``budget_jobs``;
    exactly ``budget_jobs`` on shapes of more than :data:`GRID_MAX_SHAPE` jobs)."""
    njobs = 3 * prob.m * prob.nc
    if njobs > GRID_MAX_SHAPE:
        return budget_jobs
    return max(budget_jobs, min(len(policy_grid(prob)) * njobs, GRID_JOBS))


#: greedy passes kept for :func:`_descend` out of a grid budget larger than the caller's budget
DESCENT_PASSES = 120


def _neighbours(prob: Problem, pol: Policy):
    """Policies that differ from ``pol`` in one rule (the grid's values; the warm-up cap: a coarse set of
    counts from none, else nearby counts and none), in a fixed order; combinations the grid excludes are skipped."""
    nc = prob.nc
    if pol.warmup is None:
        warm = sorted({max(1, round(k * 2 * nc / 8)) for k in range(1, 9)})
    else:
        warm = [w for w in (pol.warmup - 1, pol.warmup + 1, pol.warmup - 2, pol.warmup + 2, pol.warmup - 4,
                            pol.warmup + 4) if 1 <= w <= 2 * nc] + [None]
    options = (("warmup", warm), ("b_first", (True, False)), ("h0", (0.0, 1.0, 2.0)), ("h1", (0.0, 0.5, 1.0, 2.0)),
               ("b_late", (True, False)), ("f_late", (True, False)), ("w_fill", ("fit", "always")),
               ("h_warm", (False, True)), ("lookahead", (0.0, 0.5)), ("admit", ("plain", "reserve")))
    for name, values in options:
        for v in values:
            if v == getattr(pol, name):
                continue
            p = replace(pol, **{name: v})
            if p.admit == "reserve" and (p.h0 or p.h1 or p.h_warm):
                continue
            if p.h_warm and not (p.h0 or p.h1):
                continue
            yield p


def _descend(prob: Problem, best: PassResult, tried: set, passes: int) -> PassResult:
    """Hill-climb in the policy space from ``best``'s policy: run its :func:`_neighbours` (first improvement,
    then from the better one) until none is better or ``passes`` greedy passes are spent.

    Where the grid does not fit the budget, its order hides good policies: the official generator's warm-up
    cap mixed with other rules is not in it at all (pp 3, vpp 3, m 41, F/B/W 0.5/2/0.5 at 1p: the whole grid
    380.5, its best with a warm-up cap of 2 and no B priority 377.5), and the capped variants come last.
    """
    def run(p):
        nonlocal passes
        tried.add(p)
        passes -= 1
        return run_pass(prob, p)

    def climb(cur: PassResult) -> PassResult:
        improved = True
        while improved and passes > 0:
            improved = False
            for p in _neighbours(prob, cur.policy):
                if p in tried:
                    continue
                r = run(p)
                if r is not None and _better(r, cur, prob):
                    cur, improved = r, True
                    break
                if passes <= 0:
                    break
        return cur

    # a second start: the warm-up cap alone, its count found coarse to fine (the grid tries the counts last)
    wbest: PassResult | None = None
    for w in _coarse_to_fine(2 * prob.nc, passes // 4, lambda w: run(Policy(warmup=w)) if passes > 0 else None):
        if w is not None and (wbest is None or _better(w, wbest, prob)):
            wbest = w
    first = climb(best)
    if wbest is not None and passes > 0 and wbest.policy != first.policy:
        second = climb(wbest)
        if _better(second, first, prob):
            return second
    return first


def _coarse_to_fine(hi: int, n: int, f):
    """Results of ``f(w)`` for at most ``n`` counts ``w`` in 1..hi: 8 spread out, then halving steps around
    the best so far (by makespan)."""
    if n <= 0:
        return []
    seen: dict[int, object] = {}

    def key(w):
        r = seen[w]
        return (INF if r is None else r.makespan, w)

    step = max(1, hi // 8)
    for w in range(step, hi + 1, step):
        if len(seen) < n:
            seen[w] = f(w)
    while step > 1 and len(seen) < n:
        step //= 2
        c = min(seen, key=key)
        for w in (c - step, c + step):
            if 1 <= w <= hi and w not in seen and len(seen) < n:
                seen[w] = f(w)
    return list(seen.values())


@paused  # (the collector's passes over every candidate's job lists cost about a quarter of a deep plan)
def search(prob: Problem, budget_jobs: int = 60_000, ls_budget: int = 100_000,
           insert_budget: int = 0, grid_jobs: int | None = None, target: float | None = None) -> PassResult | None:
    """Best schedule over the policy grid and a local search, within a deterministic work budget.

    ``budget_jobs`` bounds the job placements summed over all greedy passes (at least one pass
    runs; big shapes get only the first policy) and sizes the memory trimming and the lock-step and
    building-block candidates below; ``grid_jobs``, when larger, lets the policy grid alone run
    that many placements (:func:`default_grid_jobs`), ``ls_budget`` the job re-timings of the local
    search (:func:`local_search`), ``insert_budget`` those of the optional, wider
    :func:`insertion_search` run at the end (0: off). If every pass tried deadlocks, the
    ``reserve`` policy (which cannot deadlock at any limit >= :func:`min_feasible_limit`) is
    run as a fallback.

    With V placement and vpp 2 the lock-step passes of :mod:`._vlockstep` compete too (within
    a quarter of ``budget_jobs``, only when a pass has at most ``budget_jobs / 8`` jobs): the
    best of them, polished by the same local search, replaces the greedy result when it is
    better. The greedy result itself is computed exactly as without them, so adding them never
    makes a schedule worse. Best = smallest makespan, then smallest stage bubble, then smallest
    peak memory.

    ``target``, a proven lower bound of the makespan (:func:`.bounds.lower_bound`), skips the lock-step and
    building-block candidates once the best so far meets it: nothing can be shorter (zbv pp 128, m 512 at 1p:
    the greedy meets the critical path, about 10 s of candidates saved).
    """
    njobs = 3 * prob.m * prob.nc
    grid = policy_grid(prob)
    n = max(1, budget_jobs // max(njobs, 1))
    total = max(n, (grid_jobs or 0) // max(njobs, 1))  # passes in all
    if total > n and total >= len(grid):
        # a larger grid budget that covers the whole grid: all of it (the plan is then never slower than any
        # policy of the grid alone), then the descent from its best with the rest, at least DESCENT_PASSES (or
        # half the budget): it finds policies outside the grid (pp 6, m 18, vpp 2, F/B/W 1/2/1 at 4 units: 181
        # after the grid alone, 171 with the descent)
        ngrid, ndesc = len(grid), max(total - len(grid), min(DESCENT_PASSES, total // 2))
    elif total > n:  # it does not cover it: a part (half at most, at most DESCENT_PASSES) to the descent
        ngrid = max(n, total - min(DESCENT_PASSES, total // 2))
        ndesc = total - ngrid
    else:  # the caller's budget alone: the grid in its order, what it leaves (if any) to the descent
        ngrid, ndesc = n, max(0, n - len(grid))
    best: PassResult | None = None
    for pol in grid[:ngrid]:
        r = run_pass(prob, pol)
        if r is not None and (best is None or _better(r, best, prob)):
            best = r
    if best is not None and ndesc > 0:
        best = _descend(prob, best, set(grid[:ngrid]), ndesc)
    if best is None:
        best = run_pass(prob, Policy(admit="reserve"))
    if best is not None:
        best = polish_result(prob, _trim(prob, best, min(n, len(grid)) * njobs, budget_jobs), ls_budget)
    def done() -> bool:
        return target is not None and best is not None and best.makespan <= target + _EPS

    if _vlockstep.applies(prob) and njobs <= budget_jobs // 8 and not done():
        # the official ZB-V generator's lock-step construction (8 passes usually: 4 fill
        # variants x 2 refinements)
        lbest: PassResult | None = None
        for uniform in (False, True):  # built with the real costs, then with the chunk-mean costs (uneven only)
            for seqs, lpol in _vlockstep.candidates(prob, budget_jobs // 4, uniform_costs=uniform):
                r = result_of(prob, seqs, lpol)
                if r is not None and (lbest is None or _better(r, lbest, prob)):
                    lbest = r
        if lbest is not None:
            lbest = polish_result(prob, lbest, ls_budget)
            if best is None or _better(lbest, best, prob):
                best = lbest
    # (shapes above GRID_MAX_SHAPE jobs at 1F1B's memory or more skip them: there the greedy's order already
    # fits, and a block costs seconds: zbv pp 128, m 512, F/B/W 1/2/1, comm 0.5 at 1p 7.9 -> 2 s, the same plan)
    roomy = njobs > GRID_MAX_SHAPE and prob.limit >= prob.pp - _EPS
    if _vblock.applies(prob) and njobs <= budget_jobs // 4 and prob.limit < INF and not done() and not roomy:
        # building blocks with a fixed lifespan (the controllable-memory construction): they win at
        # budgets below 1p, where the greedy's memory-blind order leaves bubbles
        vbest: PassResult | None = None
        big = njobs > _vblock.EXACT_ORDER_MAX_JOBS
        for seqs, blk in _vblock.candidates(prob, budget_jobs // (8 if big else 4)):
            r = result_of(prob, seqs, blk)
            if r is not None and (vbest is None or _better(r, vbest, prob)):
                vbest = r
        if vbest is not None:
            # (pp 6, m 24, V-Min: 162 -> 161 needs ~200 swaps; big shapes get the greedy's own budget)
            vbest = polish_result(prob, vbest, ls_budget if big else 2 * ls_budget)
            if best is None or _better(vbest, best, prob):
                best = vbest
    # the candidate modules below, each polished like the others; skipped where the building blocks are, and on
    # shapes above an eighth of an explicit small budget (the tuner's sweep), as the lock-step passes
    # (above GRID_MAX_SHAPE jobs also where the best so far is within NEAR_BOUND of the proven bound: pp 128, m 512,
    # equal costs at 0.75p, 3264 against the bound 3263, the candidates cost 6 s for nothing; one unit more is worth
    # them: vmin pp 48, m 192, equal costs, 1338 -> 1337 = the bound and the official V-Min)
    near = (njobs > GRID_MAX_SHAPE and target is not None and best is not None
            and best.makespan <= target * (1 + NEAR_BOUND) + _EPS)
    for extra in EXTRA_CANDIDATES:
        if (extra.applies(prob) and prob.limit < INF and njobs <= budget_jobs // 8 and not done() and not roomy
                and not near):
            best = _best_of(prob, extra.candidates(prob, budget_jobs // 8), best, ls_budget)
    if best is None:
        return None
    evals = insert_budget // max(njobs, 1)
    if evals >= 1:
        seqs = insertion_search(prob, best.seqs, evals)
        r = result_of(prob, seqs, best.policy)
        if r is not None and r.makespan < best.makespan - _EPS:
            best = r
            best.improved = True
    return best


#: the extra candidates are skipped on big shapes whose best plan is already this close to the proven bound (0.05%)
NEAR_BOUND = 0.0005
#: candidate constructions for V placement under a memory limit, each a module with ``applies(prob)`` and
#: ``candidates(prob, max_jobs)`` (job lists and the policy that made them): one line per construction
EXTRA_CANDIDATES = (
    _paced,   # a periodic timetable as the priority of a memory-aware list scheduler
    _modulo,  # one microbatch's timetable repeated every period without collisions (modulo scheduling)
    _paper_blocks,  # the paper's V-Half / V-Min blocks squeezed under its own memory count
)


def _best_of(prob: Problem, cands, best: PassResult | None, ls_budget: int) -> PassResult | None:
    """``best`` or the best of the job lists ``cands`` (timed and checked by :func:`result_of`, the winner
    polished by the local search), whichever is better."""
    cbest: PassResult | None = None
    for seqs, pol in cands:
        r = result_of(prob, seqs, pol)
        if r is not None and (cbest is None or _better(r, cbest, prob)):
            cbest = r
    if cbest is not None:
        cbest = polish_result(prob, cbest, ls_budget)
        if best is None or _better(cbest, best, prob):
            return cbest
    return best


def _trim(prob: Problem, best: PassResult, spent: int, budget_jobs: int) -> PassResult:
    """Memory trimming: the same makespan and stage bubble under a tighter limit? (leaders; step = min a)"""
    njobs = 3 * prob.m * prob.nc
    step = min(prob.a) if prob.a else 0.0
    lo = min_feasible_limit(prob)
    while step > 0 and spent + len(_LEADERS) * njobs <= 2 * budget_jobs:
        lim = max(best.peak) - step
        if lim < lo - _EPS:
            break
        tighter = replace(prob, limit=lim)
        found = None
        for pol in _LEADERS:
            r = run_pass(tighter, pol)
            if (r is not None and r.makespan <= best.makespan + _EPS
                    and r.stage_bubble(prob) <= best.stage_bubble(prob) + 1e-6
                    and (found is None or _better(r, found, prob))):
                found = r
        spent += len(_LEADERS) * njobs
        if found is None:
            break
        best = found
    return best
