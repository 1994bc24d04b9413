"""THE list-scheduling loop: build per-device job orders job by job (no torch).

Every constructive pass of the planners (the greedy pass, zb_looped's template pass, the lock-step
construction, the solver's warm start) places jobs one at a time on a :class:`Board` and lets a
*policy* decide which job comes next; the readiness and memory rules are not typed out in the passes:

* :meth:`Board.ready`: when a job's inputs are there, read from :mod:`pipeloom.core.rules` as the
  timing kernel's tables (:class:`pipeloom.sim.kernel.Rules`: per (kind, chunk) the events needed with
  the comm on each edge, the events produced);
* :meth:`Board.commit`: the job runs from ``start`` for its duration (:func:`pipeloom.core.rules.durations`),
  completes its events, and changes its device's memory by :func:`pipeloom.core.rules.memory_delta`;
  :meth:`Board.place` is ``commit`` at the earliest start (device free and inputs ready), which is
  how a construction that appends jobs device by device (lock-step) times them.

Two ways to drive it:

* :func:`run`, the event-driven loop: a heap of (time, device) decision points, the earliest first
  (ties: the lower device). At its point the device asks the policy's ``step(board, d, T)``, which
  returns a job ``(slot, mb)`` to run from ``T``, or the next time to ask (``INF``: when fed). After a
  commit the loop asks ``after(board, d, end)`` for the device's next point and, for every device that
  receives one of the job's events over an edge (:func:`pipeloom.core.rules.handoff`),
  ``fed(board, d2, arrival, key)`` for its new point. The greedy pass and the template pass are such policies.
* a construction that decides the order itself (lock-step's rounds) calls :meth:`Board.place` directly.

A new portfolio candidate is one policy object (``step``, ``after``, ``fed``; see :class:`Policy`) that
reads the board and keeps its own state (counters, queues, reservations).

Slots. A job of kind ``k`` (index in :data:`pipeloom.sim.kernel.KINDS`: F 0, B 1, W 2, BW 3) on chunk
``c`` is slot ``k * nc + c``; event ``e`` of (mb, c) is ``done[e * m * nc + mb * nc + c]`` (-1 while it
has not happened), as in the timing kernel.

The compiled board in ``_accel.c`` (``board_ready``, ``board_commit``; the greedy pass ``run_pass``,
the lock-step pass ``lockstep_pass``, the paced pass ``paced_pass`` and zb_looped's template pass
``template_pass`` on it) reads the same tables (``Rules.needs``, ``Rules.produces``,
:func:`mem_table`, :func:`handoff_table`) with the same operations in the same order, so both give identical
floats (tests/sim/test_listsched.py, tests/schedule/test_accel.py).
"""
from __future__ import annotations

import heapq
import math
from typing import Protocol, Sequence

from ..core import rules
from ..core.ir import Job, Kind
from .kernel import KINDS, Rules, duration_table

INF = math.inf
_new = tuple.__new__  # Job is a NamedTuple: tuple.__new__(Job, ...) skips its __new__ wrapper


def mem_table(nc: int, a: Sequence[float], b: Sequence[float]) -> list[float]:
    """:func:`pipeloom.core.rules.memory_deltas` flattened in slot order (``k * nc + c``)."""
    md = rules.memory_deltas(nc, a, b)
    return [float(md[k][c]) for k in KINDS for c in range(nc)]


class Board:
    """A list schedule under construction: per device the jobs placed so far, their times, the memory.

    ``seqs[d]`` the jobs of device d in order, ``order[d]`` the commit rank of each (a topological order:
    the validator's witness), ``free[d]`` when the device is free, ``mem[d]`` / ``peak[d]`` its running and
    peak activation memory, ``starts[d]`` the start of its first job, ``ncommit`` the jobs placed.
    """

    __slots__ = ("pp", "m", "nc", "mnc", "dev", "needs", "produces", "dur", "dmem", "done", "free", "mem",
                 "peak", "starts", "seqs", "order", "ncommit", "handoff", "_need_at", "_prod_at", "_job_of")

    def __init__(self, pp: int, m: int, tables: Rules, dur: list[float], dmem: list[float]) -> None:
        nc = tables.nc
        self.pp, self.m, self.nc, self.mnc = pp, m, nc, m * nc
        self.dev = tables.dev
        self.needs = tables.needs
        self.produces = tables.produces
        self.dur = dur
        self.dmem = dmem
        self.done = [-1.0] * (3 * m * nc)
        self.free = [0.0] * pp
        self.mem = [0.0] * pp
        self.peak = [0.0] * pp
        self.starts = [0.0] * pp
        self.seqs: list[list[Job]] = [[] for _ in range(pp)]
        self.order: list[list[int]] = [[] for _ in range(pp)]
        self.ncommit = 0
        # per slot: the (chunk offset, comm) of the edge its handoff travels (core.rules.handoff), or None
        self.handoff = handoff_table(tables)
        # the same tables with the index arithmetic done once: per slot, where in ``done`` (less mb * nc) each
        # needed event is, with its comm; where each produced event goes; the job's (kind, chunk)
        mnc = self.mnc
        self._need_at = [tuple((ev * mnc + s % nc + off, cm) for ev, off, cm in tables.needs[s]) for s in range(4 * nc)]
        self._prod_at = [tuple(ev * mnc + s % nc for ev in tables.produces[s]) for s in range(4 * nc)]
        self._job_of = [(KINDS[s // nc], s % nc) for s in range(4 * nc)]

    @classmethod
    def for_problem(cls, prob) -> "Board":
        """An empty board for a :class:`pipeloom.schedule.search.greedy.Problem` (its tables, durations, memory)."""
        return cls(prob.pp, prob.m, prob.tables, prob.dur_table, prob.mem_tab)

    @classmethod
    def make(cls, pp: int, m: int, tables: Rules, dF, dB, dW, a, b) -> "Board":
        nc = tables.nc
        return cls(pp, m, tables, duration_table(nc, dF, dB, dW), mem_table(nc, a, b))

    def ready(self, slot: int, mb: int) -> float:
        """When the inputs of job ``slot`` of microbatch ``mb`` are on its device (comm added on edges between
        devices); -1.0 while one of them has not been placed."""
        done = self.done
        at = mb * self.nc
        r = 0.0
        for key, cm in self._need_at[slot]:
            e = done[key + at]
            if e < 0:
                return -1.0
            e += cm
            if e > r:
                r = e
        return r

    def arrival(self, slot: int, mb: int) -> float | None:
        """When the job's input from another device arrives (None: it has none, or it is not placed yet)."""
        nc = self.nc
        c = slot % nc
        dev = self.dev
        for ev, off, cm in self.needs[slot]:
            if off and dev[c + off] != dev[c]:
                e = self.done[ev * self.mnc + mb * nc + c + off]
                return None if e < 0 else e + cm
        return None

    def admits(self, d: int, slot: int, limit: float) -> bool:
        """True when running job ``slot`` on device ``d`` keeps its memory within ``limit``."""
        return self.mem[d] + self.dmem[slot] <= limit

    def commit(self, d: int, slot: int, mb: int, start: float) -> float:
        """Run job ``slot`` of ``mb`` on device ``d`` from ``start`` (the caller checked it is ready); its end."""
        e = start + self.dur[slot]
        done = self.done
        at = mb * self.nc
        for key in self._prod_at[slot]:
            done[key + at] = e
        md = self.mem[d] + self.dmem[slot]
        self.mem[d] = md
        if md > self.peak[d]:
            self.peak[d] = md
        seq = self.seqs[d]
        if not seq:
            self.starts[d] = start
        kind, c = self._job_of[slot]
        seq.append(_new(Job, (kind, mb, c)))
        self.order[d].append(self.ncommit)
        self.ncommit += 1
        self.free[d] = e
        return e

    def place(self, d: int, slot: int, mb: int) -> float | None:
        """:meth:`commit` at the earliest start (device free, inputs ready); None (nothing placed) while an
        input is missing."""
        r = self.ready(slot, mb)
        if r < 0:
            return None
        f = self.free[d]
        return self.commit(d, slot, mb, f if f >= r else r)


def handoff_table(tables: Rules) -> list[tuple[int, float] | None]:
    """Per slot, the chunk offset and comm of the edge on which the job's event goes to another chunk
    (:func:`pipeloom.core.rules.handoff`; the comm as the receiving job's needs have it), or None.

    Made once per tables object (every planner's problem asks for it; :meth:`Rules.make` hands out one
    object per shape, and a new object, e.g. after its cache is cleared, is derived again). Do not modify."""
    got = _handoff_made.get(id(tables))
    if got is not None and got[0] is tables:
        return got[1]
    if len(_handoff_made) >= 64:
        _handoff_made.clear()
    out = _handoff_table(tables)
    _handoff_made[id(tables)] = (tables, out)  # the tables are kept alive, so their id is not reused
    return out


_handoff_made: dict[int, tuple[Rules, list]] = {}


def _handoff_table(tables: Rules) -> list[tuple[int, float] | None]:
    nc = tables.nc
    out: list[tuple[int, float] | None] = []
    for kind in KINDS:
        for c in range(nc):
            h = rules.handoff(kind, 0, c, nc)
            if h is None:
                out.append(None)
                continue
            (ev, _mb, _c), c2 = h
            cm = [x for e2, off, x in tables.needs[KINDS.index(_consumer(kind)) * nc + c2] if e2 == ev and c2 + off == c]
            if not cm:
                raise ValueError(f"core.rules: {kind.value} on chunk {c} hands {rules.EVENT_NAMES[ev]} to chunk {c2}, "
                                 "whose needs do not include it")
            out.append((c2 - c, cm[0]))
    return out


def _consumer(kind: Kind) -> Kind:
    """The kind of job that receives ``kind``'s handoff (F's ACT feeds the next chunk's F, a backward's GRAD
    the previous chunk's B)."""
    return Kind.F if kind is Kind.F else Kind.B


class Policy(Protocol):
    """What :func:`run` asks (see the module docstring). ``step`` returns ``(slot, mb)`` to run from ``T`` or
    the next time to ask (a float; ``INF``: only when fed)."""

    def step(self, board: Board, d: int, T: float): ...

    def after(self, board: Board, d: int, end: float) -> float: ...

    def fed(self, board: Board, d: int, arrival: float, key: float) -> float: ...


def run(board: Board, policy, keys: list[float] | None = None) -> int:
    """The event-driven list-scheduling loop (see the module docstring) until no device has a decision
    point left; the number of jobs placed (:attr:`Board.ncommit`: compare with the jobs of the shape).

    ``keys``: each device's first decision point (default 0.0 for all)."""
    pp = board.pp
    nc = board.nc
    key = [0.0] * pp if keys is None else list(keys)
    heap = [(k, d) for d, k in enumerate(key) if k < INF]
    heapq.heapify(heap)
    if not heap:
        return board.ncommit
    pop, push, pushpop = heapq.heappop, heapq.heappush, heapq.heappushpop
    step, after, fed = policy.step, policy.after, policy.fed
    dev, hand = board.dev, board.handoff
    commit = board.commit
    item = pop(heap)
    while True:  # ``item``: the next decision point (a device's new point goes in with one heappushpop)
        T, d = item
        if T != key[d]:  # stale
            if not heap:
                break
            item = pop(heap)
            continue
        act = step(board, d, T)
        if act.__class__ is float:
            key[d] = act
            if act < INF:
                item = pushpop(heap, (act, d))
                continue
            if not heap:
                break
            item = pop(heap)
            continue
        slot, mb = act
        e = commit(d, slot, mb, T)
        h = hand[slot]
        if h is not None:
            d2 = dev[slot % nc + h[0]]
            if d2 != d:
                k = fed(board, d2, e + h[1], key[d2])
                if k != key[d2]:
                    key[d2] = k
                    if k < INF:
                        push(heap, (k, d2))
        k = after(board, d, e)
        key[d] = k
        if k < INF:
            item = pushpop(heap, (k, d))
        elif heap:
            item = pop(heap)
        else:
            break
    return board.ncommit
