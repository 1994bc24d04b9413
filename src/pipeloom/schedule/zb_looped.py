"""Zero-bubble schedules for looped (interleaved) placement under a memory limit: ``zbvpp`` (no torch).

Looped placement: device d holds chunks d, d+pp, d+2pp, ... (the placement of Megatron's
interleaved 1F1B, of torch's ``ScheduleInterleavedZeroBubble`` and of ZB-VPP in Qi et al., *Zero
Bubble Pipeline Parallelism*, ICLR 2024). The backward is split into B (input grad) and W (weight
grad); W fills the bubbles. Any vpp >= 2, any m, any memory limit at or above the floor
``max_d sum_{c on d} a(c)`` (one microbatch's activations on all local chunks of a device).

A portfolio of candidates, each a valid schedule under the limit, the shortest kept:

1. the greedy list scheduler of :mod:`pipeloom.schedule.search.greedy` over its policy grid
   (it takes any placement; its ``reserve`` policy cannot deadlock at any feasible limit);
2. *template passes* (:func:`template_pass`): the interleaved 1F1B order of forwards and input-grad
   backwards (microbatch groups of pp, local chunks in turn, a warm-up of
   ``(vpp-1)*g + k*(pp-1-d) + e`` forwards on device d) is kept as a fixed F/B order, and the Ws are
   placed by an event-driven pass: a W runs when the next F/B is not ready and the W fits in the wait,
   when the next forward would exceed the memory limit, or when more than ``lag`` Ws are pending
   (``lag`` 0 = W right after its B, as in ZB-H1). Warm-up lengths that do not fit the limit are
   shortened by the pass itself (a forward over the limit waits for the Ws, or the pass fails and
   the candidate is dropped). ``k = 1, e = 1, lag = device index`` is the construction of torch's
   ``ScheduleInterleavedZeroBubble``; ``k = 2, e = 0`` Megatron's warm-up. The pass runs compiled
   (``template_pass`` in ``_accel.c``, :class:`TemplatePolicy` on the C board) when the extension is built,
   else :func:`template_pass_py` (the specification; tests/schedule/test_template_c.py: identical results);
3. the best of those, improved by the adjacent-swap and insertion local searches of
   :mod:`.search.localsearch` (re-timed, memory-checked) and, for shapes of at most
   ``DEFAULT_POLISH_MAX_JOBS`` jobs, by the CP-SAT polish of :mod:`.search.polish` (deterministic time; option ``polish``, which
   up to ``LNS_MAX_JOBS`` jobs runs the tail-window search).

Every candidate is checked for the memory limit and timed with the simulator's rules; the result is
deterministic. For shapes of at most ``BOUND_MAX_JOBS`` jobs ``meta['lower_bound']`` holds the proven
makespan lower bound of :func:`pipeloom.schedule.search.bounds.lower_bound` under the limit.

Default limit (``mem_limit`` None): ``1p`` (pp units, 1F1B's peak), raised to the floor where that
is higher (never, with the default memory model).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from ..core.errors import ScheduleError
from ..core import rules
from ..core.limits import MAX_SEARCH_BUDGET, MAX_SOLVER_SECONDS
from ..core.ir import Job, Kind, Placement, make_schedule
from ..sim import listsched
from ..sim.kernel import KIND_INDEX, KINDS, accelerated, ext
from .classic import microbatch_groups
from .registry import EFFORT_OPTION, Option, PlanSpec, effective_limit, effort_option, int_option, register
from .search import greedy as _greedy, localsearch as _localsearch, portfolio as _portfolio
from ..core.rules import EPS as _EPS

_KF, _KB, _KW = Kind.F, Kind.B, Kind.W
_new = tuple.__new__  # Job is a NamedTuple: tuple.__new__(Job, ...) skips its __new__ wrapper
INF = float("inf")
_W_SLOT = KIND_INDEX[Kind.W]  # a W job of chunk c is slot _W_SLOT * nc + c on the list-scheduling board

#: default greedy work budget (job placements over all greedy policies)
DEFAULT_BUDGET = 60_000
#: default work budget of the template passes (job placements over all of them)
DEFAULT_TEMPLATE_BUDGET = 30_000
#: default work budget of the cool-down variants (:func:`pull_candidates`, job placements over all of them)
DEFAULT_PULL_BUDGET = 60_000
#: the ``pull`` values tried, in turn (those below the last microbatch group's size)
PULLS = (1, 2, 3, 4, 6, 8, 12)
#: job re-timings of the adjacent-swap local search on the best candidate
DEFAULT_LS_BUDGET = 100_000
#: job re-timings of the insertion local search (shapes up to INSERT_MAX_JOBS jobs)
DEFAULT_INSERT_BUDGET = 100_000
INSERT_MAX_JOBS = 400
#: shapes (jobs) that get the lower bound in ``meta['lower_bound']``
BOUND_MAX_JOBS = 5_000
#: shapes (jobs) that get the CP-SAT polish by default (DEFAULT_POLISH deterministic seconds: 0.1-0.3 s of
#: CPU on pp 4, m 4), the largest ones where ``polish`` runs the full model, and above that, up to
#: LNS_MAX_JOBS, the tail-window search (only when asked for)
DEFAULT_POLISH_MAX_JOBS = 100
DEFAULT_POLISH = 0.05
POLISH_MAX_JOBS = 200
LNS_MAX_JOBS = 400


@dataclass(frozen=True, slots=True)
class Template:
    """One template pass: warm-up ``(vpp-1)*g + k*(pp-1-d) + e`` forwards, Ws per ``lag`` and ``fill``."""

    k: int = 1
    e: int = 1
    lag: str | int = "dev"
    """pending Ws allowed before one is forced: an int, 'dev' (the device index, as torch does) or 'none'"""
    fill: str = "fit"
    """'fit': a W fills a wait only if it ends before the next F/B is ready; 'always': any wait"""
    pull: int = 0
    """in the last microbatch group, the first ``pull`` backwards of each lower local chunk run right after
    the backward ``pull`` places before the end of the chunk above (see :func:`fb_order`)"""


def _groups(m: int, pp: int) -> list[list[int]]:
    """The microbatch groups of the interleaved order (one group of all of them when m < pp)."""
    return microbatch_groups(m, pp) if m >= pp else [list(range(m))]


def fb_order(pp: int, vpp: int, m: int, d: int, warmup: int, pull: int = 0) -> list[Job]:
    """Device ``d``'s interleaved 1F1B order of F and B (no W) with ``warmup`` forwards first.

    ``pull`` > 0 reorders the cool-down: in the last microbatch group g_0..g_{n-1}, the backward of
    g_i on local chunk v runs right after that of g_{n-1-pull+i} on chunk v+1 (i < pull), instead of
    after all of chunk v+1's. Those microbatches then start down the lower chunks while the group's
    last ones still come back up, so the devices have backward work in the cool-down's waits.
    """
    fwd, bwd = _fb_jobs(pp, vpp, m, d)
    w = max(0, min(warmup, len(fwd)))
    n = len(fwd) - w
    seq = list(fwd[:w])
    mid = [None] * (2 * n)  # F and B in turn after the warm-up
    mid[0::2] = fwd[w:]
    mid[1::2] = bwd[:n]
    seq += mid
    seq += bwd[n:]
    g = _groups(m, pp)[-1]
    chunks = [d + v * pp for v in range(vpp)]
    x = min(pull, len(g) - 1)
    if x > 0:
        for v in reversed(range(vpp - 1)):
            for i in range(x):
                lo, hi = Job(_KB, g[i], chunks[v]), Job(_KB, g[len(g) - 1 - x + i], chunks[v + 1])
                seq.remove(lo)
                seq.insert(seq.index(hi) + 1, lo)
    return seq


@lru_cache(maxsize=256)
def _fb_jobs(pp: int, vpp: int, m: int, d: int) -> tuple[tuple[Job, ...], tuple[Job, ...]]:
    """Device ``d``'s forwards and backwards in the interleaved order (made once per shape: every template
    pass of a plan interleaves the same jobs)."""
    groups = _groups(m, pp)
    chunks = [d + v * pp for v in range(vpp)]
    fwd = tuple(_new(Job, (_KF, mb, chunks[v])) for g in groups for v in range(vpp) for mb in g)
    bwd = tuple(_new(Job, (_KB, mb, chunks[v])) for g in groups for v in reversed(range(vpp)) for mb in g)
    return fwd, bwd


def warmups(prob, tpl: Template) -> list[int]:
    """Warm-up forwards per device of template ``tpl`` (first group size g, see :class:`Template`)."""
    g = min(prob.m, prob.pp)
    return [(prob.vpp - 1) * g + tpl.k * (prob.pp - 1 - d) + tpl.e for d in range(prob.pp)]


def template_pass(prob, orders: list[list[Job]], tpl: Template) -> _greedy.PassResult | None:
    """Keep each device's F/B ``orders`` and place the Ws (see the module docstring); None if it deadlocks.

    Event-driven: :class:`TemplatePolicy` on the one list-scheduling loop (:func:`pipeloom.sim.listsched.run`):
    the device with the earliest decision acts, so a dependency it does not see yet ends after its clock.
    Start times follow the simulator's rules (the board's readiness: inputs ready + comm on cross-device
    edges), and ``order`` (commit ranks) is a topological witness. Runs the compiled ``template_pass`` of
    ``_accel.c`` (the same policy on the C board) when the extension is built, else :func:`template_pass_py`
    (the specification; identical results: tests/schedule/test_template_c.py). ``orders`` is not changed
    (the Python form reorders it where the limit cuts a warm-up short).
    """
    t = prob.tables
    if not accelerated() or not any(ev == rules.ACT for ns in t.needs for ev, _o, _c in ns):
        return template_pass_py(prob, [list(o) for o in orders], tpl)  # (no job reads ACT: only Python's board
        # records it, and the reorder of a blocked warm-up reads it)
    nc = prob.nc
    kb = {k: i * nc for k, i in KIND_INDEX.items()}  # (F and B, all a template holds, without hashing a Kind)
    flat = [[x for k, mb, c in o for x in ((c if k is _KF else nc + c if k is _KB else kb[k] + c), mb)]
            for o in orders]
    out = ext.template_pass((prob.pp, prob.m, prob.limit + _EPS, _EPS, tpl.fill == "always"),
                            t.needs, t.produces, prob.dur_table, prob.mem_tab, t.dev, listsched.handoff_table(t),
                            flat, [float(_lag(tpl.lag, d)) for d in range(prob.pp)], Job, KINDS)
    if out is None:
        return None
    seqs, order_bytes, free, peak, starts, per_dev = out
    ranks = memoryview(order_bytes).cast("q")
    order = [ranks[d * per_dev:d * per_dev + len(seqs[d])] for d in range(prob.pp)]
    return _greedy.PassResult(seqs, max(free), peak, tpl, free, starts=starts, order=order)


def template_pass_py(prob, orders: list[list[Job]], tpl: Template) -> _greedy.PassResult | None:
    """:func:`template_pass` in Python: :class:`TemplatePolicy` on the list-scheduling loop (the specification).
    Changes ``orders`` where the limit cuts a warm-up short."""
    board = listsched.Board.for_problem(prob)
    pol = TemplatePolicy(prob, orders, tpl)
    keys = [pol.decide(board, d) for d in range(prob.pp)]
    if listsched.run(board, pol, keys) != 3 * prob.m * prob.nc:
        return None  # deadlock
    return _greedy.PassResult(board.seqs, max(board.free), board.peak, tpl, list(board.free), starts=board.starts,
                              order=board.order)


class TemplatePolicy:
    """The template pass's decisions as a policy of :func:`pipeloom.sim.listsched.run`: each device's next step
    is decided as soon as what it depends on changes (its own commit, an input from another device) and kept
    until the loop reaches its time: the next job of its fixed F/B order, or a pending W (when more than
    ``lag`` are pending, when the job is not ready and the W fits in the wait, or when the next forward
    would exceed the limit; a forward the limit blocks with no W to run lets the next B whose forward ran
    go first)."""

    __slots__ = ("orders", "nc", "limit", "ptr", "pend", "phead", "lags", "always", "acts", "kbase", "wbase")

    def __init__(self, prob, orders: list[list[Job]], tpl: Template) -> None:
        pp = prob.pp
        self.orders = orders
        self.nc = prob.nc
        self.limit = prob.limit + _EPS
        self.ptr = [0] * pp
        self.pend: list[list[tuple[int, int]]] = [[] for _ in range(pp)]
        self.phead = [0] * pp
        self.lags = [_lag(tpl.lag, d) for d in range(pp)]
        self.always = tpl.fill == "always"
        self.acts: list[tuple[float, str] | None] = [None] * pp
        self.kbase = {k: i * prob.nc for k, i in KIND_INDEX.items()}  # a job's board slot: kbase[kind] + chunk
        self.wbase = self.kbase[_KW]

    def decide(self, board: listsched.Board, d: int, _end: float = 0.0, _key: float = 0.0) -> float:
        """Decide device d's next step (``acts[d]``: (time, 'w' or 'j'), None while it can decide nothing); its
        time (INF: none). It is also the loop's ``after`` and ``fed``: d decides again whenever its own job
        ends or an input reaches it."""
        acts = self.acts
        npend = len(self.pend[d]) - self.phead[d]
        seq = self.orders[d]
        ptr = self.ptr[d]
        T = board.free[d]
        if ptr >= len(seq):
            if npend:
                acts[d] = (T, "w")
                return T
            acts[d] = None
            return INF
        job = seq[ptr]
        slot = self.kbase[job[0]] + job[2]
        if job[0] is _KF and not board.admits(d, slot, self.limit):
            if npend:
                acts[d] = (T, "w")
                return T
            # nothing to free memory with: bring the next B whose F has run forward (a warm-up
            # the limit cuts short), else the device is stuck
            j = _next_b(seq, ptr, board)
            if j < 0:
                acts[d] = None
                return INF
            seq.insert(ptr, seq.pop(j))
            job = seq[ptr]
            slot = self.kbase[job[0]] + job[2]
        r = board.ready(slot, job[1])
        if r < 0:
            r = INF
        if npend and (npend > self.lags[d] or r > T and (
                self.always or r == INF
                or r - T >= board.dur[self.wbase + self.pend[d][self.phead[d]][1]] - _EPS)):
            acts[d] = (T, "w")
            return T
        if r <= T:
            acts[d] = (T, "j")
            return T
        if r < INF:
            acts[d] = (r, "j")
            return r
        acts[d] = None
        return INF

    after = fed = decide

    def step(self, board: listsched.Board, d: int, T: float):
        _t, kind = self.acts[d]
        if kind == "w":
            mb, c = self.pend[d][self.phead[d]]
            self.phead[d] += 1
            return (self.wbase + c, mb)
        job = self.orders[d][self.ptr[d]]
        self.ptr[d] += 1
        k, mb, c = job
        if k is _KB:
            self.pend[d].append((mb, c))
        return (self.kbase[k] + c, mb)


def _lag(lag, d: int) -> float:
    """Pending Ws device ``d`` may hold before one is forced (see :attr:`Template.lag`)."""
    if lag == "none":
        return INF
    if lag == "dev":
        return d
    return int(lag)


def _next_b(seq: list[Job], i: int, board: listsched.Board) -> int:
    """Index of the first B at or after ``i`` in ``seq`` whose forward has run, or -1."""
    for j in range(i, len(seq)):
        k, mb, c = seq[j]
        if k is _KB:
            return j if board.done[rules.ACT * board.mnc + mb * board.nc + c] >= 0 else -1
    return -1


#: the template passes that won most often over 576 shapes (pp 2-8, vpp 2-3, m pp..4pp, four cost sets,
#: both memory models, limits 0.5p-1.5p), in that order; torch's construction first
_LEAD_TEMPLATES = (
    Template(1, 1, "dev", "fit"), Template(1, 0, "dev", "fit"), Template(2, 0, "dev", "fit"),
    Template(2, 0, "none", "always"), Template(2, 1, "none", "always"), Template(1, 2, "dev", "fit"),
    Template(2, 1, "none", "fit"), Template(2, 0, "none", "fit"), Template(2, 2, "none", "fit"),
    Template(2, 2, "none", "always"), Template(1, 2, "none", "fit"), Template(1, 1, "none", "fit"),
)


#: the template whose cool-down variants are tried besides the best template's (it won most often with a pull)
PULL_BASE = Template(1, 0, "none", "fit")


def template_grid() -> list[Template]:
    """The template passes tried, most useful first (:data:`_LEAD_TEMPLATES`, then the rest of the grid)."""
    out = list(_LEAD_TEMPLATES)
    for k in (1, 2):
        for e in (0, 1, 2, 3):
            for lag in ("dev", "none", 1, 0):
                for fill in ("fit", "always"):
                    t = Template(k, e, lag, fill)
                    if t not in out:
                        out.append(t)
    return out


def _units(x: float, pp: int) -> str:
    return f"{x:g} units ({x / pp:.3g}p)"


def template_candidates(prob, budget: int) -> list[_greedy.PassResult]:
    """The template passes of :func:`template_grid` within ``budget`` job placements (at least one
    pass), those that finish within the limit."""
    return _template_results(prob, template_grid()[:max(1, budget // max(3 * prob.m * prob.nc, 1))])


def pull_candidates(prob, bases: list[Template], budget: int) -> list[_greedy.PassResult]:
    """The cool-down variants (:attr:`Template.pull` in :data:`PULLS`) of the templates ``bases`` within
    ``budget`` job placements, those that finish within the limit."""
    last = len(_groups(prob.m, prob.pp)[-1])
    tpls = [replace(b, pull=x) for x in PULLS if x < last for b in dict.fromkeys(bases)]
    return _template_results(prob, tpls[:budget // max(3 * prob.m * prob.nc, 1)])


def _template_results(prob, tpls) -> list[_greedy.PassResult]:
    """The passes of the templates ``tpls`` that finish within the limit."""
    out = []
    for tpl in tpls:
        orders = [fb_order(prob.pp, prob.vpp, prob.m, d, w, tpl.pull) for d, w in enumerate(warmups(prob, tpl))]
        r = template_pass(prob, orders, tpl)
        if r is not None and max(r.peak) <= prob.limit + _EPS:
            out.append(r)
    return out


def plan_looped(name: str, spec: PlanSpec):
    """Plan a looped-placement B/W-split schedule for ``spec`` (see the module docstring)."""
    pp, vpp, m = spec.pp, spec.vpp, spec.microbatches
    if vpp < 2:
        raise ScheduleError(f"schedule {name!r} needs vpp >= 2 (looped placement, chunks d, d+pp, ... on "
                            f"device d; for one chunk per device use zbh1 or zbh2), got vpp={vpp}")
    try:
        limit = effective_limit(name, spec)
        prob = _greedy.make_problem(pp, vpp, m, Placement.INTERLEAVED, spec.costs, spec.mem, limit)
    except ValueError as e:
        raise ScheduleError(str(e)) from None
    how = "default 1p" if spec.mem_limit is None else "given"
    budget = int_option(spec.options, "budget", DEFAULT_BUDGET, who=name)
    tbudget = int_option(spec.options, "template_budget", DEFAULT_TEMPLATE_BUDGET, who=name)
    pbudget = int_option(spec.options, "pull_budget", DEFAULT_PULL_BUDGET, who=name)
    njobs = 3 * m * pp * vpp
    best, source = _portfolio.search(prob, budget, ls_budget=DEFAULT_LS_BUDGET), "greedy"
    tbest = None
    for r in template_candidates(prob, tbudget):
        if tbest is None or _greedy._better(r, tbest, prob):
            tbest = r
    bases = ([tbest.policy] if tbest is not None else []) + [PULL_BASE]
    for r in pull_candidates(prob, bases, pbudget):
        if tbest is None or _greedy._better(r, tbest, prob):
            tbest = r
    if tbest is not None:
        tbest = _localsearch.polish_result(prob, tbest, DEFAULT_LS_BUDGET)
        if best is None or _greedy._better(tbest, best, prob):
            best, source = tbest, "template"
    if best is None:  # cannot happen: the greedy's 'reserve' policy never deadlocks at a feasible limit
        raise ScheduleError(f"{name}: no schedule found under the memory limit {_units(limit, pp)}")
    seqs, witness = best.seqs, best.order
    if njobs <= INSERT_MAX_JOBS:
        moved = _localsearch.insertion_search(prob, [list(q) for q in seqs], DEFAULT_INSERT_BUDGET // njobs)
        r = _localsearch.result_of(prob, moved, best.policy)
        if r is not None and r.makespan < best.makespan - _EPS:
            best, seqs, witness = r, r.seqs, None
    meta = {"builder": name, "mem_limit": limit, "limit_from": how, "source": source,
            "policy": _policy_text(best.policy)}
    det = _polish_budget(spec, njobs, effort_option(spec) == "high")
    pspec = replace(spec, mem_limit=limit)
    if det == 0:
        if njobs <= BOUND_MAX_JOBS and spec.options.get("bound", True) is not False:
            from .search.bounds import lower_bound

            meta["lower_bound"] = lower_bound(pspec, Placement.INTERLEAVED).value
        return make_schedule(name, pp, vpp, m, Placement.INTERLEAVED, seqs, witness=witness, **meta)
    from .search import polish as _polish  # CP-SAT machinery: only for shapes small enough to polish

    sched = make_schedule(name, pp, vpp, m, Placement.INTERLEAVED, seqs)
    res = (_polish.polish if njobs <= POLISH_MAX_JOBS else _polish.lns)(pspec, sched, det)
    meta["lower_bound"] = res.bound
    meta["polished"] = res.status
    if res.schedule is not None:
        meta["polished_from"] = res.makespan
        seqs, witness = res.schedule.devices, None
    return make_schedule(name, pp, vpp, m, Placement.INTERLEAVED, seqs, witness=witness, **meta)


def _polish_budget(spec: PlanSpec, njobs: int, high: bool = True) -> float:
    """CP-SAT deterministic seconds: of the polish up to POLISH_MAX_JOBS jobs (by default, with effort=high,
    DEFAULT_POLISH up to DEFAULT_POLISH_MAX_JOBS, else 0; with effort=fast 0), of the tail-window search up
    to LNS_MAX_JOBS (only when asked for)."""
    if "polish" not in spec.options:
        return DEFAULT_POLISH if high and njobs <= DEFAULT_POLISH_MAX_JOBS else 0.0
    x = float(spec.options["polish"])
    if x > 0 and njobs > LNS_MAX_JOBS:
        raise ScheduleError(f"zbvpp: option polish: the shape has {njobs} jobs; the polish runs on at most "
                            f"{LNS_MAX_JOBS} (e.g. pp 4, m 16, vpp 2); use polish=0 or a smaller shape")
    return x


def _policy_text(pol) -> str:
    return repr(pol)


#: the options ``zbvpp`` reads
OPTIONS = (
    Option(name="budget", type="int", min=0, max=MAX_SEARCH_BUDGET, default=DEFAULT_BUDGET,
           help="job placements for the greedy policy search"),
    Option(name="template_budget", type="int", min=0, max=MAX_SEARCH_BUDGET, default=DEFAULT_TEMPLATE_BUDGET,
           help="job placements for the template passes (at least one runs)"),
    Option(name="pull_budget", type="int", min=0, max=MAX_SEARCH_BUDGET, default=DEFAULT_PULL_BUDGET,
           help="job placements for the cool-down variants of the best template passes"),
    Option(name="bound", type="bool", default=True,
           help=f"compute the proven lower bound into the plan's meta (shapes of at most {BOUND_MAX_JOBS} jobs; "
                "about three quarters of a default plan's time; false skips it, e.g. in sweeps)"),
    Option(name="polish", type="float", min=0, max=MAX_SOLVER_SECONDS, default=None,
           help=f"CP-SAT deterministic seconds of polish on shapes of at most {LNS_MAX_JOBS} jobs (0 = off; "
                f"default with effort=high {DEFAULT_POLISH:g} up to {DEFAULT_POLISH_MAX_JOBS} jobs, else 0; above "
                f"{POLISH_MAX_JOBS} jobs a tail-window search)"),
    EFFORT_OPTION,
)


@register("zbvpp", description="ZB-VPP: looped (interleaved) placement, B/W split, any vpp >= 2, under the memory "
                               "limit (default 1p)",
          vpp=">=2", default_vpp=2, memory_aware=True, options=OPTIONS, placement=Placement.INTERLEAVED,
          no_limit="1p (pp units)", default_limit=lambda pp: 1.0 * pp)
def zbvpp(spec: PlanSpec):
    return plan_looped("zbvpp", spec)
