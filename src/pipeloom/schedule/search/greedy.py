"""Event-driven greedy list scheduler for B/W-split pipeline schedules (private helper, no torch).

Used by :mod:`pipeloom.schedule.zero_bubble` (ZB-H1/H2, one chunk per device) and
:mod:`pipeloom.schedule.v_shape` (ZB-V, V-Half, V-Min: V/zigzag placement, any vpp >= 2).

How one pass works
------------------
Time is simulated. The device whose clock is earliest decides next (a heap of device clocks),
so when it decides at time ``T`` every job that can be ready by ``T`` is known: any dependency
still unscheduled ends after ``T``. Candidates on a device are, per local chunk, the next
forward and the next input-grad backward (each chunk runs its F and its B in microbatch
order), plus the pending weight-grad jobs W (oldest B first). The dependency rules are those
of :mod:`pipeloom.core.ir`; ``comm`` is added on edges that cross devices.

A :class:`Policy` decides among the ready candidates:

* B before F when both are ready (``b_first``) -- B is on the critical path and frees memory;
* an F only when ``memory + a(chunk) <= limit`` (seed 004: insert a job only if the device's
  current memory plus the job's peak fits the limit). A forward that starts a new
  microbatch on the device (its lowest local chunk) must also leave ``h0 + h1*d`` forwards'
  worth of headroom (kept for the microbatches already in flight; ``h_warm``: only during
  the warm-up, as the official ZB-V does), and fit the soft ``cap``. With
  ``admit="reserve"`` it must fit a banker's reservation of the memory the microbatch will
  need on all local chunks, which can never deadlock at any limit >= :func:`min_feasible_limit`;
* W only when no F/B is ready: it fills a bubble (``w_fill="fit"``: only if it ends before the
  next known ready job, ``"always"``: whenever idle), or it is forced when memory blocks a
  ready F. So W is postponed as long as memory allows, as ZB-H2 and ZB-V do;
* ``lookahead`` keeps a device free for a B that is due shortly instead of starting an F;
* ``warmup`` optionally caps how many forwards a device runs before its first B (the official
  ZB-V generator's cap); ``None`` = as many as memory allows (seed 000's improvement).

:func:`search` runs a grid of policies (the role of the official ``try_v_schedule(fill_f,
fill_b)`` variants, widened) within a deterministic work budget; for V placement with two
chunks per device it also takes the lock-step passes of :mod:`pipeloom.schedule.search.lockstep`
(the official ZB-V generator's construction, which wins where memory binds hardest, e.g. pp 4
at 1p with m >= 2pp). It keeps the schedule with the
smallest makespan (then stage bubble, then peak memory), tries to keep that makespan under
tighter memory limits ("memory trimming"), and finishes with a budgeted local search of
adjacent swaps (:func:`local_search`). Everything is deterministic: the same input gives the
same schedule on any machine.
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field, replace
from itertools import product

from ...core.costs import Costs, MemModel
from . import lockstep as _vlockstep
from . import vblock as _vblock
from ...core import rules
from ...core.errors import DeadlockError
from ...core.ir import Job, Kind, Placement, device_of, make_schedule
from ...sim import kernel
from ...sim.simulate import simulate

from .accel import accelerated, ext as _accel

INF = math.inf
_KF, _KB, _KW = Kind.F, Kind.B, Kind.W
_KINDS = (_KF, _KB, _KW)
_new = tuple.__new__  # Job is a NamedTuple: tuple.__new__(Job, ...) skips its __new__ wrapper (200k jobs at pp 64)
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Problem:
    """Shape, per-chunk durations and memory, and the hard memory limit (units, INF = none)."""

    pp: int
    vpp: int
    m: int
    placement: Placement
    dF: tuple[float, ...]
    dB: tuple[float, ...]
    dW: tuple[float, ...]
    comm: float
    a: tuple[float, ...]
    b: tuple[float, ...]
    limit: float
    # derived in make_problem
    dev: tuple[int, ...] = ()
    fcomm: tuple[float, ...] = ()
    bcomm: tuple[float, ...] = ()
    local: tuple[tuple[int, ...], ...] = ()
    need: tuple[float, ...] = ()
    """per device: memory one microbatch holds on it at its peak (sum of a over its chunks)"""
    tables: kernel.Rules | None = field(default=None, compare=False, repr=False)
    """the timing kernel's rule tables for this shape, placement and comm (derived)"""
    dur_table: list[float] | None = field(default=None, compare=False, repr=False)
    """the kernel's duration table (:func:`pipeloom.sim.kernel.duration_table`; derived)"""
    mF: tuple[float, ...] = field(default=(), compare=False, repr=False)
    """memory change of F per chunk (:func:`pipeloom.core.rules.memory_delta`: +a; derived)"""
    mB: tuple[float, ...] = field(default=(), compare=False, repr=False)
    """memory change of B per chunk (-b; derived)"""
    mW: tuple[float, ...] = field(default=(), compare=False, repr=False)
    """memory change of W per chunk (-(a-b); derived)"""

    def __post_init__(self) -> None:  # derived again by every dataclasses.replace (e.g. other durations)
        object.__setattr__(self, "tables", kernel.Rules.make(self.pp, self.nc, self.placement, self.comm))
        object.__setattr__(self, "dur_table", kernel.duration_table(self.nc, self.dF, self.dB, self.dW))
        md = rules.memory_deltas(len(self.a), self.a, self.b)
        for name, k in (("mF", Kind.F), ("mB", Kind.B), ("mW", Kind.W)):
            object.__setattr__(self, name, tuple(md[k]))

    @property
    def nc(self) -> int:
        return self.pp * self.vpp


def make_problem(pp: int, vpp: int, m: int, placement: Placement | str, costs: Costs, mem: MemModel,
                 limit: float | None) -> Problem:
    nc = pp * vpp
    dF, dB, dW = costs.per_chunk(nc)
    a, b = mem.per_chunk(nc, vpp)
    dev = tuple(device_of(c, pp, placement) for c in range(nc))
    comm = float(costs.comm)
    fcomm, bcomm = (tuple(x) for x in rules.edge_comm(pp, nc, placement, comm))
    local = tuple(tuple(c for c in range(nc) if dev[c] == d) for d in range(pp))
    need = tuple(sum(a[c] for c in local[d]) for d in range(pp))
    return Problem(pp, vpp, m, Placement(placement), tuple(dF), tuple(dB), tuple(dW), comm, tuple(a),
                   tuple(b), INF if limit is None else float(limit), dev, fcomm, bcomm, local, need)


def min_feasible_limit(prob: Problem) -> float:
    """Smallest memory limit any valid schedule can meet: ``max_d sum_{c on d} a(c)``.

    Why: a microbatch's B on chunk c needs its F on every later chunk, and F's activation
    on c is only released by B and W of c. So when a device runs the F of its last local chunk
    for some microbatch, that microbatch holds ``a`` on every local chunk of the device at once.
    The bound is met: run microbatches one after another (each through all chunks, W right
    after B), which is what the ``reserve`` policy degrades to at this limit.
    """
    return max(prob.need)


@dataclass(frozen=True, slots=True)
class Policy:
    """Tie-breaking rules of one greedy pass (see the module docstring)."""

    admit: str = "plain"
    """'plain' (memory + a <= limit) or 'reserve' (banker's reservation: never deadlocks)"""
    cap: float = INF
    """soft limit (units) for forwards that start a new microbatch on a device"""
    h0: float = 0.0
    """headroom kept free when starting a new microbatch, in units of that forward's a"""
    h1: float = 0.0
    """extra headroom per device index (device d keeps h0 + h1*d), as in ZB-H1's staggered peaks"""
    h_warm: bool = False
    """apply the headroom only before the device's first B (warm-up), not in the steady state"""
    b_first: bool = True
    """run a ready B before a ready F"""
    f_late: bool = True
    """among ready forwards prefer the higher chunk (finish in-flight microbatches)"""
    b_late: bool = True
    """among ready backwards prefer the higher chunk"""
    w_fill: str = "fit"
    """'fit': fill an idle gap with W only if it ends before the next known ready job; 'always'"""
    warmup: int | None = None
    """cap on forwards before the device's first B (None: as many as memory allows)"""
    lookahead: float = 0.0
    """keep the device free for a B due within lookahead x F(chunk) instead of starting an F"""


@dataclass(slots=True)
class PassResult:
    seqs: list[list[Job]]
    makespan: float
    peak: list[float]
    policy: Policy
    ends: list[float] = field(default_factory=list)
    improved: bool = False
    """True when the local search improved on the greedy pass"""
    starts: list[float] = field(default_factory=list)
    """start of each device's first job"""
    order: list[list[int]] | None = None
    """per job, the rank at which the greedy pass committed it: a topological order of the
    jobs that the validator checks instead of re-simulating (None for job lists made elsewhere)"""
    _sb: float | None = None

    def stage_bubble(self, prob: "Problem") -> float:
        """max over devices of idle inside the device's span / span (computed on demand)"""
        if self._sb is None:
            self._sb = _stage_bubble(prob, self.seqs, self.ends, self.starts) if self.starts else 0.0
        return self._sb

    def to_jobs(self) -> list[list[Job]]:
        return [list(seq) for seq in self.seqs]


def run_pass(prob: Problem, pol: Policy) -> PassResult | None:
    """One greedy pass; None if it deadlocks (memory full, nothing can run).

    Runs :func:`_run_pass_py` (the specification) or, when built, its C transcription in
    ``_accel.c``, which gives the identical result (tests/schedule/test_accel.py).
    """
    if accelerated():
        return _run_pass_c(prob, pol)
    return _run_pass_py(prob, pol)


def _pass_inputs(prob: Problem, pol: Policy):
    """Per-device admission caps and candidate orders of a pass (shared by both implementations)."""
    capd = [max(min(pol.cap, prob.limit) - (pol.h0 + pol.h1 * d) * prob.a[loc[0]], prob.need[d]) + _EPS
            for d, loc in enumerate(prob.local)]
    b_order = [sorted(loc, reverse=pol.b_late) for loc in prob.local]
    f_order = [sorted(loc, reverse=pol.f_late) for loc in prob.local]
    return capd, b_order, f_order


def _run_pass_c(prob: Problem, pol: Policy) -> PassResult | None:
    capd, b_order, f_order = _pass_inputs(prob, pol)
    out = _accel.run_pass(
        (prob.pp, prob.vpp, prob.m, prob.limit + _EPS, _EPS),
        (prob.dF, prob.dB, prob.dW, prob.fcomm, prob.bcomm, prob.mF, prob.mB, prob.mW, prob.dev),
        ([loc[0] for loc in prob.local], capd, prob.need, [c for o in b_order for c in o],
         [c for o in f_order for c in o]),
        (pol.admit == "reserve", pol.b_first, pol.w_fill == "always", float(pol.lookahead), pol.h_warm,
         -1 if pol.warmup is None else int(pol.warmup)),
        Job, _KINDS)
    if out is None:
        return None
    seqs, order_bytes, t, peak, start0 = out
    per_dev = 3 * prob.m * prob.vpp
    ranks = memoryview(order_bytes).cast("q")
    order = [ranks[d * per_dev:(d + 1) * per_dev] for d in range(prob.pp)]
    return PassResult(seqs, max(t), peak, pol, t, starts=start0, order=order)


def _run_pass_py(prob: Problem, pol: Policy) -> PassResult | None:
    """The greedy pass in Python (the specification of the C version).

    The hot loop of every V/H builder (one iteration per job; 200k jobs at pp 64, m 512):
    per-chunk end-time lists and per-device candidate tuples are prepared up front so
    that the loop does no index arithmetic and no attribute lookups.
    """
    pp, m, nc = prob.pp, prob.m, prob.nc
    dF, dB, dW = prob.dF, prob.dB, prob.dW
    fcomm, bcomm = prob.fcomm, prob.bcomm
    a, mB, mW, dev = prob.mF, prob.mB, prob.mW, prob.dev  # memory rule (core.rules): F +a, B -b, W -(a-b)
    limit = prob.limit + _EPS
    capd, b_order, f_order = _pass_inputs(prob, pol)
    reserve = pol.admit == "reserve"
    need = prob.need
    first = [loc[0] for loc in prob.local]
    b_first = pol.b_first
    fill_always = pol.w_fill == "always"
    look = pol.lookahead
    h_warm = pol.h_warm
    start0 = [0.0] * pp  # start of the device's first job
    warm = pol.warmup
    last = nc - 1

    fe = [[-1.0] * m for _ in range(nc)]  # fe[c][mb]: end of F(mb, c), -1 = not run yet
    be = [[-1.0] * m for _ in range(nc)]  # be[c][mb]: end of B(mb, c)
    nf = [0] * nc
    nb = [0] * nc
    # per device, its local chunks in the policy's order with what their readiness reads:
    # B: (chunk, own F ends, next chunk's B ends or None for the last chunk, comm on that edge)
    bcand = [tuple((c, fe[c], be[c + 1] if c != last else None, bcomm[c])
                   for c in order) for order in b_order]
    # F: (chunk, previous chunk's F ends or None for chunk 0, comm on that edge, a, first local chunk?)
    fcand = [tuple((c, fe[c - 1] if c else None, fcomm[c], a[c], c == first[d])
                   for c in order) for d, order in enumerate(f_order)]
    t = [0.0] * pp
    mem = [0.0] * pp
    resv = [0.0] * pp
    peak = [0.0] * pp
    nfwd = [0] * pp      # forwards run before the device's first B (for the warm-up cap)
    started_b = [False] * pp
    pend: list[deque] = [deque() for _ in range(pp)]
    seqs: list[list[Job]] = [[] for _ in range(pp)]
    order: list[list[int]] = [[] for _ in range(pp)]
    sapp = [q.append for q in seqs]
    oapp = [q.append for q in order]
    KF, KB, KW = _KF, _KB, _KW
    new = _new
    key = [0.0] * pp     # when the device decides next (INF: asleep until a dependency is scheduled)
    heap = [(0.0, d) for d in range(pp)]  # entries (time, device); stale ones have time != key[device]
    total = 3 * m * nc
    ncommit = 0
    push = heapq.heappush
    pop = heapq.heappop
    pushpop = heapq.heappushpop
    item = pop(heap)
    while True:
        T, d = item
        if T != key[d]:
            if not heap:
                break
            item = pop(heap)
            continue
        # ---- backward candidates
        bc = -1
        rb = INF
        for c, fec, ben, bcm in bcand[d]:
            mb = nb[c]
            if mb >= nf[c]:
                continue
            r = fec[mb]
            if ben is not None:
                e = ben[mb]
                if e < 0:
                    continue
                e += bcm
                if e > r:
                    r = e
            if r <= T:
                bc = c
                break
            if r < rb:
                rb = r
        # ---- forward candidates
        fc = -1
        rf = INF
        blocked = False
        if bc < 0 or not b_first:
            md = mem[d]
            for c, fep, fcm, ac, isfirst in fcand[d]:
                mb = nf[c]
                if mb >= m:
                    continue
                if fep is None:
                    r = 0.0
                else:
                    r = fep[mb]
                    if r < 0:
                        continue
                    r += fcm
                if isfirst:
                    if warm is not None and not started_b[d] and nfwd[d] >= warm:
                        continue
                    if reserve:
                        ok = resv[d] + need[d] <= limit
                    else:
                        ok = md + ac <= (capd[d] if not h_warm or not started_b[d] else limit)
                else:
                    ok = reserve or md + ac <= limit
                if not ok:
                    if r <= T:
                        blocked = True
                    continue
                if r <= T:
                    fc = c
                    break
                if r < rf:
                    rf = r
        kind = -1
        if bc >= 0 and (b_first or fc < 0):
            kind, c = 1, bc
        elif fc >= 0:
            if look > 0.0 and rb - T < look * dF[fc]:
                rf = INF  # hold the device for the coming B (or fill it with a W that fits)
            else:
                kind, c = 0, fc
        if kind < 0:
            pw = pend[d]
            nxt = rb if rb < rf else rf
            if pw and (blocked or fill_always or nxt == INF or nxt - T >= dW[pw[0][1]] - _EPS):
                kind = 2
            elif nxt < INF and nxt > T:
                key[d] = nxt
                item = pushpop(heap, (nxt, d))
                continue
            elif pw:
                kind = 2
            else:
                key[d] = INF  # sleep until a dependency is scheduled
                if not heap:
                    break
                item = pop(heap)
                continue
        # ---- commit
        if kind == 0:
            mb = nf[c]
            nf[c] = mb + 1
            e = T + dF[c]
            fe[c][mb] = e
            md = mem[d] + a[c]
            mem[d] = md
            if md > peak[d]:
                peak[d] = md
            if reserve and c == first[d]:
                resv[d] += need[d]
            if not started_b[d]:
                nfwd[d] += 1
            if c != last:
                d2 = dev[c + 1]
                if d2 != d:
                    k = e + fcomm[c + 1]
                    if t[d2] > k:
                        k = t[d2]
                    if k < key[d2]:
                        key[d2] = k
                        push(heap, (k, d2))
            job = new(Job, (KF, mb, c))
        elif kind == 1:
            mb = nb[c]
            nb[c] = mb + 1
            e = T + dB[c]
            be[c][mb] = e
            mem[d] += mB[c]
            resv[d] += mB[c]
            started_b[d] = True
            pend[d].append((mb, c))
            if c:
                d2 = dev[c - 1]
                if d2 != d:
                    k = e + bcomm[c - 1]
                    if t[d2] > k:
                        k = t[d2]
                    if k < key[d2]:
                        key[d2] = k
                        push(heap, (k, d2))
            job = new(Job, (KB, mb, c))
        else:
            mb, c = pend[d].popleft()
            e = T + dW[c]
            fr = mW[c]
            mem[d] += fr
            resv[d] += fr
            job = new(Job, (KW, mb, c))
        if not seqs[d]:
            start0[d] = T
        sapp[d](job)
        oapp[d](ncommit)
        ncommit += 1
        t[d] = e
        key[d] = e
        item = pushpop(heap, (e, d))
    if ncommit != total:
        return None
    return PassResult(seqs, max(t), peak, pol, t, starts=start0, order=order)


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
    for w in range(1, 2 * prob.nc + 1):
        out.append(Policy(warmup=w))
    return out


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


def search(prob: Problem, budget_jobs: int = 60_000, ls_budget: int = 100_000,
           insert_budget: int = 0, grid_jobs: int | None = None) -> PassResult | None:
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
        best = _polish(prob, _trim(prob, best, min(n, len(grid)) * njobs, budget_jobs), ls_budget)
    if _vlockstep.applies(prob) and njobs <= budget_jobs // 8:
        # the official ZB-V generator's lock-step construction (8 passes usually: 4 fill
        # variants x 2 refinements)
        lbest: PassResult | None = None
        for uniform in (False, True):  # built with the real costs, then with the chunk-mean costs (uneven only)
            for seqs, lpol in _vlockstep.candidates(prob, budget_jobs // 4, uniform_costs=uniform):
                r = result_of(prob, seqs, lpol)
                if r is not None and (lbest is None or _better(r, lbest, prob)):
                    lbest = r
        if lbest is not None:
            lbest = _polish(prob, lbest, ls_budget)
            if best is None or _better(lbest, best, prob):
                best = lbest
    if _vblock.applies(prob) and njobs <= budget_jobs // 4 and prob.limit < INF:
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
            vbest = _polish(prob, vbest, ls_budget if big else 2 * ls_budget)
            if best is None or _better(vbest, best, prob):
                best = vbest
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


def _polish(prob: Problem, best: PassResult, ls_budget: int) -> PassResult:
    """Adjacent-swap local search (:func:`local_search`) within ``ls_budget`` job re-timings."""
    evals = ls_budget // max(3 * prob.m * prob.nc, 1)
    if evals >= 20:
        seqs = local_search(prob, best.seqs, evals)
        r = result_of(prob, seqs, best.policy)
        if r is not None and r.makespan < best.makespan - _EPS:
            r.improved = True
            return r
    return best


def result_of(prob: Problem, seqs: list[list[Job]], policy) -> PassResult | None:
    """Time and check job lists made outside :func:`run_pass`; None on deadlock or over the limit."""
    r = time_seqs(prob, seqs, detail=True)
    if r is None:
        return None
    peak = _peaks(prob, seqs)
    if max(peak) > prob.limit + _EPS:
        return None
    return PassResult(seqs, r[0], peak, policy, r[2], starts=r[3])


def _peaks(prob: Problem, seqs) -> list[float]:
    table = rules.memory_deltas(prob.nc, prob.a, prob.b)
    return [rules.peak_memory(seq, prob.a, prob.b, table)[0] for seq in seqs]


def _stage_bubble(prob: Problem, seqs, ends, starts) -> float:
    durs = {_KF: prob.dF, _KB: prob.dB, _KW: prob.dW}
    out = 0.0
    for d, seq in enumerate(seqs):
        span = ends[d] - starts[d]
        if span > 0:
            loc = prob.local[d]
            if len(seq) == 3 * prob.m * len(loc):  # every job of the device: its busy time is fixed
                busy = prob.m * sum(prob.dF[c] + prob.dB[c] + prob.dW[c] for c in loc)
            else:
                busy = sum(durs[k][c] for k, _, c in seq)
            out = max(out, (span - busy) / span)
    return out


def _better(r: PassResult, best: PassResult, prob: Problem) -> bool:
    """Smaller makespan, then smaller stage bubble, then smaller peak memory."""
    if r.makespan < best.makespan - _EPS:
        return True
    if r.makespan > best.makespan + _EPS:
        return False
    sr, sb = r.stage_bubble(prob), best.stage_bubble(prob)
    if sr < sb - 1e-6:
        return True
    if sr > sb + 1e-6:
        return False
    return max(r.peak) < max(best.peak) - _EPS


def evaluate_seqs(prob: Problem, seqs: list[list[Job]]) -> tuple[float, list[float]] | None:
    """(makespan, per-device peak memory) of job lists under ``prob`` with pipeloom's simulator; None on deadlock."""
    sched = make_schedule("tmp", prob.pp, prob.vpp, prob.m, prob.placement,
                          seqs)
    costs = Costs(F=prob.dF, B=prob.dB, W=prob.dW, comm=prob.comm)
    try:
        r = simulate(sched, costs, MemModel(a=prob.a, b=prob.b))
    except DeadlockError:
        return None
    return r.makespan, r.peak_memory


def time_seqs(prob: Problem, seqs: list[list[Job]], detail: bool = False):
    """(makespan, sum of job ends) of job lists timed by the kernel (:func:`pipeloom.sim.kernel.time_order`,
    the simulator's rules); None on deadlock.

    With ``detail``: (makespan, sum of ends, per-device end of the last job, per-device start
    of the first job).
    """
    try:
        tm = kernel.time_order(seqs, prob.m, prob.tables, durations=prob.dur_table)
    except DeadlockError:
        return None
    if detail:
        return (tm.makespan, tm.total, [e[-1] if e else 0.0 for e in tm.end],
                [s[0] if s else 0.0 for s in tm.start])
    return tm.makespan, tm.total


def local_search(prob: Problem, seqs: list[list[Job]], max_evals: int) -> list[list[Job]]:
    """Improve job lists by adjacent swaps on a device (first improvement on (makespan, sum of ends)).

    A swap is tried only when the two jobs do not depend on each other and the device's
    memory stays within the limit; each candidate is re-timed with :func:`time_seqs`.
    """
    limit = prob.limit + _EPS
    seqs = [list(s) for s in seqs]
    cur = time_seqs(prob, seqs)
    if cur is None:
        return seqs
    evals = 0

    table = rules.memory_deltas(prob.nc, prob.a, prob.b)

    def delta(job):
        k, _, c = job
        return table[k][c]

    improved = True
    while improved and evals < max_evals:
        improved = False
        for d in range(prob.pp):
            seq = seqs[d]
            memv = 0.0
            for i in range(1, len(seq)):
                x, y = seq[i - 1], seq[i]
                memv_before = memv
                memv += delta(x)
                if x[1] == y[1] and (x[2] == y[2] or (x[0] == y[0] and abs(x[2] - y[2]) == 1)):
                    continue  # same microbatch and a chain dependency (F->B->W, F->F, B->B)
                if memv_before + delta(y) > limit:
                    continue
                seq[i - 1], seq[i] = y, x
                evals += 1
                r = time_seqs(prob, seqs)
                if r is not None and (r[0] < cur[0] - _EPS or (r[0] < cur[0] + _EPS and r[1] < cur[1] - _EPS)):
                    cur = r
                    improved = True
                    memv = memv_before + delta(y)
                else:
                    seq[i - 1], seq[i] = x, y
                if evals >= max_evals:
                    break
            if evals >= max_evals:
                break
    return seqs


def insertion_search(prob: Problem, seqs: list[list[Job]], max_evals: int, window: int = 8) -> list[list[Job]]:
    """Improve job lists by moving one job up to ``window`` places earlier or later on its device.

    First improvement on (makespan, sum of job ends), re-timed with :func:`time_seqs`; a move
    is tried only when the device's running memory stays within the limit. Wider than the
    adjacent swaps of :func:`local_search` (a move is a chain of swaps whose intermediate steps
    may be worse), and slower: opt-in via the ``insert_budget`` option of the V-shape builders.
    Deterministic (fixed scan order).
    """
    limit = prob.limit + _EPS
    seqs = [list(s) for s in seqs]
    cur = time_seqs(prob, seqs)
    if cur is None:
        return seqs

    table = rules.memory_deltas(prob.nc, prob.a, prob.b)

    def delta(job):
        k, _, c = job
        return table[k][c]

    def fits(seq):
        m = 0.0
        for job in seq:
            m += delta(job)
            if m > limit:
                return False
        return True

    evals = 0
    improved = True
    while improved and evals < max_evals:
        improved = False
        for d in range(prob.pp):
            seq = seqs[d]
            n = len(seq)
            for i in range(n):
                for j in range(max(0, i - window), min(n, i + window + 1)):
                    if j == i:
                        continue
                    x = seq.pop(i)
                    seq.insert(j, x)
                    if not fits(seq):
                        seq.pop(j)
                        seq.insert(i, x)
                        continue
                    evals += 1
                    r = time_seqs(prob, seqs)
                    if r is not None and (r[0] < cur[0] - _EPS or (r[0] < cur[0] + _EPS and r[1] < cur[1] - _EPS)):
                        cur = r
                        improved = True
                    else:
                        seq.pop(j)
                        seq.insert(i, x)
                    if evals >= max_evals:
                        return seqs
    return seqs
