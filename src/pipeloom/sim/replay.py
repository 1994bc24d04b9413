"""Replay a schedule with one duration per job (no torch).

The event simulator (:mod:`pipeloom.sim.simulate`) takes durations per chunk pass; a
measured run has a different duration for every job, and a straggler analysis needs
"what if only this rank had been on time". :func:`replay` is that per-job variant: every
device runs its list in order, a job starts at

    start = max(device free, ready) + delay[job]
    ready = max over dependencies (end of the dependency + comm if it ran on another device)

with the dependency rules of :mod:`pipeloom.core.rules` (F(m,k) <- F(m,k-1);
B/BW(m,k) <- F(m,k) and the input grad of chunk k+1; W(m,k) <- B(m,k)). An overlapped
pair (DualPipe) starts when both of its jobs are ready and takes the duration stored
for its first job.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..core import rules
from ..core.errors import DeadlockError
from ..core.ir import Job, Schedule
from . import kernel

def dependencies(job: Job, num_chunks: int) -> tuple[tuple[int, int, int], ...]:
    """Events ``(event, mb, chunk)`` that ``job`` waits for (:func:`pipeloom.core.rules.needs`)."""
    return rules.needs(job[0], job[1], job[2], num_chunks)


def produces(job: Job) -> tuple[tuple[int, int, int], ...]:
    """Events that finish when ``job`` ends (:data:`pipeloom.core.rules.PRODUCES`)."""
    kind, mb, c = job
    return tuple((ev, mb, c) for ev in rules.PRODUCES[kind])


@dataclass(slots=True)
class Replay:
    start: list[list[float]]
    end: list[list[float]]
    makespan: float
    binding: list[list[tuple[int, int] | None]]
    """per job the (device, index) of the job whose end bound its start (None: the device was free first
    or the job had no dependency); a job bound by its own device's previous job points at (d, i-1)"""


class ReplayDeadlock(RuntimeError):
    """The job lists block each other (the order is not executable)."""


def replay(schedule: Schedule, durations: Sequence[Sequence[float]], comm: float = 0.0,
           delays: Sequence[Sequence[float]] | None = None) -> Replay:
    """Time ``schedule`` with ``durations[d][i]`` for the i-th job of device d.

    ``delays[d][i]`` is extra idle inserted right before that job (a late launch). Raises
    :class:`ReplayDeadlock` when the devices block each other.
    """
    pp, nc = schedule.pp, schedule.num_chunks
    devices = schedule.devices
    m = schedule.microbatches
    pairs = {(d, i): (float(durations[d][i]), 0.0, 0.0) for d, i in schedule.overlapped
             if 0 <= d < pp and 0 <= i < len(devices[d]) - 1}
    try:
        tm = kernel.time_order(devices, m, kernel.Rules.make(pp, nc, schedule.placement, comm),
                               job_durations=durations, pairs=pairs, delays=delays)
    except DeadlockError as e:
        made = {ev for _d, _i, job in schedule.jobs() for ev in produces(job)}
        for d, i, _j, _w in e.stuck:
            job = devices[d][i]
            if any(ev not in made for ev in dependencies(job, nc)):
                raise ReplayDeadlock(f"{job} on device {d} depends on a job that no device runs") from None
        raise ReplayDeadlock(str(e)) from None
    start, end = tm.start, tm.end
    # what bound each start (a pure function of the times): the latest dependency (plus comm across
    # devices; the first of equal ones), unless the device's previous job ended no earlier
    where: dict[tuple[int, int, int], tuple[int, int]] = {}
    for d, i, job in schedule.jobs():
        for ev in produces(job):
            where[ev] = (d, i)
    binding: list[list[tuple[int, int] | None]] = [[None] * len(s) for s in devices]

    def bound_by(d: int, job: Job) -> tuple[float, tuple[int, int] | None]:
        best, who = 0.0, None
        for ev in dependencies(job, nc):
            src = where[ev]
            t = end[src[0]][src[1]] + (comm if src[0] != d else 0.0)
            if who is None or t > best:
                best, who = t, src
        return best, who

    for d, seq in enumerate(devices):
        bd = binding[d]
        i = 0
        while i < len(seq):
            paired = (d, i) in pairs
            r1 = bound_by(d, seq[i])
            r2 = bound_by(d, seq[i + 1]) if paired else (0.0, None)
            r, who = r1 if r1[0] >= r2[0] else r2
            if i > 0 and end[d][i - 1] >= r:
                who = (d, i - 1)
            n = 2 if paired else 1
            for k in range(i, i + n):
                bd[k] = who
            i += n
    return Replay(start, end, tm.makespan, binding)
