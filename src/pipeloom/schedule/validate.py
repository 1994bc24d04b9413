"""Validator: every violation of a schedule, each as a clear one-line message (no torch).

Checks: shape (pp lists, chunks/microbatches in range, each chunk on its placement's device);
each (kind, microbatch, chunk) exactly once with either B+W or BW per (microbatch, chunk);
same-device order (F of chunk k before F of chunk k+1, B after its F and after the next chunk's
B, W after its B); no deadlock when devices run their lists in order with blocking
dependencies; peak memory never above the limit.

A schedule that carries a builder's ``witness`` (see :class:`~pipeloom.core.ir.Schedule`)
and has many jobs is first checked by :func:`_proven_valid`: the same rules checked in one
pass of compiled code (``_accel.c``), with the witness ranks as the proof that no deadlock
exists (every dependency and every device's order goes from a lower to a higher
rank, so the devices can always run their lists to the end). Only when that check passes is
the schedule reported valid without the job-by-job checks below; any failure, or no witness,
runs them and they produce the messages.
"""
from __future__ import annotations

from ..core import rules
from ..core.costs import Costs, MemModel
from ..core.errors import DeadlockError, ValidationError, Violation
from ..sim.simulate import memory_profile, simulate
from ..core.ir import Kind, Schedule, device_of
from .search import accel
from ..core.rules import EPS as _EPS

#: schedules with fewer jobs are always checked job by job (fast enough; keeps messages one code path)
FAST_MIN_JOBS = 5_000


def summary(violations: list[str]) -> str:
    """The first violation, and how many more there are: ``"<first> (+N more)"``."""
    return violations[0] + (f" (+{len(violations) - 1} more)" if len(violations) > 1 else "")


def validate(schedule: Schedule, *, mem: MemModel | None = None, mem_limit: float | None = None,
             max_messages: int = 50) -> list[Violation]:
    """Return every broken rule as a :class:`Violation` (a message with a ``kind``; empty = valid)."""
    out: list[Violation] = []
    pp, vpp, m = schedule.pp, schedule.vpp, schedule.microbatches
    nc = pp * vpp
    if pp < 1 or vpp < 1 or m < 1:
        return [Violation("shape", f"bad shape pp={pp} vpp={vpp} microbatches={m}: each must be >= 1")]
    if len(schedule.devices) != pp:
        return [Violation("shape", f"schedule has {len(schedule.devices)} device lists but pp={pp}")]
    if schedule.witness is not None and schedule.num_jobs >= FAST_MIN_JOBS and _proven_valid(
            schedule, mem or MemModel(), mem_limit):
        return []
    home = [device_of(c, pp, schedule.placement) for c in range(nc)]
    mnc = m * nc
    kidx = {Kind.F: 0, Kind.B: 1, Kind.W: 2, Kind.BW: 3}
    # per (kind, mb, chunk) key: the device and position where it runs (-1 = absent)
    pos_dev = [-1] * (4 * mnc)
    pos_idx = [0] * (4 * mnc)
    count = [0] * (4 * mnc)
    for d, seq in enumerate(schedule.devices):
        for i, job in enumerate(seq):
            kind, mb, c = job
            if not (0 <= c < nc):
                out.append(Violation("shape", f"device {d} position {i}: {job} names chunk {c}, allowed 0..{nc - 1}"))
                continue
            if not (0 <= mb < m):
                out.append(Violation("shape", f"device {d} position {i}: {job} names microbatch {mb}, allowed 0..{m - 1}"))
                continue
            if home[c] != d:
                out.append(Violation("shape", f"device {d} position {i}: {job} belongs on device {home[c]} "
                                     f"({schedule.placement.value} placement puts chunk {c} there)"))
            key = kidx[kind] * mnc + mb * nc + c
            count[key] += 1
            pos_dev[key] = d
            pos_idx[key] = i
            if len(out) >= max_messages:
                return out
    for key in range(4 * mnc):
        if count[key] > 1:
            out.append(Violation("duplicate", f"{_key_str(key, m, nc)} appears {count[key]} times; each job must run exactly once"))
    for key in range(mnc):
        mb, c = divmod(key, nc)
        f, b, w, bw = count[key], count[mnc + key], count[2 * mnc + key], count[3 * mnc + key]
        if f == 0:
            out.append(Violation("missing", f"F{mb}.{c} is missing (device {home[c]})"))
        if bw and (b or w):
            out.append(Violation("duplicate", f"microbatch {mb} chunk {c} has both BW and B/W; use either BW or B plus W"))
        elif not bw:
            if b == 0:
                out.append(Violation("missing", f"B{mb}.{c} is missing (device {home[c]}); give B and W, or BW"))
            if w == 0:
                out.append(Violation("missing", f"W{mb}.{c} is missing (device {home[c]}); give B and W, or BW"))
        if len(out) >= max_messages:
            return out[:max_messages]
    # same-device ordering, reported with positions (cross-device order shows up as deadlock)
    # per (kind, chunk): the keys (relative to the job's own microbatch) of the producers of what it needs
    # (core.rules.needs / producers; a W belongs to a split backward, so it needs its own B)
    kinds = (Kind.F, Kind.B, Kind.W, Kind.BW)
    # (the producers' kinds do not depend on the chunk: looked up once per event, not per chunk at pp 65 536)
    prod_kinds = {(ev, split): tuple(kidx[p.kind] * mnc for p in rules.producers(ev, 0, 0, split=split))
                  for ev in (rules.ACT, rules.GRAD, rules.WGRAD) for split in (True, None)}
    needs_of = [[tuple(pk + c2 for ev, _, c2 in rules.needs(kind, 0, c, nc)
                       for pk in prod_kinds[(ev, True if kind is Kind.W else None)])
                 for c in range(nc)] for kind in kinds]
    for ki, table in enumerate(needs_of):
        off = ki * mnc
        for key in range(mnc):
            jk = off + key
            if not count[jk]:
                continue
            mb, c = divmod(key, nc)
            base = mb * nc
            dj, ij = pos_dev[jk], pos_idx[jk]
            for r in table[c]:
                rk = r + base
                if count[rk] and pos_dev[rk] == dj and pos_idx[rk] > ij:
                    out.append(Violation("order", f"device {dj} position {ij}: {_key_str(jk, m, nc)} runs before "
                                                  f"{_key_str(rk, m, nc)} (position {pos_idx[rk]}) that it needs"))
                    if len(out) >= max_messages:
                        return out
    for d, i in schedule.overlapped:
        if not (0 <= d < pp and 0 <= i < len(schedule.devices[d]) - 1):
            out.append(Violation("overlap", f"overlapped pair ({d}, {i}) does not name two consecutive jobs"))
    if out:
        return out[:max_messages]
    try:
        simulate(schedule, Costs())
    except DeadlockError as e:
        out.append(Violation("deadlock", str(e)))
    if mem_limit is not None:
        peaks, _ = memory_profile(schedule, mem)
        for d, p in enumerate(peaks):
            if p > mem_limit + _EPS:
                out.append(Violation("memory", f"device {d}: peak memory {p:g} units exceeds the limit {mem_limit:g}"))
    return out[:max_messages]


def _proven_valid(schedule: Schedule, mem: MemModel, mem_limit: float | None) -> bool:
    """All of :func:`validate`'s rules in one C pass, with ``schedule.witness`` as the deadlock proof.

    True only if every rule holds (see ``proven_valid`` in ``_accel.c``); False, or no C
    extension, sends the caller down the job-by-job checks.
    """
    a, b = mem.per_chunk(schedule.num_chunks, schedule.vpp)
    return accel.witness_check(schedule, a, b, mem_limit)


def _key_str(key: int, m: int, nc: int) -> str:
    k, rest = divmod(key, m * nc)
    mb, c = divmod(rest, nc)
    return f"{('F', 'B', 'W', 'BW')[k]}{mb}.{c}"


def check(schedule: Schedule, **kw) -> Schedule:
    """Raise :class:`ValidationError` unless valid; return the schedule."""
    v = validate(schedule, **kw)
    if v:
        raise ValidationError(v)
    return schedule
