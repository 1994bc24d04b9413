"""Event simulator: time a schedule under a cost model (no torch).

Each device runs its list strictly in order; a job starts when the device is free and all its
dependencies (see :mod:`pipeloom.core.rules`) have ended, plus ``comm`` for an edge that
crosses devices. Memory is the running sum over a device's list (F +a, B -b, W -(a-b), BW -a).

Metrics (definitions as in ../shared/reference/README.md):
    makespan      = last end over all devices
    bubble        = total idle / (pp * makespan)            (fill, drain and comm waits counted)
    stage_bubble  = max_d (span_d - busy_d) / span_d,  span_d = last end - first start on d
                    (the figure the zero-bubble authors report)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..core import rules
from . import kernel
from ..core.errors import DeadlockError  # noqa: F401  (raised by the kernel; re-exported)
from ..core.ir import Kind, Schedule
from ..core.costs import Costs, MemModel, pair_hidden


@dataclass(slots=True)
class SimResult:
    schedule: Schedule
    makespan: float
    start: list[list[float]]
    end: list[list[float]]
    busy: list[float]
    peak_memory: list[float]
    memory_after: list[list[float]]
    """memory on the device right after each job of its list (units above)"""
    bubble: float = 0.0
    stage_bubble: float = 0.0
    idle: list[float] = field(default_factory=list)
    span: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "makespan": self.makespan,
            "bubble": self.bubble,
            "stage_bubble": self.stage_bubble,
            "peak_memory": self.peak_memory,
            "busy": self.busy,
            "idle": self.idle,
        }


def memory_profile(schedule: Schedule, mem: MemModel | None = None) -> tuple[list[float], list[list[float]]]:
    """Per-device peak and running memory after each job (order-based; needs no timing)."""
    a, b = (mem or MemModel()).per_chunk(schedule.num_chunks, schedule.vpp)
    table = rules.memory_deltas(schedule.num_chunks, a, b)  # once, not per device (pp 65 536)
    prof = [rules.peak_memory(seq, a, b, table) for seq in schedule.devices]
    return [p for p, _ in prof], [t for _, t in prof]


def simulate(schedule: Schedule, costs: Costs | None = None, mem: MemModel | None = None) -> SimResult:
    """Time ``schedule``; raise :class:`DeadlockError` if devices block each other."""
    costs = costs or Costs()
    pp, m, nc = schedule.pp, schedule.microbatches, schedule.num_chunks
    dF, dB, dW = costs.per_chunk(nc)
    devices = schedule.devices
    pairs = schedule.overlapped
    ov = 1.0 - costs.overlap
    table = rules.durations(nc, dF, dB, dW)
    pair_cost = {}
    comm_of = None
    aF, aB = costs.a2a_per_chunk(nc) if pairs else ([], [])
    if any(aF) or any(aB):  # all-to-all given: the pair hides what core/costs.pair_hidden says, not `overlap`
        comm_of = {Kind.F: aF, Kind.B: aB, Kind.BW: aB, Kind.W: [0.0] * nc}
    for d, i in pairs:  # an overlapped pair takes d1 + d2 - hidden
        if 0 <= d < pp and i + 1 < len(devices[d]):
            j1, j2 = devices[d][i], devices[d][i + 1]
            try:
                d1, d2 = table[j1[0]][j1[2]], table[j2[0]][j2[2]]
                hidden = ((1.0 - ov) * min(d1, d2) if comm_of is None
                          else pair_hidden(d1, comm_of[j1[0]][j1[2]], d2, comm_of[j2[0]][j2[2]]))
            except (KeyError, IndexError, TypeError):
                continue  # a job out of range: the kernel names it
            pair_cost[(d, i)] = (d1, d2, hidden)
    tm = kernel.time_order(devices, m, kernel.Rules.make(pp, nc, schedule.placement, costs.comm),
                           durations=table, pairs=pair_cost)
    start, end = tm.start, tm.end

    busy = [sum(e - s for s, e in zip(start[d], end[d])) for d in range(pp)]
    # overlapped pairs share an interval: count it once
    for d, i in pairs:
        if i + 1 < len(devices[d]):
            busy[d] -= end[d][i] - start[d][i]
    makespan = max((e[-1] for e in end if e), default=0.0)
    idle = [makespan - b for b in busy]
    span = [(end[d][-1] - start[d][0]) if end[d] else 0.0 for d in range(pp)]
    peaks, mem_after = memory_profile(schedule, mem)
    bubble = sum(idle) / (pp * makespan) if makespan > 0 else 0.0
    stage_bubble = max(((sp - bu) / sp if sp > 0 else 0.0) for sp, bu in zip(span, busy)) if pp else 0.0
    return SimResult(schedule=schedule, makespan=makespan, start=start, end=end, busy=busy,
                     peak_memory=peaks, memory_after=mem_after, bubble=bubble,
                     stage_bubble=max(0.0, stage_bubble), idle=idle, span=span)

