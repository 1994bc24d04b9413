"""The in-memory model of a measured run, whatever wrote it (no torch).

Every reader (pipeloom's job logs and the worker-log text lines in :mod:`.reader`, torch profiler traces
in :mod:`.torch_profile`) produces these: per rank a :class:`RankLog` of :class:`LogJob` records,
and a :class:`RunLog` of all ranks with aligned clocks, which the check, the trace writer and the
pictures consume.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..core.costs import Costs
from ..core.ir import Job, Kind, Schedule


@dataclass(slots=True)
class LogJob:
    """One executed job as logged (times in seconds; aligned after :func:`read_logs`)."""

    kind: str
    mb: int
    chunk: int
    """global chunk id when known; for text logs the local chunk until resolved"""
    start: float
    end: float
    step: int
    rank: int = 0
    wait: float = 0.0
    """seconds cut from the front of the logged interval because the job's input did not exist yet
    (a runtime that starts its timer before the receive); see :func:`clip_waits`"""
    done: float | None = None
    """when the job had handed its outputs to the transport and posted the receives they unblock (pipeloom's
    CPU logs: the ``done`` field, >= ``end``); None when not logged"""

    def job(self) -> Job:
        return Job(Kind(self.kind), self.mb, self.chunk)


@dataclass(slots=True)
class RankLog:
    path: str
    rank: int
    machine: int
    local_rank: int
    pp_rank: int | None = None
    dp_rank: int = 0
    host: str = ""
    meta: dict | None = None
    jobs: list[LogJob] = field(default_factory=list)
    syncs: dict[int, float] = field(default_factory=dict)
    step_ends: dict[int, float] = field(default_factory=dict)
    window: tuple[int, int] | None = None
    """profiled steps [start, stop) from the meta line or the profile_start/stop events"""
    malformed: int = 0
    examples: list[str] = field(default_factory=list)
    unknown_events: Counter = field(default_factory=Counter)
    dropped_jobs: int = 0
    """well-formed jobs outside the profiled window"""
    text_form: bool = False

    @property
    def domain(self) -> str:
        return f"machine{self.machine}"


@dataclass(slots=True)
class RunLog:
    """Every rank of one run, clocks aligned."""

    root: str
    ranks: list[RankLog]
    schedule: Schedule | None
    costs: Costs | None
    pp: int
    dp: int
    steps: list[int]
    offsets: dict[str, float]
    alignment: str
    """how clocks were aligned: 'sync', 'p2p', 'single clock' or 'none'"""
    warnings: list[str] = field(default_factory=list)
    schedule_inferred: bool = False
    clipped_jobs: int = 0
    clipped_s: float = 0.0

    @property
    def malformed(self) -> int:
        return sum(r.malformed for r in self.ranks)

    @property
    def machines(self) -> list[int]:
        return sorted({r.machine for r in self.ranks})

    def jobs(self):
        for r in self.ranks:
            yield from r.jobs

    def t0(self) -> float:
        return min((j.start for j in self.jobs()), default=0.0)

    def summary(self) -> dict:
        return {
            "logdir": self.root,
            "ranks": len(self.ranks),
            "machines": len(self.machines),
            "pp": self.pp,
            "dp": self.dp,
            "schedule": self.schedule.name if self.schedule else None,
            "schedule_inferred": self.schedule_inferred,
            "steps": self.steps,
            "jobs": sum(len(r.jobs) for r in self.ranks),
            "dropped_jobs_outside_window": sum(r.dropped_jobs for r in self.ranks),
            "malformed_lines": self.malformed,
            "clock_alignment": self.alignment,
            "clock_offsets_s": self.offsets,
            "waits_clipped": {"jobs": self.clipped_jobs, "seconds": self.clipped_s},
            "warnings": self.warnings,
        }


class LogError(ValueError):
    """The log directory cannot be read at all (no worker logs, no jobs)."""
