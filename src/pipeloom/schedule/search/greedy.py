"""Event-driven greedy list scheduler for B/W-split pipeline schedules (private helper, no torch).

Used by :mod:`pipeloom.schedule.zero_bubble` (ZB-H1/H2, one chunk per device) and
:mod:`pipeloom.schedule.v_shape` (ZB-V, V-Half, V-Min: V/zigzag placement, any vpp >= 2).

How one pass works
------------------
Time is simulated. The device whose clock is earliest decides next (a heap of device clocks),
so when it decides at time ``T`` every job that can be ready by ``T`` is known: any dependency
still unscheduled ends after ``T``. Candidates on a device are, per local chunk, the next
forward and the next input-grad backward (each chunk runs its F and its B in microbatch
order), plus the pending weight-grad jobs W (oldest B first). The pass is :class:`GreedyPolicy`
on the one list-scheduling loop (:func:`pipeloom.sim.listsched.run`): readiness (the rules of
:mod:`pipeloom.core.rules`, ``comm`` added on edges that cross devices) and memory come from its
board; the policy only chooses.

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

The pass is one of the search's candidates: :mod:`.portfolio` runs it over a grid of policies with the
other constructions and keeps the best; :mod:`.localsearch` re-times and improves finished job lists
with the timing kernel (:mod:`pipeloom.sim.kernel`).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from ...core.costs import Costs, MemModel
from ...core import rules
from ...core.ir import Job, Kind, Placement, device_of
from ...sim import kernel, listsched

from .accel import accelerated, ext as _accel
from ...core.rules import EPS as _EPS

__all__ = ["Problem", "make_problem", "min_feasible_limit", "Policy", "PassResult", "run_pass", "accelerated"]

INF = math.inf
_KF, _KB, _KW = Kind.F, Kind.B, Kind.W
_KINDS = (_KF, _KB, _KW)


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
    mem_tab: list[float] | None = field(default=None, compare=False, repr=False)
    """the list-scheduling board's memory table (:func:`pipeloom.sim.listsched.mem_table`; derived)"""
    handoff: list | None = field(default=None, compare=False, repr=False)
    """the board's handoff table (:func:`pipeloom.sim.listsched.handoff_table`; derived)"""
    memo: dict = field(default_factory=dict, init=False, compare=False, repr=False)
    """inputs of the compiled pass that depend only on the shape and two policy rules, made once per
    problem (the policy grid runs hundreds of passes on one problem)"""

    def __post_init__(self) -> None:  # derived again by every dataclasses.replace (e.g. other durations)
        object.__setattr__(self, "tables", kernel.Rules.make(self.pp, self.nc, self.placement, self.comm))
        object.__setattr__(self, "dur_table", kernel.duration_table(self.nc, self.dF, self.dB, self.dW))
        md = rules.memory_deltas(len(self.a), self.a, self.b)
        for name, k in (("mF", Kind.F), ("mB", Kind.B), ("mW", Kind.W)):
            object.__setattr__(self, name, tuple(md[k]))
        object.__setattr__(self, "mem_tab", listsched.mem_table(len(self.a), self.a, self.b))
        object.__setattr__(self, "handoff", listsched.handoff_table(self.tables))

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
    on: list[list[int]] = [[] for _ in range(pp)]
    for c in range(nc):  # one pass over the chunks (not one per device: quadratic at pp 65 536)
        on[dev[c]].append(c)
    local = tuple(tuple(x) for x in on)
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

    Runs :func:`_run_pass_py` (the specification) or, when built, its compiled form ``run_pass`` in
    ``_accel.c`` (the same policy on the compiled list-scheduling board, reading the same rule tables),
    which gives the identical result (tests/schedule/test_accel.py).
    """
    if accelerated():
        return _run_pass_c(prob, pol)
    return _run_pass_py(prob, pol)


def _pass_inputs(prob: Problem, pol: Policy):
    """Per-device admission caps and candidate orders of a pass (shared by both implementations)."""
    b_order, f_order, _, _ = _orders(prob, pol)
    return _caps(prob, pol), b_order, f_order


def _caps(prob: Problem, pol: Policy) -> list[float]:
    """Per device, the memory cap the pass admits forwards under (headroom taken off, never below one
    microbatch's need)."""
    return [max(min(pol.cap, prob.limit) - (pol.h0 + pol.h1 * d) * prob.a[loc[0]], prob.need[d]) + _EPS
            for d, loc in enumerate(prob.local)]


def _orders(prob: Problem, pol: Policy):
    """Per device its chunks in the policy's B order and F order, and both flattened (the compiled pass's
    form); they depend only on the shape and (b_late, f_late), so they are made once per problem."""
    key = (pol.b_late, pol.f_late)
    got = prob.memo.get(key)
    if got is None:
        b_order = [sorted(loc, reverse=pol.b_late) for loc in prob.local]
        f_order = [sorted(loc, reverse=pol.f_late) for loc in prob.local]
        got = prob.memo[key] = (b_order, f_order, [c for o in b_order for c in o], [c for o in f_order for c in o])
    return got


def _run_pass_c(prob: Problem, pol: Policy) -> PassResult | None:
    _, _, b_flat, f_flat = _orders(prob, pol)
    tables = prob.tables
    out = _accel.run_pass(
        (prob.pp, prob.vpp, prob.m, prob.limit + _EPS, _EPS),
        (tables.needs, tables.produces, prob.dur_table, prob.mem_tab, tables.dev, prob.handoff),
        ([loc[0] for loc in prob.local], _caps(prob, pol), prob.need, b_flat, f_flat),
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
    """The greedy pass in Python (the specification of the C version): :class:`GreedyPolicy` on the one
    list-scheduling loop (:func:`pipeloom.sim.listsched.run`)."""
    board = listsched.Board.for_problem(prob)
    if listsched.run(board, GreedyPolicy(prob, pol)) != 3 * prob.m * prob.nc:
        return None
    return PassResult(board.seqs, max(board.free), board.peak, pol, board.free, starts=board.starts,
                      order=board.order)


class GreedyPolicy:
    """The greedy pass's decisions (see the module docstring) as a policy of :func:`pipeloom.sim.listsched.run`.

    At its decision point ``T`` a device takes the first ready B of its chunks in the policy's order (B
    before F with ``b_first``), else the first ready F that the memory rule admits, else a pending W
    (oldest B first) when it fills the wait, else it asks again when the next known job is ready (or
    when fed). Readiness is :meth:`~pipeloom.sim.listsched.Board.ready` and memory the board's
    (:func:`pipeloom.core.rules.memory_delta`); this object keeps only the pass's counters: per chunk the
    next F and B microbatch, per device its W queue, forwards before the first B and the reservation.
    """

    __slots__ = ("m", "dW", "a", "mB", "mW", "limit", "capd", "reserve", "need", "b_first", "fill_always",
                 "look", "h_warm", "warm", "dF", "nf", "nb", "nfwd", "started_b", "resv", "pend", "bcand",
                 "fcand", "first", "sF", "sB", "sW")

    def __init__(self, prob: Problem, pol: Policy) -> None:
        nc = prob.nc
        self.m = prob.m
        self.dF, self.dW = prob.dF, prob.dW
        self.a, self.mB, self.mW = prob.mF, prob.mB, prob.mW  # memory rule (core.rules): F +a, B -b, W -(a-b)
        self.limit = prob.limit + _EPS
        capd, b_order, f_order = _pass_inputs(prob, pol)
        self.capd = capd
        self.reserve = pol.admit == "reserve"
        self.need = prob.need
        self.b_first = pol.b_first
        self.fill_always = pol.w_fill == "always"
        self.look = pol.lookahead
        self.h_warm = pol.h_warm
        self.warm = pol.warmup
        pp = prob.pp
        self.nf = [0] * nc
        self.nb = [0] * nc
        self.nfwd = [0] * pp      # forwards run before the device's first B (for the warm-up cap)
        self.started_b = [False] * pp
        self.resv = [0.0] * pp
        self.pend: list[deque] = [deque() for _ in range(pp)]
        self.sF, self.sB, self.sW = (kernel.KIND_INDEX[k] * nc for k in _KINDS)  # slots: kind index * nc + chunk
        self.first = first = [loc[0] for loc in prob.local]
        # per device, its local chunks in the policy's order: B (slot, chunk); F (slot, chunk, a, first local?)
        self.bcand = [tuple((self.sB + c, c) for c in order) for order in b_order]
        self.fcand = [tuple((self.sF + c, c, self.a[c], c == first[d]) for c in order) for d, order in enumerate(f_order)]

    def step(self, board: listsched.Board, d: int, T: float):
        ready = board.ready
        nf, nb = self.nf, self.nb
        # ---- backward candidates
        bc = -1
        rb = INF
        for slot, c in self.bcand[d]:
            mb = nb[c]
            if mb >= nf[c]:
                continue
            r = ready(slot, mb)
            if r < 0:
                continue
            if r <= T:
                bc = c
                break
            if r < rb:
                rb = r
        # ---- forward candidates
        fc = -1
        rf = INF
        blocked = False
        b_first = self.b_first
        if bc < 0 or not b_first:
            md = board.mem[d]
            m = self.m
            warm, reserve, limit = self.warm, self.reserve, self.limit
            started = self.started_b[d]
            for slot, c, ac, isfirst in self.fcand[d]:
                mb = nf[c]
                if mb >= m:
                    continue
                r = ready(slot, mb)
                if r < 0:
                    continue
                if isfirst:
                    if warm is not None and not started and self.nfwd[d] >= warm:
                        continue
                    if reserve:
                        ok = self.resv[d] + self.need[d] <= limit
                    else:
                        ok = md + ac <= (self.capd[d] if not self.h_warm or not started else limit)
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
            if self.look > 0.0 and rb - T < self.look * self.dF[fc]:
                rf = INF  # hold the device for the coming B (or fill it with a W that fits)
            else:
                kind, c = 0, fc
        if kind < 0:
            pw = self.pend[d]
            nxt = rb if rb < rf else rf
            if pw and (blocked or self.fill_always or nxt == INF or nxt - T >= self.dW[pw[0][1]] - _EPS):
                kind = 2
            elif nxt < INF and nxt > T:
                return nxt
            elif pw:
                kind = 2
            else:
                return INF  # sleep until a dependency is scheduled
        # ---- the chosen job (the board commits it)
        if kind == 0:
            mb = nf[c]
            nf[c] = mb + 1
            if self.reserve and c == self.first[d]:
                self.resv[d] += self.need[d]
            if not self.started_b[d]:
                self.nfwd[d] += 1
            return (self.sF + c, mb)
        if kind == 1:
            mb = nb[c]
            nb[c] = mb + 1
            self.resv[d] += self.mB[c]
            self.started_b[d] = True
            self.pend[d].append((mb, c))
            return (self.sB + c, mb)
        mb, c = self.pend[d].popleft()
        self.resv[d] += self.mW[c]
        return (self.sW + c, mb)

    def after(self, board: listsched.Board, d: int, end: float) -> float:
        return end

    def fed(self, board: listsched.Board, d: int, arrival: float, key: float) -> float:
        """a job on another device sent ``d`` an input: decide again when it arrives (not before ``d`` is free)"""
        t = board.free[d]
        k = arrival if arrival >= t else t
        return k if k < key else key


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
