"""THE timing kernel: time a fixed per-device order of jobs (no torch).

Every engine that times a schedule whose per-device job order is already fixed calls
:func:`time_order`: the simulator (:mod:`.simulate`), the run-log replay (:mod:`.replay`), the
validator's deadlock check (through the simulator), the runtime's comm plan
(``runtime/commplan.py``, unit durations) and every planner's re-timing of its job lists (the
greedy's local search, ``reorder``, ``polish``, the solver's hints). A planner that tries many candidate
orders of one shape asks :func:`order_timer` once (the same loop, only the makespan and the sum of ends, None on
a deadlock, no message built).

Semantics. Each device runs its list strictly in order. A job starts when its device is free
and every event it needs (:func:`pipeloom.core.rules.needs`) has happened, plus ``comm`` on an
edge that crosses devices (:func:`pipeloom.core.rules.crosses`); it then completes the events
of :data:`pipeloom.core.rules.PRODUCES`. Durations are per (kind, chunk) tables
(:func:`pipeloom.core.rules.durations`) or given per job; an *overlapped pair* (DualPipe's
F&B overlap: the jobs at ``i`` and ``i+1`` of a device) starts when both are ready and ends
at ``start + p1 + p2 - p3`` with the caller's three numbers (the simulator's overlap model,
or the replay's one measured duration as ``(dur, 0, 0)``).

The rules are not typed out here: :class:`Rules` turns :mod:`pipeloom.core.rules` into
lookup tables (per kind and chunk: the events needed with the comm on each edge, the events
produced, the duration), and the loop below, and its compiled form ``time_order`` in
``_accel.c``, only interpret those tables. A new job kind is an edit of ``core/rules.py``.

The loop is event-driven (a device that waits for an event parks on that event and is woken
when it happens), so it does O(jobs + dependencies) work: a 10-million-job plan is timed in
linear time whatever the pipeline degree.

``_accel.c`` is the compiled form of :func:`_time_order_py` (the specification): the same
operations in the same order, so both give identical floats (tests/sim/test_kernel.py).
``PIPELOOM_PURE_PYTHON=1`` forces the Python loop.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from ..core import rules
from ..core.errors import DeadlockError
from ..core.ir import Job, Kind, Placement, device_of

try:  # optional compiled form (identical results)
    from . import _accel as ext
except ImportError:  # no compiler at install time
    ext = None

#: job kinds in the order of the tables (index = position)
KINDS: tuple[Kind, ...] = (Kind.F, Kind.B, Kind.W, Kind.BW)
KIND_INDEX = {k: i for i, k in enumerate(KINDS)}


def accelerated() -> bool:
    """True when the C extension is built and not switched off by ``PIPELOOM_PURE_PYTHON=1``."""
    return ext is not None and not os.environ.get("PIPELOOM_PURE_PYTHON")


@dataclass(frozen=True, slots=True)
class Rules:
    """:mod:`pipeloom.core.rules` as tables for one shape (index ``k * nc + c``, ``k`` = :data:`KINDS` index).

    ``needs[k*nc+c]``: per event the job waits for, ``(event, chunk offset, comm on the edge)``
    (the event of (mb, chunk + offset) for a job of microbatch mb); ``produces[k*nc+c]``: its events.
    """

    pp: int
    nc: int
    dev: tuple[int, ...]
    needs: tuple[tuple[tuple[int, int, float], ...], ...]
    produces: tuple[tuple[int, ...], ...]

    @classmethod
    def make(cls, pp: int, nc: int, placement: Placement | str, comm: float = 0.0) -> "Rules":
        """The tables for ``pp`` devices, ``nc`` chunks, ``placement`` and ``comm`` (cached: the simulator,
        the validator and the planners ask for the same shape many times)."""
        return _make_rules(cls, pp, nc, Placement(placement), float(comm))

    @classmethod
    def _build(cls, pp: int, nc: int, placement: Placement, comm: float) -> "Rules":
        dev = tuple(device_of(c, pp, placement) for c in range(nc))
        fwd, bwd = rules.edge_comm(pp, nc, placement, comm)  # comm on the edge from c-1 / c+1 into c

        def edge(c2: int, c: int) -> float:
            if c2 == c:  # an edge inside one chunk never leaves its device
                return 0.0
            if c2 == c - 1:
                return fwd[c]
            if c2 == c + 1:
                return bwd[c]
            return comm if rules.crosses(c2, c, pp, placement) else 0.0

        needs = []
        prods = []
        for kind in KINDS:
            made = tuple(rules.PRODUCES[kind])
            for c in range(nc):
                needs.append(tuple((ev, c2 - c, edge(c2, c)) for ev, _mb, c2 in rules.needs(kind, 0, c, nc)))
                prods.append(made)
        return cls(pp, nc, dev, tuple(needs), tuple(prods))


@functools.lru_cache(maxsize=16)
def _make_rules(cls, pp: int, nc: int, placement: Placement, comm: float) -> Rules:
    return cls._build(pp, nc, placement, comm)


@dataclass(slots=True)
class Timing:
    """Start and end of every job (``[device][index]``), the makespan and the sum of all ends
    (summed device by device, each in list order)."""

    start: list[list[float]]
    end: list[list[float]]
    makespan: float
    total: float


def duration_table(nc: int, dF: Sequence[float], dB: Sequence[float], dW: Sequence[float]) -> list[float]:
    """:func:`pipeloom.core.rules.durations` flattened in the kernel's slot order (``k * nc + c``), for callers
    that time many orders of one shape (pass it as ``durations``)."""
    table = rules.durations(nc, dF, dB, dW)
    return [float(table[k][c]) for k in KINDS for c in range(nc)]


def time_order(devices: Sequence[Sequence[Job]], m: int, tables: Rules, *,
               durations: Mapping[Kind, Sequence[float]] | list[float] | None = None,
               job_durations: Sequence[Sequence[float]] | None = None,
               pairs: Mapping[tuple[int, int], tuple[float, float, float]] | None = None,
               delays: Sequence[Sequence[float]] | None = None) -> Timing:
    """Time ``devices`` (per device the job list, run in order; see the module docstring).

    Durations: ``durations[kind][chunk]`` (e.g. :func:`pipeloom.core.rules.durations`; or that table
    flattened by :func:`duration_table`) or
    ``job_durations[d][i]`` per job. ``pairs[(d, i)] = (p1, p2, p3)``: the jobs at ``i`` and
    ``i + 1`` of device ``d`` run as one overlapped pair ending at ``start + p1 + p2 - p3``
    (ignored for the last job of a list). ``delays[d][i]`` is idle inserted right before a job.
    Raises :class:`~pipeloom.core.errors.DeadlockError` naming every stuck job and what it waits
    for (also for a job outside ``m`` microbatches / ``nc`` chunks or of an unknown kind).
    """
    if (durations is None) == (job_durations is None):
        raise ValueError("time_order: give durations (per kind and chunk) or job_durations (per job), not both")
    nc = tables.nc
    if isinstance(durations, list):
        dur_tab = durations
    elif durations is not None:
        dur_tab = [float(durations[k][c]) for k in KINDS for c in range(nc)]
    if accelerated():
        out = ext.time_order(devices, KINDS, m, nc, tables.needs, tables.produces,
                             dur_tab if durations is not None else None, job_durations, pairs or None, delays)
    else:
        out = _time_order_py(devices, m, nc, tables.needs, tables.produces,
                             dur_tab if durations is not None else None, job_durations, pairs or None, delays)
    if out[0] is None:
        _raise(devices, m, nc, out)
    start, end, total = out
    return Timing(start, end, _makespan(end), total)


def order_timer(m: int, tables: Rules,
                durations: list[float]) -> Callable[[Sequence[Sequence[Job]]], tuple[float, float] | None]:
    """A timer for the many candidate orders a planner tries on one shape: ``timer(devices)`` gives
    ``(makespan, sum of ends)`` exactly as :func:`time_order` would (the same loop, compiled when built), or
    None when the order deadlocks or names a job out of range. No per-job lists and no deadlock message are
    built, and the implementation is chosen once (``durations``: :func:`duration_table`)."""
    nc = tables.nc
    needs, produces = tables.needs, tables.produces
    if accelerated():
        compiled = ext.time_order

        def timer(devices):
            return compiled(devices, KINDS, m, nc, needs, produces, durations, None, None, None, True)
        return timer

    def timer_py(devices):
        out = _time_order_py(devices, m, nc, needs, produces, durations, None, None, None)
        return None if out[0] is None else (_makespan(out[1]), out[2])
    return timer_py


def _makespan(end: list[list[float]]) -> float:
    """The latest end of a device's last job (the compiled summary computes it the same way)."""
    makespan = 0.0
    for e in end:
        if e and e[-1] > makespan:
            makespan = e[-1]
    return makespan


def _time_order_py(devices, m, nc, needs, produces, dur_tab, job_dur, pairs, delays):
    """The loop (specification of ``time_order`` in ``_accel.c``): (start, end, total), or on failure
    ``(None, "range", d, i)`` for a job out of range, ``(None, "deadlock", [(d, i, (ev, mb, c)), ...])``."""
    pp = len(devices)
    mnc = m * nc
    done = [-1.0] * (3 * mnc)  # event e of (mb, c) at e * mnc + mb * nc + c
    waiters: dict[int, list[int]] = {}
    start = [[0.0] * len(s) for s in devices]
    end = [[0.0] * len(s) for s in devices]
    ptr = [0] * pp
    free = [0.0] * pp
    stack = list(range(pp - 1, -1, -1))
    kidx = KIND_INDEX

    def ready(job, d, i):
        """Earliest start from the job's needs, or (-1, key of the missing event)."""
        kind, mb, c = job
        k = kidx.get(kind) if kind.__class__ is Kind else None
        if k is None or not (0 <= mb < m and 0 <= c < nc):
            return None
        r = 0.0
        base = mb * nc + c
        for ev, off, cm in needs[k * nc + c]:
            key = ev * mnc + base + off
            e = done[key]
            if e < 0:
                return -1.0, key
            e += cm
            if e > r:
                r = e
        return r, k * nc + c

    while stack:
        d = stack.pop()
        seq = devices[d]
        i = ptr[d]
        n = len(seq)
        t_free = free[d]
        st, en = start[d], end[d]
        jd = job_dur[d] if job_dur is not None else None
        dl = delays[d] if delays is not None else None
        while i < n:
            job = seq[i]
            rr = ready(job, d, i)
            if rr is None:
                return None, "range", d, i
            r, slot = rr
            if r < 0:
                waiters.setdefault(slot, []).append(d)
                break
            pair = pairs.get((d, i)) if pairs is not None and i + 1 < n else None
            if pair is not None:
                job2 = seq[i + 1]
                rr2 = ready(job2, d, i + 1)
                if rr2 is None:
                    return None, "range", d, i + 1
                r2, slot2 = rr2
                if r2 < 0:
                    waiters.setdefault(slot2, []).append(d)
                    break
                if r2 > r:
                    r = r2
            s0 = t_free if t_free > r else r
            if dl is not None:
                s0 = s0 + dl[i]
            if pair is not None:
                t = s0 + pair[0] + pair[1] - pair[2]
                st[i] = st[i + 1] = s0
                en[i] = en[i + 1] = t
                todo = ((job, slot), (job2, slot2))
                i += 2
            else:
                t = s0 + (jd[i] if jd is not None else dur_tab[slot])
                st[i] = s0
                en[i] = t
                todo = ((job, slot),)
                i += 1
            for jb, sl in todo:
                base = jb[1] * nc + jb[2]
                for ev in produces[sl]:
                    key = ev * mnc + base
                    done[key] = t
                    w = waiters.pop(key, None)
                    if w:
                        stack.extend(w)
            t_free = t
        ptr[d] = i
        free[d] = t_free
    def missing(job):
        kind, mb, c = job
        base = mb * nc + c
        return next((ev * mnc + base + off for ev, off, _ in needs[kidx[kind] * nc + c]
                     if done[ev * mnc + base + off] < 0), None)

    stuck = []
    for d in range(pp):
        i = ptr[d]
        if i < len(devices[d]):
            miss = missing(devices[d][i])
            if miss is None:  # the first job of an overlapped pair is ready: its partner waits
                miss = missing(devices[d][i + 1])
            stuck.append((d, i, miss))
    if stuck:
        return None, "deadlock", stuck
    total = 0.0
    for en in end:
        for t in en:
            total += t
    return start, end, total


def _event_str(key: int, m: int, nc: int) -> str:
    ev, rest = divmod(key, m * nc)
    mb, c = divmod(rest, nc)
    return " or ".join(str(j) for j in rules.producers(ev, mb, c))


def _raise(devices, m: int, nc: int, out) -> None:
    if out[1] == "range":
        d, i = out[2], out[3]
        raise DeadlockError(f"device {d} position {i}: job {devices[d][i]} is out of range "
                            f"(microbatches 0..{m - 1}, chunks 0..{nc - 1})", [])
    details = []
    for d, i, key in out[2]:
        job = devices[d][i]
        what = _event_str(key, m, nc)
        details.append((d, i, str(job), what))
    msg = "deadlock: " + "; ".join(f"device {d} is stuck at position {i} on {j}, waiting for {w}"
                                   for d, i, j, w in details)
    raise DeadlockError(msg, details)
