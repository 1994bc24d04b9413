"""Paced list scheduling: a periodic timetable as the priority of a memory-aware list scheduler (no torch).

A candidate of the portfolio (:mod:`.portfolio`) for the shapes where the greedy's rules fail: deep V
pipelines with uneven costs (B about 2F, comm) at memory limits below 1F1B's.

The timetable. Microbatch 0 runs as soon as possible along its dependency chain (forwards down and up the
V, then the backwards back): ``base(k, c)`` is the start of its job of kind ``k`` on chunk ``c``.
Microbatch ``j`` follows the same timetable ``j * P`` later, with ``P`` the *period* (at least the work of
one microbatch on the busiest device). Every job gets the target ``base + j * P``.

The pass. :class:`PacedPolicy`, a policy of the list-scheduling loop (:func:`pipeloom.sim.listsched.run`,
readiness and memory from its board's rule tables); as in :mod:`.greedy`, the device with the earliest clock
decides next; its candidates are, per local
chunk, the next forward and the next input-grad backward (microbatch order per chunk) and the pending
weight-grad jobs W. Among the ready F and B it starts the one with the smallest target (a backward that
the timetable wants earlier is on the critical path of a microbatch further down the V; a forward wanted
earlier feeds one), where

* a job may not start before ``target - slack`` (the timetable paces the pipeline: no device runs far
  ahead and fills its memory with forwards nothing downstream waits for);
* a forward fits the memory limit, and a forward that starts a new microbatch on the device (its first
  local chunk) also leaves room for ``head`` forwards of the device's *other* chunks: memory kept for the
  V's return leg of the microbatches in flight, so that a full device cannot block the backward chain;
* a W runs when nothing else may start and it ends before the next candidate is due, or when memory blocks
  a ready forward (oldest B first).

A pass may deadlock (None); the candidates are a small grid of (period, slack, head) (:func:`candidates`).
The result is a plain job list per device, timed and checked by the caller
(:func:`.localsearch.result_of`). :func:`run` uses the compiled form of the pass (``paced_pass`` in
``_accel.c``, on the C form of the same board and rule tables; about 15x faster: pp 128, m 512 in about 0.09 s
against 1.4 s) when the extension is built; :class:`PacedPolicy` on the Python loop (:func:`run_py`) stays the
specification (tests/schedule/test_paced_c.py: identical job lists).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Iterator

from ...core.ir import Job, Kind, Placement
from ...sim import listsched
from ...sim.kernel import KINDS
from .accel import accelerated, ext
from ...core.rules import EPS as _EPS

INF = math.inf
_new = tuple.__new__


@dataclass(frozen=True, slots=True)
class Pace:
    """One paced pass (recorded as the schedule's policy)."""

    period: float
    """time between the timetables of consecutive microbatches"""
    slack: float | None = None
    """a job may start at most this long before its target (None: any time)"""
    head: float = 1.0
    """forwards of the return leg kept free when a new microbatch starts on a device"""
    b_bias: float = 0.0
    """a backward's target is this many periods earlier (prefer B over F at equal targets)"""
    builder: str = "paced"


def applies(prob) -> bool:
    """Any V placement (vpp >= 2) with a finite memory limit."""
    return prob.placement is Placement.V and prob.vpp >= 2 and prob.limit < INF


def timetable(prob) -> tuple[list[float], list[float]]:
    """Microbatch 0's earliest starts of F and B per chunk (the chain down and up the V and back)."""
    nc = prob.nc
    tf = [0.0] * nc
    for c in range(1, nc):
        tf[c] = tf[c - 1] + prob.dF[c - 1] + prob.fcomm[c]
    tb = [0.0] * nc
    tb[nc - 1] = tf[nc - 1] + prob.dF[nc - 1]
    for c in range(nc - 2, -1, -1):
        tb[c] = tb[c + 1] + prob.dB[c + 1] + prob.bcomm[c]
    return tf, tb


def work_period(prob) -> float:
    """Work of one microbatch on the busiest device (the shortest period a timetable can keep)."""
    return max(sum(prob.dF[c] + prob.dB[c] + prob.dW[c] for c in loc) for loc in prob.local)


def chunk_rows(prob, pace: Pace, dmem, needs, table: tuple[list[float], list[float]] | None = None):
    """Per device, per local chunk (in ``prob.local``'s order): ``(chunk, B's base target, F's base target, memory
    an F must find free)``, what the pass needs besides the board (the same rows for :class:`PacedPolicy` and its
    compiled form). ``dmem``: the memory change per slot (the board's), ``needs``: the rule tables' needs per slot
    (:class:`pipeloom.sim.kernel.Rules`); a V gives a B one or two inputs and an F at most one, and the pass
    refuses tables that do not (ValueError)."""
    nc = prob.nc
    tf, tb = table or timetable(prob)
    bb = pace.b_bias * pace.period
    aF = dmem[:nc]  # F's memory delta per chunk (slot c)
    out = []
    for loc in prob.local:
        # room kept for the return leg when a new microbatch starts: head forwards of the largest other chunk
        keep = pace.head * max((aF[c] for c in loc[1:]), default=0.0)
        row = []
        for c in loc:
            nb_, nf_ = len(needs[nc + c]), len(needs[c])
            if not 1 <= nb_ <= 2 or nf_ > 1:
                raise ValueError(f"paced: chunk {c} needs {nf_} inputs for F and {nb_} for B; "
                                 "the paced pass handles at most 1 and 2")
            row.append((c, tb[c] - bb, tf[c], aF[c] + (keep if c == loc[0] else 0.0)))
        out.append(tuple(row))
    return out


class PacedPolicy:
    """The paced pass as a policy of :func:`pipeloom.sim.listsched.run` (see the module docstring): readiness
    (the board's ``done`` through its rule tables), memory (``board.mem`` and ``board.dmem``) and the job
    records come from the board; the policy keeps the targets, the release (``target - slack``), the
    return-leg reservation, its per-chunk counters and the pending W. The reference form of the compiled
    ``paced_pass`` (``_accel.c``; :func:`run` uses it when the extension is built)."""

    __slots__ = ("m", "nc", "P", "slack", "limit", "cand", "nf", "nb", "pend", "wdur", "wslot", "_k")

    def __init__(self, prob, pace: Pace, board: listsched.Board,
                 table: tuple[list[float], list[float]] | None = None) -> None:
        m, nc = prob.m, prob.nc
        self.m, self.nc = m, nc
        self.P = pace.period
        self.slack = INF if pace.slack is None else pace.slack
        self.limit = prob.limit + _EPS
        need_at = board._need_at
        # per device, per local chunk: (chunk, B's inputs on the board as (where, comm) twice (-1: none), B's base
        # target, F's input (where, comm; -1: none), F's base target, memory an F must find free)
        cand = []
        for rows in chunk_rows(prob, pace, board.dmem, board.needs, table):
            row = []
            for c, tb0, tf0, need in rows:
                nb_, nf_ = need_at[nc + c], need_at[c]
                (bk1, bc1), (bk2, bc2) = nb_[0], (nb_[1] if len(nb_) > 1 else (-1, 0.0))
                fk, fc = nf_[0] if nf_ else (-1, 0.0)
                row.append((c, bk1, bc1, bk2, bc2, tb0, fk, fc, tf0, need))
            cand.append(tuple(row))
        self.cand = cand
        self.nf = [0] * nc
        self.nb = [0] * nc
        self.pend: list[deque] = [deque() for _ in range(prob.pp)]
        self.wdur = board.dur[2 * nc:3 * nc]
        self.wslot = 2 * nc
        self._k = (self.P, self.slack, m, nc, self.nf, self.nb, self.limit, self.cand)  # one load in step

    def step(self, board: listsched.Board, d: int, T: float):
        now = T + _EPS
        P, slack, m, nc, nf, nb, limit, cand = self._k
        done = board.done
        bt = INF     # the smallest target among the startable candidates ...
        kind = -1    # ... its kind (0 F, 1 B) and chunk
        c = -1
        due = INF    # earliest time a candidate becomes startable (ready and released)
        blocked = False
        md = board.mem[d]
        for ch, bk1, bc1, bk2, bc2, tb0, fk, fc, tf0, need in cand[d]:
            mb = nb[ch]
            if mb < nf[ch]:  # backward
                at = mb * nc
                r = done[bk1 + at]
                if r < 0:
                    r = INF
                else:
                    r += bc1
                    if bk2 >= 0:
                        e = done[bk2 + at]
                        if e < 0:
                            r = INF
                        else:
                            e += bc2
                            if e > r:
                                r = e
                if r < INF:
                    tg = tb0 + mb * P
                    s = tg - slack
                    if r > s:
                        s = r
                    if s <= now:
                        if tg < bt:
                            bt, kind, c = tg, 1, ch
                    elif s < due:
                        due = s
            mb = nf[ch]
            if mb < m:  # forward
                if fk < 0:
                    r = 0.0
                else:
                    r = done[fk + mb * nc]
                    r = INF if r < 0 else r + fc
                if r < INF:
                    tg = tf0 + mb * P
                    s = tg - slack
                    if r > s:
                        s = r
                    if md + need > limit:
                        if s <= now:
                            blocked = True
                    elif s <= now:
                        if tg < bt:
                            bt, kind, c = tg, 0, ch
                    elif s < due:
                        due = s
        if kind == 0:
            mb = nf[c]
            nf[c] = mb + 1
            return c, mb
        if kind == 1:
            mb = nb[c]
            nb[c] = mb + 1
            self.pend[d].append((mb, c))
            return nc + c, mb
        pw = self.pend[d]
        if pw and (blocked or due == INF or due - T >= self.wdur[pw[0][1]] - _EPS):
            mb, c = pw.popleft()
            return self.wslot + c, mb
        if due < INF:
            return due
        if pw:
            mb, c = pw.popleft()
            return self.wslot + c, mb
        return INF  # asleep until a dependency is scheduled

    def after(self, board: listsched.Board, d: int, end: float) -> float:
        return end

    def fed(self, board: listsched.Board, d: int, arrival: float, key: float) -> float:
        f = board.free[d]
        k = f if f > arrival else arrival
        return k if k < key else key


def run(prob, pace: Pace, table: tuple[list[float], list[float]] | None = None) -> list[list[Job]] | None:
    """One paced pass (see the module docstring): per-device job lists, or None on deadlock. ``table``:
    microbatch 0's (F, B) start per chunk (default :func:`timetable`). Runs the compiled ``paced_pass`` of
    ``_accel.c`` when the extension is built (identical job lists: tests/schedule/test_paced_c.py), else
    :func:`run_py`."""
    if accelerated():
        t = prob.tables
        return ext.paced_pass((prob.pp, prob.m, prob.limit + _EPS, _EPS, pace.period,
                               INF if pace.slack is None else pace.slack),
                              t.needs, t.produces, prob.dur_table, prob.mem_tab, t.dev, listsched.handoff_table(t),
                              chunk_rows(prob, pace, prob.mem_tab, t.needs, table), Job, KINDS)
    return run_py(prob, pace, table)


def run_py(prob, pace: Pace, table: tuple[list[float], list[float]] | None = None) -> list[list[Job]] | None:
    """:func:`run` in Python: :class:`PacedPolicy` on the list-scheduling loop (the specification)."""
    board = listsched.Board.for_problem(prob)
    if listsched.run(board, PacedPolicy(prob, pace, board, table)) != 3 * prob.m * prob.nc:
        return None
    return board.seqs


def grid(prob) -> list[Pace]:
    """The passes tried, most useful first: the work period with half a period of slack (the best on most
    deep shapes with the Zero Bubble paper's costs at 0.5p, e.g. pp 32, m 128: 1563 against the greedy's
    1929), then longer periods, other slacks and return-leg headroom."""
    w = work_period(prob)
    out = []
    for f in (1.0, 1.125, 1.25, 1.5):
        for slack in (0.5 * w, 0.0, None):
            for head in (1.0, 0.0, 2.0):
                out.append(Pace(period=f * w, slack=slack, head=head))
    return out


#: passes always tried (the first of :func:`grid`: return-leg headroom 1 and 0 win about equally often; also on
#: big shapes: one pass only loses vmin pp 24, m 96, equal costs 665 -> 666, the official V-Min's 665)
MIN_PASSES = 2


def candidates(prob, max_jobs: int) -> Iterator[tuple[list[list[Job]], Pace]]:
    """Job lists of the paced passes of :func:`grid` within ``max_jobs`` placements, at least
    :data:`MIN_PASSES` (deadlocks skipped)."""
    njobs = 3 * prob.m * prob.nc
    for pace in grid(prob)[:max(MIN_PASSES, max_jobs // max(njobs, 1))]:
        seqs = run(prob, pace)
        if seqs is not None:
            yield seqs, pace
