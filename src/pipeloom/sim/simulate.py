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
from ..core.errors import DeadlockError
from ..core.ir import Kind, Schedule, device_of
from ..core.costs import Costs, MemModel

# event e of (mb, chunk c) is done[e * m * nc + mb * nc + c], e = core.rules.ACT, GRAD, WGRAD


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
    prof = [rules.peak_memory(seq, a, b) for seq in schedule.devices]
    return [p for p, _ in prof], [t for _, t in prof]


def simulate(schedule: Schedule, costs: Costs | None = None, mem: MemModel | None = None) -> SimResult:
    """Time ``schedule``; raise :class:`DeadlockError` if devices block each other."""
    costs = costs or Costs()
    pp, m, nc = schedule.pp, schedule.microbatches, schedule.num_chunks
    dF, dB, dW = costs.per_chunk(nc)
    comm = costs.comm
    # comm on the edge into chunk c from c-1 (forward) / from c+1 (backward)
    fcomm, bcomm = rules.edge_comm(pp, nc, schedule.placement, comm)
    ov = 1.0 - costs.overlap
    n_ev = 3 * m * nc
    done = [-1.0] * n_ev
    waiters: dict[int, list[int]] = {}
    devices = schedule.devices
    start = [[0.0] * len(s) for s in devices]
    end = [[0.0] * len(s) for s in devices]
    ptr = [0] * pp
    free = [0.0] * pp
    pairs = schedule.overlapped
    KF, KB, KW, KBW = Kind.F, Kind.B, Kind.W, Kind.BW
    mnc = m * nc
    stack = list(range(pp - 1, -1, -1))

    dev = [device_of(c, pp, schedule.placement) for c in range(nc)]

    def ready(kind, mb, c):
        """Earliest start from dependencies (core.rules.needs), or (-1, event) when one is not done."""
        r = 0.0
        for ev, m2, c2 in rules.needs(kind, mb, c, nc):
            key = ev * mnc + m2 * nc + c2
            e = done[key]
            if e < 0:
                return -1.0, key
            e += comm if dev[c2] != dev[c] else 0.0
            if e > r:
                r = e
        return r, -1

    def dur(kind, c):
        return rules.duration(kind, c, dF, dB, dW)

    def finish(kind, mb, c, t):
        for ev in (e * mnc + mb * nc + c for e in rules.PRODUCES[kind]):
            done[ev] = t
            w = waiters.pop(ev, None)
            if w:
                stack.extend(w)

    while stack:
        d = stack.pop()
        seq = devices[d]
        i = ptr[d]
        n = len(seq)
        t_free = free[d]
        st, en = start[d], end[d]
        while i < n:
            kind, mb, c = seq[i]
            if not (0 <= mb < m and 0 <= c < nc) or kind.__class__ is not Kind:
                raise DeadlockError(f"device {d} position {i}: job {seq[i]} is out of range "
                                    f"(microbatches 0..{m - 1}, chunks 0..{nc - 1})", [])
            if pairs and (d, i) in pairs and i + 1 < n:
                r, wait = ready(kind, mb, c)
                k2, mb2, c2 = seq[i + 1]
                r2, wait2 = ready(k2, mb2, c2) if wait < 0 else (0.0, -1)
                wait = wait if wait >= 0 else wait2
                if wait >= 0:
                    waiters.setdefault(wait, []).append(d)
                    break
                s0 = max(t_free, r, r2)
                d1, d2 = dur(kind, c), dur(k2, c2)
                t = s0 + d1 + d2 - (1.0 - ov) * min(d1, d2)
                st[i] = st[i + 1] = s0
                en[i] = en[i + 1] = t
                finish(kind, mb, c, t)
                finish(k2, mb2, c2, t)
                t_free = t
                i += 2
                continue
            # inlined ready() / dur() / finish() for the common single-job case (hot loop): the same rules as
            # core.rules.needs / duration / PRODUCES, written out (tests/sim checks them against replay)
            base = mb * nc + c
            if kind is KF:
                if c:
                    r = done[base - 1]
                    if r < 0:
                        waiters.setdefault(base - 1, []).append(d)
                        break
                    r += fcomm[c]
                else:
                    r = 0.0
                dt = dF[c]
                ev = base
            elif kind is KW:
                r = done[mnc + base]
                if r < 0:
                    waiters.setdefault(mnc + base, []).append(d)
                    break
                dt = dW[c]
                ev = 2 * mnc + base
            else:
                r = done[base]
                if r < 0:
                    waiters.setdefault(base, []).append(d)
                    break
                if c < nc - 1:
                    e2 = done[mnc + base + 1]
                    if e2 < 0:
                        waiters.setdefault(mnc + base + 1, []).append(d)
                        break
                    e2 += bcomm[c]
                    if e2 > r:
                        r = e2
                dt = dB[c] if kind is KB else dB[c] + dW[c]
                ev = mnc + base
            s0 = t_free if t_free > r else r
            t = s0 + dt
            if kind is KBW:  # fused backward also completes the weight grad
                done[2 * mnc + base] = t
                if waiters:
                    w = waiters.pop(2 * mnc + base, None)
                    if w:
                        stack.extend(w)
            st[i] = s0
            en[i] = t
            t_free = t
            done[ev] = t
            if waiters:
                w = waiters.pop(ev, None)
                if w:
                    stack.extend(w)
            i += 1
        ptr[d] = i
        free[d] = t_free

    stuck = [(d, ptr[d]) for d in range(pp) if ptr[d] < len(devices[d])]
    if stuck:
        details = []
        for d, i in stuck:
            job = devices[d][i]
            details.append((d, i, str(job), _waits_for(job, nc, done, mnc)))
        msg = "deadlock: " + "; ".join(f"device {d} is stuck at position {i} on {j}, waiting for {w}"
                                       for d, i, j, w in details)
        raise DeadlockError(msg, details)

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


def _waits_for(job, nc: int, done: list[float], mnc: int) -> str:
    kind, mb, c = job
    base = mb * nc + c
    if kind is Kind.F:
        return f"F{mb}.{c - 1}"
    if kind is Kind.W:
        return f"B{mb}.{c}"
    if done[base] < 0:
        return f"F{mb}.{c}"
    return f"the input grad of chunk {c + 1} (B{mb}.{c + 1} or BW{mb}.{c + 1})"
