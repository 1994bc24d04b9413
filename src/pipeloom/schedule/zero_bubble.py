"""Zero-bubble H schedules with the backward split into B and W: ZB-H1 and ZB-H2 (no torch).

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024). One chunk per device (vpp = 1).

* ``zbh1``: at 1F1B's activation memory (limit ``1p`` = pp units by default). Like 1F1B
  the device runs at most about pp-d forwards ahead, but the weight-grad W is postponed
  to fill the bubbles 1F1B leaves, which cuts the bubble to about a third of 1F1B's.
* ``zbh2``: at about twice that memory (``2p`` by default): more warm-up forwards and Ws
  pushed to the end, for close to zero bubble when m >= 2p.

Both honour ``--mem-limit`` when given (tighter or looser than the default). They are made by
the greedy list scheduler of :mod:`pipeloom.schedule.search.greedy` (insert a job only when the
device's memory plus the job's peak fits the limit; B before F; W fills idle gaps or is forced
by memory), over a grid of policies, keeping the smallest makespan. As a safety net the
1F1B order with its BW split into B then W is also a candidate: it has 1F1B's peak memory and
never a larger makespan than 1F1B, so ``zbh1`` is never slower than ``1f1b`` at equal memory.
"""
from __future__ import annotations

from ..core.ir import B, F, Job, Placement, W, make_schedule
from .registry import Option, PlanSpec, effective_limit, int_option, register
from ..core.errors import ScheduleError
from ..core.limits import MAX_SEARCH_BUDGET
from .search import greedy as _greedy, localsearch as _localsearch, portfolio as _portfolio

DEFAULT_BUDGET = 60_000


def _one_f_one_b_split(pp: int, m: int) -> list[list[Job]]:
    """1F1B (pp-d-1 warm-up forwards) with each BW written as B then W."""
    devs = []
    for d in range(pp):
        w = min(pp - d - 1, m)
        seq = [F(i, d) for i in range(w)]
        for i in range(m - w):
            seq += [F(w + i, d), B(i, d), W(i, d)]
        for i in range(m - w, m):
            seq += [B(i, d), W(i, d)]
        devs.append(seq)
    return devs


def plan_h(name: str, spec: PlanSpec):
    """Plan a one-chunk B/W-split schedule under the limit of :func:`~.registry.effective_limit` (``spec.mem_limit``,
    or the builder's declared default)."""
    pp, m = spec.pp, spec.microbatches
    if spec.vpp != 1:
        raise ScheduleError(f"schedule {name!r} takes vpp 1 (one chunk per device), got vpp={spec.vpp}")
    try:
        limit = effective_limit(name, spec)
        prob = _greedy.make_problem(pp, 1, m, Placement.INTERLEAVED, spec.costs, spec.mem, limit)
    except ValueError as e:
        raise ScheduleError(str(e)) from None
    budget = int_option(spec.options, "budget", DEFAULT_BUDGET, who=name)
    best = _portfolio.search(prob, budget)
    seqs, how = (best.seqs, "greedy") if best is not None else (None, None)
    # safety net: 1F1B with B/W split, when it fits the limit
    fb = _one_f_one_b_split(pp, m)
    fb_res = _localsearch.evaluate_seqs(prob, fb)
    if fb_res is not None and max(fb_res[1]) <= limit + 1e-9:
        if seqs is None or fb_res[0] < best.makespan - 1e-9:
            seqs, how = fb, "1f1b-split"
    if seqs is None:
        raise ScheduleError(f"{name}: no schedule found under the memory limit {limit:g} units")
    witness = best.order if how == "greedy" else None
    return make_schedule(name, pp, 1, m, Placement.INTERLEAVED, seqs, witness=witness, builder=name,
                         mem_limit=limit, source=how)


#: the options the ZB-H builders read
H_OPTIONS = (Option(name="budget", type="int", min=0, max=MAX_SEARCH_BUDGET, default=DEFAULT_BUDGET,
                    help="job placements for the greedy policy search"),)


@register("zbh1", description="ZB-H1: B/W split at 1F1B memory (default limit 1p), about 1/3 of 1F1B's bubble",
          vpp="1", memory_aware=True, options=H_OPTIONS, no_limit="1p (pp units)", default_limit=lambda pp: 1.0 * pp)
def zbh1(spec: PlanSpec):
    return plan_h("zbh1", spec)


@register("zbh2", description="ZB-H2: B/W split at about 2x 1F1B memory (default limit 2p), near-zero bubble",
          vpp="1", memory_aware=True, options=H_OPTIONS, no_limit="2p (2 pp units)", default_limit=lambda pp: 2.0 * pp)
def zbh2(spec: PlanSpec):
    return plan_h("zbh2", spec)
