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
from ..core.ir import Job, Schedule

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
    where: dict[tuple[int, int, int], tuple[int, int]] = {}
    for d, i, job in schedule.jobs():
        for ev in produces(job):
            where[ev] = (d, i)
    start = [[0.0] * len(s) for s in devices]
    end = [[0.0] * len(s) for s in devices]
    binding: list[list[tuple[int, int] | None]] = [[None] * len(s) for s in devices]
    done: dict[tuple[int, int, int], float] = {}
    ptr = [0] * pp
    free = [0.0] * pp
    pairs = schedule.overlapped
    remaining = schedule.num_jobs

    def ready(d: int, job: Job) -> tuple[float, tuple[int, int] | None] | None:
        best, who = 0.0, None
        for ev in dependencies(job, nc):
            t = done.get(ev)
            if t is None:
                if ev not in where:
                    raise ReplayDeadlock(f"{job} on device {d} depends on a job that no device runs")
                return None
            src = where[ev]
            if src[0] != d:
                t += comm
            if who is None or t > best:
                best, who = t, src
        return best, who

    while remaining:
        progressed = False
        for d in range(pp):
            seq = devices[d]
            i = ptr[d]
            while i < len(seq):
                r1 = ready(d, seq[i])
                if r1 is None:
                    break
                paired = (d, i) in pairs and i + 1 < len(seq)
                r2 = ready(d, seq[i + 1]) if paired else (0.0, None)
                if r2 is None:
                    break
                r, who = (r1 if r1[0] >= r2[0] else r2)
                if free[d] >= r and i > 0:
                    r, who = free[d], (d, i - 1)
                s = max(r, free[d]) + (delays[d][i] if delays is not None else 0.0)
                e = s + durations[d][i]
                n = 2 if paired else 1
                for k in range(i, i + n):
                    start[d][k], end[d][k], binding[d][k] = s, e, who
                    for ev in produces(seq[k]):
                        done[ev] = e
                free[d] = e
                i += n
                remaining -= n
                progressed = True
            ptr[d] = i
        if not progressed and remaining:
            stuck = ", ".join(f"device {d} at {devices[d][ptr[d]]}" for d in range(pp) if ptr[d] < len(devices[d]))
            raise ReplayDeadlock(f"deadlock: {stuck}")
    makespan = max((e[-1] for e in end if e), default=0.0)
    return Replay(start, end, makespan, binding)
