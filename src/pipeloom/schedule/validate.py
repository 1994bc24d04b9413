"""Validator: every violation of a schedule, each as a clear one-line message (no torch).

Checks: shape (pp lists, chunks/microbatches in range, each chunk on its placement's device);
each (kind, microbatch, chunk) exactly once with either B+W or BW per (microbatch, chunk);
same-device order (F of chunk k before F of chunk k+1, B after its F and after the next chunk's
B, W after its B); no deadlock when devices run their lists in order with blocking
dependencies; peak memory never above the limit.
"""
from __future__ import annotations

from collections import Counter

from ..sim.costs import Costs, MemModel
from ..sim.simulate import DeadlockError, memory_profile, simulate
from .ir import Kind, Schedule

_EPS = 1e-9


class ValidationError(ValueError):
    def __init__(self, violations: list[str]):
        self.violations = violations
        head = violations[0] if violations else "invalid schedule"
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        super().__init__(head + more)


def validate(schedule: Schedule, *, mem: MemModel | None = None, mem_limit: float | None = None,
             max_messages: int = 50) -> list[str]:
    """Return the list of violations (empty = valid)."""
    out: list[str] = []
    pp, vpp, m = schedule.pp, schedule.vpp, schedule.microbatches
    nc = pp * vpp
    if pp < 1 or vpp < 1 or m < 1:
        return [f"bad shape pp={pp} vpp={vpp} microbatches={m}: each must be >= 1"]
    if len(schedule.devices) != pp:
        return [f"schedule has {len(schedule.devices)} device lists but pp={pp}"]
    counts: Counter = Counter()
    pos: dict[tuple, tuple[int, int]] = {}
    for d, i, job in schedule.jobs():
        kind, mb, c = job
        if not (0 <= c < nc):
            out.append(f"device {d} position {i}: {job} names chunk {c}, allowed 0..{nc - 1}")
            continue
        if not (0 <= mb < m):
            out.append(f"device {d} position {i}: {job} names microbatch {mb}, allowed 0..{m - 1}")
            continue
        home = schedule.device_of(c)
        if home != d:
            out.append(f"device {d} position {i}: {job} belongs on device {home} "
                       f"({schedule.placement.value} placement puts chunk {c} there)")
        counts[job] += 1
        pos[job] = (d, i)
    for job, n in counts.items():
        if n > 1:
            out.append(f"{job} appears {n} times; each job must run exactly once")
    for mb in range(m):
        for c in range(nc):
            f, b, w, bw = (counts.get((k, mb, c), 0) for k in (Kind.F, Kind.B, Kind.W, Kind.BW))
            if f == 0:
                out.append(f"F{mb}.{c} is missing (device {schedule.device_of(c)})")
            if bw and (b or w):
                out.append(f"microbatch {mb} chunk {c} has both BW and B/W; use either BW or B plus W")
            elif not bw:
                if b == 0:
                    out.append(f"B{mb}.{c} is missing (device {schedule.device_of(c)}); give B and W, or BW")
                if w == 0:
                    out.append(f"W{mb}.{c} is missing (device {schedule.device_of(c)}); give B and W, or BW")
    if len(out) >= max_messages:
        return out[:max_messages]
    # same-device ordering, reported with positions (cross-device order shows up as deadlock)
    for job, (d, i) in pos.items():
        kind, mb, c = job
        reqs = []
        if kind is Kind.F and c > 0:
            reqs.append((Kind.F, mb, c - 1))
        elif kind in (Kind.B, Kind.BW):
            reqs.append((Kind.F, mb, c))
            if c < nc - 1:
                reqs.extend([(Kind.B, mb, c + 1), (Kind.BW, mb, c + 1)])
        elif kind is Kind.W:
            reqs.append((Kind.B, mb, c))
        for r in reqs:
            p = pos.get(r)
            if p and p[0] == d and p[1] > i:
                out.append(f"device {d} position {i}: {job} runs before {_fmt(r)} (position {p[1]}) that it needs")
    for d, i in schedule.overlapped:
        if not (0 <= d < pp and 0 <= i < len(schedule.devices[d]) - 1):
            out.append(f"overlapped pair ({d}, {i}) does not name two consecutive jobs")
    if out:
        return out[:max_messages]
    try:
        simulate(schedule, Costs())
    except DeadlockError as e:
        out.append(str(e))
    if mem_limit is not None:
        peaks, _ = memory_profile(schedule, mem)
        for d, p in enumerate(peaks):
            if p > mem_limit + _EPS:
                out.append(f"device {d}: peak memory {p:g} units exceeds the limit {mem_limit:g}")
    return out[:max_messages]


def check(schedule: Schedule, **kw) -> Schedule:
    """Raise :class:`ValidationError` unless valid; return the schedule."""
    v = validate(schedule, **kw)
    if v:
        raise ValidationError(v)
    return schedule


def _fmt(job) -> str:
    k, mb, c = job
    return f"{k.value}{mb}.{c}"
