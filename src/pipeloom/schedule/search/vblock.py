"""Building-block V schedules at a memory budget (private helper, no torch).

pipeloom's own implementation of the *idea* of the controllable-memory construction (Qi et al.
2024, "Pipeline Parallelism with Controllable Memory"): every device repeats one fixed pattern
of its four passes per microbatch, each shifted by a period of 6 unit slots (F and B of both
local chunks and two W), so that a microbatch's activations on a device live for a fixed
number of slots (its *lifespan*): the lifespans, hence the memory, are set by the pattern's
shape, not by a greedy. A block is described by :class:`Block`:

* the forward of chunk 0 runs down the devices ``s0`` slots apart, turns on the last device
  ``1 + t1`` slots later into chunk 1, which runs back up ``s1`` slots apart;
* after a gap of ``1 + g`` slots on device 0, the input-grad backward B of chunk 1 runs down
  ``s2`` slots apart, turns on the last device ``1 + t3`` slots later and B of chunk 0 runs
  up ``s3`` slots apart.

(With all steps 1 this is the paper's V-Min block, steps 2/1/2/1 its V-Half block.) A block is
usable when each device's four passes fall on four different slots modulo 6; the two slots
left per period take the weight-grad jobs W (oldest B first). The repeated pattern is then
*squeezed*: in the warm-up and the cool-down (outside the steady state that starts with
device 0's first chunk-0 B and ends with its last chunk-0 F) each job moves to the earliest
free slot after its dependencies where the device's memory stays within the cap. The
per-device slot order is the schedule; it is re-timed with the real per-chunk costs and
``comm`` by the caller (:func:`pipeloom.schedule.search.localsearch.result_of`), which also checks the
memory limit under the real memory model. Only V placement with two chunks per device.
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import product
from typing import Iterator

from ...core import rules
from ...core.ir import Job, Kind, Placement
from ...sim import kernel
from .accel import accelerated, ext

PERIOD = 6
_new = tuple.__new__  # Job is a NamedTuple: tuple.__new__(Job, ...) skips its __new__ wrapper (393k jobs at pp 128)
_F0, _F1, _B1, _B0, _W = 0, 1, 2, 3, 4


@dataclass(frozen=True, slots=True)
class Block:
    """One building block (see the module docstring); recorded as the schedule's policy."""

    s0: int = 1
    s1: int = 1
    s2: int = 1
    s3: int = 1
    t1: int = 0
    g: int = 0
    t3: int = 0
    period: int = PERIOD
    """slots per microbatch: 6 (four passes and two W) or more (idle slots: less memory, below V-Min)"""
    second: str = "w"
    """second squeeze of the cool-down without the W jobs: 'w' (F and B move; memory counted with W in
    the free slots), 'b' (only B moves; W counted right after its B), '' (none)"""
    builder: str = "vblock"


def applies(prob) -> bool:
    return prob.vpp == 2 and prob.placement is Placement.V


def offsets(pp: int, blk: Block) -> list[list[int]] | None:
    """Per device the slots of F0, F1, B1, B0 of microbatch 0; None when two collide modulo the period."""
    return _offsets(pp, blk.s0, blk.s1, blk.s2, blk.s3, blk.t1, blk.g, blk.t3, blk.period)


@lru_cache(maxsize=4096)
def _offsets(pp, s0, s1, s2, s3, t1, g, t3, period):
    f1_last = s0 * (pp - 1) + 1 + t1
    b1_0 = f1_last + s1 * (pp - 1) + 1 + g
    b0_last = b1_0 + s2 * (pp - 1) + 1 + t3
    out = []
    for i in range(pp):
        row = [s0 * i, f1_last + s1 * (pp - 1 - i), b1_0 + s2 * i, b0_last + s3 * (pp - 1 - i)]
        r0, r1, r2, r3 = (x % period for x in row)
        if r0 == r1 or r0 == r2 or r0 == r3 or r1 == r2 or r1 == r3 or r2 == r3:
            return None
        out.append(row)
    return out


def build(prob, blk: Block, cap: float | None = None) -> list[list[Job]] | None:
    """Per-device job lists of block ``blk`` for ``prob`` (vpp 2, V placement), or None if unusable."""
    pp, m = prob.pp, prob.m
    base = offsets(pp, blk)
    if base is None:
        return None
    nc = 2 * pp
    mF, mB, mW = prob.mF, prob.mB, prob.mW  # memory rule (core.rules): F +a, B -b, W -(a-b)
    chunk = [[d, nc - 1 - d] for d in range(pp)]  # local chunk -> global chunk
    # slot times T[d][type][mb] of F0, F1, B1, B0, then W of chunk 1 and W of chunk 0 (types 4, 5)
    T = [[[base[d][k] + blk.period * j for j in range(m)] for k in range(4)] for d in range(pp)]
    for d in range(pp):
        T[d].extend(_put_w(T[d], m))
    # memory change of each type on device d
    dm = [[mF[chunk[d][0]], mF[chunk[d][1]], mB[chunk[d][1]], mB[chunk[d][0]], mW[chunk[d][1]], mW[chunk[d][0]]]
          for d in range(pp)]
    if cap is None:
        cap = prob.limit
    _squeeze(pp, m, T, dm, cap, 6, movable=(0, 1, 2, 3, 4, 5))
    T = [row[:4] for row in T]
    if blk.second == "b":  # without W: B into the slots W left (cool-down only)
        _squeeze(pp, m, T, dm, cap, 4, movable=(2, 3), warm=False)
    elif blk.second == "w":
        _squeeze_implicit_w(pp, m, T, dm, cap)
    seqs = []
    for d in range(pp):
        ev = sorted((T[d][k][j], k, j) for k in range(4) for j in range(m))
        seqs.append(_with_w(ev, chunk[d], dm[d], cap))
    return seqs


def _put_w(Td, m) -> list[list[int]]:
    """Slots of the W jobs (chunk 1's, chunk 0's) placed in the free slots of one device, oldest B first
    (one queue over both chunks)."""
    ev = sorted((Td[k][j], k) for k in range(4) for j in range(m))
    w = ([], [])
    due: list[int] = []  # local W types (0: chunk 1, 1: chunk 0) in B order
    head = 0
    t = 0
    i = 0
    n = len(ev)
    while i < n or head < len(due):
        if i < n and ev[i][0] == t:
            k = ev[i][1]
            i += 1
            if k == _B1:
                due.append(0)
            elif k == _B0:
                due.append(1)
        elif head < len(due):
            w[due[head]].append(t)
            head += 1
        t += 1
    return [w[0], w[1]]


def _with_w(ev, chunks, dm, cap) -> list[Job]:
    """Jobs in slot order with W placed in the free slots (chunk-1 W first, oldest B first), rest at the end.

    ``dm``: the memory change of each type on the device; a forward that would lift memory over
    ``cap`` first runs pending W jobs (the slots moved by the squeeze can leave a W later than
    the memory check assumed)."""
    out: list[Job] = []
    app = out.append
    new = _new
    KF, KB, KW = Kind.F, Kind.B, Kind.W
    c0, c1 = chunks
    p0: deque = deque()  # per local chunk, microbatches whose W is due (FIFO)
    p1: deque = deque()
    w0, w1 = dm[5], dm[4]
    lim = cap + 1e-9
    mem = 0.0
    t = ev[0][0] if ev else 0
    i = 0
    n = len(ev)
    while i < n:
        slot, k, j = ev[i]
        if slot <= t:
            i += 1
            if k <= _F1:
                x = dm[k]
                while mem + x > lim:  # pending W first (chunk 1's, then chunk 0's)
                    if p1:
                        app(new(Job, (KW, p1.popleft(), c1)))
                        mem += w1
                    elif p0:
                        app(new(Job, (KW, p0.popleft(), c0)))
                        mem += w0
                    else:
                        break
                app(new(Job, (KF, j, chunks[k])))
            elif k == _B1:
                app(new(Job, (KB, j, c1)))
                p1.append(j)
            else:
                app(new(Job, (KB, j, c0)))
                p0.append(j)
            mem += dm[k]
            t = (t if t > slot else slot) + 1
            continue
        if p1:  # a free slot: one W if any is due
            app(new(Job, (KW, p1.popleft(), c1)))
            mem += w1
        elif p0:
            app(new(Job, (KW, p0.popleft(), c0)))
            mem += w0
        t += 1
    for mb in p1:
        app(new(Job, (KW, mb, c1)))
    for mb in p0:
        app(new(Job, (KW, mb, c0)))
    return out


def _deps(T, pp, d, k, j) -> int:
    """The latest slot of what job ``j`` of type ``k`` on device ``d`` waits for: the job before it in its row
    and the jobs that complete the events it needs (:func:`_dep_table`)."""
    dep = T[d][k][j - 1] if j else -1
    for d2, k2 in _dep_table(pp)[d][k]:
        x = T[d2][k2][j]
        if x > dep:
            dep = x
    return dep


@lru_cache(maxsize=64)
def _dep_table(pp: int) -> tuple[tuple[tuple[tuple[int, int], ...], ...], ...]:
    """Per device and type (F0, F1, B1, B0, W of chunk 1, W of chunk 0), the (device, type) of the jobs that complete
    the events it needs: :func:`pipeloom.core.rules.needs` as the timing kernel's tables read it (V placement,
    two chunks per device: local chunk 0 = chunk d, local chunk 1 = chunk 2pp-1-d)."""
    nc = 2 * pp
    tables = kernel.Rules.make(pp, nc, Placement.V)
    kinds = (Kind.F, Kind.F, Kind.B, Kind.B, Kind.W, Kind.W)
    local1 = (False, True, True, False, True, False)
    where = {}  # (kind, chunk) -> (device, type)
    for d in range(pp):
        for k in range(4):
            where[(kinds[k], nc - 1 - d if local1[k] else d)] = (d, k)
    made_by = {rules.ACT: Kind.F, rules.GRAD: Kind.B}  # the job of the block that completes each event
    out = []
    for d in range(pp):
        row = []
        for k in range(6):
            c = nc - 1 - d if local1[k] else d
            row.append(tuple(where[(made_by[ev], c + off)]
                             for ev, off, _cm in tables.needs[kernel.KIND_INDEX[kinds[k]] * nc + c]))
        out.append(tuple(row))
    return tuple(out)


def _squeeze(pp, m, T, dm, cap, ntypes, movable, warm=True):
    """Move warm-up and cool-down jobs (types in ``movable``) to the earliest free slot after their
    dependencies where the device's running memory stays within ``cap`` (in place).

    Without W jobs (``ntypes`` 4) memory is counted as if W ran right after its B, so only moves
    that never raise memory (B) are made then. Runs :func:`_squeeze_py` (the specification) or its
    compiled form ``vblock_squeeze`` in ``_accel.c`` (the same slots: tests/schedule/test_vblock_c.py)."""
    if accelerated():
        out = ext.vblock_squeeze(pp, m, ntypes, _flat(T, ntypes), [x for row in dm for x in row], float(cap),
                                 list(_unsteady_jobs(T, pp, ntypes, m)), _dep_flat(pp),
                                 [int(k in movable) for k in range(ntypes)], bool(warm))
        _unflat(T, out, pp, ntypes, m)
        return
    _squeeze_py(pp, m, T, dm, cap, ntypes, movable, warm)


def _flat(T, ntypes: int) -> list[int]:
    return [x for rows in T for row in rows[:ntypes] for x in row]


def _unflat(T, flat: list[int], pp: int, ntypes: int, m: int) -> None:
    for d in range(pp):
        for k in range(ntypes):
            at = (d * ntypes + k) * m
            T[d][k][:] = flat[at:at + m]


@lru_cache(maxsize=64)
def _dep_flat(pp: int) -> tuple[int, ...]:
    """:func:`_dep_table` as the compiled squeezes read it: per device and type two (device, type) pairs, -1 padded."""
    out: list[int] = []
    for row in _dep_table(pp):
        for pairs in row:
            flat = [x for pair in pairs for x in pair]
            out += flat + [-1] * (4 - len(flat))
    return tuple(out)


def _squeeze_py(pp, m, T, dm, cap, ntypes, movable, warm=True):
    """:func:`_squeeze` in Python."""
    horizon = max(T[d][k][m - 1] for d in range(pp) for k in range(ntypes)) + 2
    occ = [bytearray(horizon) for _ in range(pp)]
    run = [[0.0] * horizon for _ in range(pp)]
    for d in range(pp):
        delta = [0.0] * (horizon + 1)
        for k in range(ntypes):
            x = dm[d][k] if ntypes == 6 or k < _B1 else dm[d][k] + dm[d][4 if k == _B1 else 5]
            for t in T[d][k]:
                occ[d][t] = 1
                delta[t] += x
        cur = 0.0
        r = run[d]
        for t in range(horizon):
            cur += delta[t]
            r[t] = cur
    if horizon >= VECTOR_HORIZON:
        # long rows: a move adds its memory to every slot it crosses (pp 128, m 512: 115 000 moves over
        # 27 million slots), done on an array (the same float64 sums, in C)
        import numpy as np

        run = [np.array(r, dtype=np.float64) for r in run]
    vec = horizon >= VECTOR_HORIZON
    mov = [k in movable for k in range(ntypes)]
    for t, d, k, j, cool in _unsteady_jobs(T, pp, ntypes, m):
        if not mov[k] or not (warm or cool):
            continue
        dep = _deps(T, pp, d, k, j)
        x = dm[d][k] if ntypes == 6 or k < _B1 else dm[d][k] + dm[d][4 if k == _B1 else 5]
        o = occ[d]
        r = run[d]
        s = o.find(0, dep + 1, t) if dep + 1 < t else -1  # the free slots, found in C (the block is dense)
        while s >= 0:
            if x > 0 and (r[s:t].max() if vec else max(r[s:t])) + x > cap + 1e-9:
                s = o.find(0, s + 1, t) if s + 1 < t else -1
                continue
            o[t] = 0
            o[s] = 1
            if not vec:
                for u in range(s, t):
                    r[u] += x
            else:
                r[s:t] += x
            T[d][k][j] = s
            break


#: rows of at least this many slots keep their running memory in an array in :func:`_squeeze`
VECTOR_HORIZON = 1024


def _phased_jobs(T, pp: int, ntypes: int, m: int):
    """Every job of the block in time order, ``(t, d, k, j, steady, cool)``: steady from device 0's first B
    (while it still has forwards left) until its last F, cool-down after that (the job that ends the steady
    phase is not yielded). Each job's next time is read when the job is yielded, so a caller may move
    ``T[d][k][j]`` earlier without disturbing the order. (The specification of :func:`_unsteady_jobs`.)"""
    heap = [(T[d][k][0], d, k, 0) for d in range(pp) for k in range(ntypes)]
    heapq.heapify(heap)
    steady = cool = False
    f0_dev0 = 0
    while heap:
        t, d, k, j = heapq.heappop(heap)
        if j + 1 < m:
            heapq.heappush(heap, (T[d][k][j + 1], d, k, j + 1))
        if d == 0 and k == _B0 and j == 0:
            steady = f0_dev0 < m
        if d == 0 and k == _F0:
            f0_dev0 += 1
            if steady and f0_dev0 == m:
                steady, cool = False, True
                continue
        yield t, d, k, j, steady, cool


def _unsteady_jobs(T, pp: int, ntypes: int, m: int):
    """:func:`_phased_jobs` without its steady jobs (which every squeeze skips), ``(t, d, k, j, cool)``.

    The walk yields the jobs in the order of their times *before* any move (a job's successor on its row is
    read when the job is yielded, before the caller moves it), and every row rises (a move never passes the
    row's previous job: :func:`_deps`). So the steady phase is one interval of that order, from
    ``K1 = (T[0][B0][0], 0, B0, 0)`` to ``K2 = (T[0][F0][m-1], 0, F0, m-1)`` (not yielded): the warm-up is each
    row's prefix below K1, the cool-down its suffix above K2, sorted together. When K2 comes first the steady
    phase never starts and every job is warm-up (pp 128, m 512: 1.3 million jobs walked -> 0.2 million)."""
    k1 = (T[0][_B0][0], 0, _B0, 0)
    k2 = (T[0][_F0][m - 1], 0, _F0, m - 1)
    if k2 < k1:
        for t, d, k, j, _steady, cool in _phased_jobs(T, pp, ntypes, m):
            yield t, d, k, j, cool
        return
    warm, cool = [], []
    for d in range(pp):
        for k in range(ntypes):
            row = T[d][k]
            for j in range(m):
                key = (row[j], d, k, j)
                if key >= k1:
                    break
                warm.append(key)
            for j in range(m - 1, -1, -1):
                key = (row[j], d, k, j)
                if key <= k2:
                    break
                cool.append(key)
    warm.sort()
    cool.sort()
    for t, d, k, j in warm:
        yield t, d, k, j, False
    for t, d, k, j in cool:
        yield t, d, k, j, True


def _peak_implicit_w(row, dm) -> float:
    """Peak memory of one device whose slots hold the types in ``row`` (-1 = free), W in the free slots
    (chunk 1's first, in B order)."""
    due1 = due0 = 0
    cur = pk = 0.0
    d0, d1, d2, d3, d4, d5 = dm
    for k in row:
        if k < 0:
            if due1:
                due1 -= 1
                cur += d4
            elif due0:
                due0 -= 1
                cur += d5
            continue
        if k == 0:
            cur += d0
        elif k == 1:
            cur += d1
        elif k == 2:
            cur += d2
            due1 += 1
        else:
            cur += d3
            due0 += 1
        if cur > pk:
            pk = cur
    return pk


def _squeeze_implicit_w(pp, m, T, dm, cap):
    """Second squeeze (cool-down only, F and B, no W jobs): a move is kept when the device's peak, with W
    in the free slots, stays within ``cap`` (in place). Runs :func:`_squeeze_implicit_w_py` (the
    specification) or its compiled form ``vblock_squeeze_w`` in ``_accel.c``."""
    if accelerated():
        out = ext.vblock_squeeze_w(pp, m, _flat(T, 4), [x for row in dm for x in row], float(cap),
                                   list(_unsteady_jobs(T, pp, 4, m)), _dep_flat(pp))
        _unflat(T, out, pp, 4, m)
        return
    _squeeze_implicit_w_py(pp, m, T, dm, cap)


def _squeeze_implicit_w_py(pp, m, T, dm, cap):
    """:func:`_squeeze_implicit_w` in Python."""
    horizon = max(T[d][k][m - 1] for d in range(pp) for k in range(4)) + 1
    rows = []
    for d in range(pp):
        row = [-1] * (horizon + 2 * m + 2)  # room for the W tail
        for k in range(4):
            for t in T[d][k]:
                row[t] = k
        rows.append(row)
    states = [_w_states(row, dm[d]) for d, row in enumerate(rows)]
    # a device already over ``cap`` keeps the whole-row check (a move might bring it under); the others
    # check only the slots a move changes (:func:`_move_fits`): the same answer in time ~ the distance moved
    # (pp 128, m 512: about 20 s -> 0.3 s)
    fast = [st[3] <= cap + 1e-9 for st in states]
    for t, d, k, j, cool in _unsteady_jobs(T, pp, 4, m):
        if not cool:
            continue
        dep = _deps(T, pp, d, k, j)
        row = rows[d]
        for s in range(dep + 1, t):
            if row[s] >= 0:
                continue
            row[s], row[t] = k, -1
            if (_move_fits(row, dm[d], states[d], s, t, cap) if fast[d]
                    else _peak_implicit_w(row, dm[d]) <= cap + 1e-9):
                T[d][k][j] = s
                if fast[d]:
                    _move_fits(row, dm[d], states[d], s, t, cap, update=True)
                else:
                    states[d] = _w_states(row, dm[d])
                    fast[d] = states[d][3] <= cap + 1e-9
                break
            row[s], row[t] = -1, k


def _w_states(row, dm) -> tuple[list[int], list[int], list[float], float]:
    """The walk of :func:`_peak_implicit_w` over ``row``: after each slot the chunk-1 and chunk-0 W still due and
    the memory level; and the peak (over job slots: a free slot's W only lowers the level)."""
    n = len(row)
    s1, s0, lv = [0] * n, [0] * n, [0.0] * n
    due1 = due0 = 0
    cur = pk = 0.0
    d0, d1, d2, d3, d4, d5 = dm
    for i, k in enumerate(row):
        if k < 0:
            if due1:
                due1 -= 1
                cur += d4
            elif due0:
                due0 -= 1
                cur += d5
        else:
            cur += (d0, d1, d2, d3)[k]
            if k == 2:
                due1 += 1
            elif k == 3:
                due0 += 1
            if cur > pk:
                pk = cur
        s1[i], s0[i], lv[i] = due1, due0, cur
    return s1, s0, lv, pk


def _move_fits(row, dm, st, s, t, cap, update=False) -> bool:
    """Whether ``row`` (changed at slots ``s`` < ``t`` only, from a row whose peak was within ``cap``, with
    ``st`` its :func:`_w_states`) still peaks within ``cap``: the walk of :func:`_peak_implicit_w` from slot
    ``s`` until, past ``t``, its state equals the old one (from there on nothing differs). With ``update``
    ``st`` is rewritten for the new row instead (the move is kept)."""
    s1, s0, lv, _pk = st
    if s:
        due1, due0, cur = s1[s - 1], s0[s - 1], lv[s - 1]
    else:
        due1 = due0 = 0
        cur = 0.0
    d0, d1, d2, d3, d4, d5 = dm
    for i in range(s, len(row)):
        k = row[i]
        if k < 0:
            if due1:
                due1 -= 1
                cur += d4
            elif due0:
                due0 -= 1
                cur += d5
        else:
            cur += (d0, d1, d2, d3)[k]
            if k == 2:
                due1 += 1
            elif k == 3:
                due0 += 1
            if cur > cap + 1e-9 and not update:
                return False
        if i > t and due1 == s1[i] and due0 == s0[i] and abs(cur - lv[i]) <= 1e-12:
            return True
        if update:
            s1[i], s0[i], lv[i] = due1, due0, cur
    return True


#: the step shapes tried, most useful first (V-Min's all-1 and V-Half's 2/1/2/1 lead)
STEPS = ((1, 1, 1, 1), (2, 1, 2, 1), (1, 2, 1, 2), (2, 2, 2, 2), (2, 1, 1, 1), (1, 1, 2, 1),
         (1, 2, 1, 1), (1, 1, 1, 2), (3, 1, 3, 1), (2, 2, 1, 1), (1, 1, 2, 2))


#: the periods tried, in order, until some block fits the limit (7 and more: budgets below V-Min's)
PERIODS = (6, 7, 8, 9, 10, 12)

#: the second-squeeze variants tried for every block (see :attr:`Block.second`)
SECOND = ("w", "b", "")


def blocks(pp: int, max_gap: int | None = None, period: int = PERIOD) -> Iterator[Block]:
    """Usable blocks for ``pp`` devices: every step shape, turn gaps 0-1, device-0 gap 0..max_gap (with the
    default second squeeze; :func:`candidates` adds the other variants)."""
    if max_gap is None:
        max_gap = 2 * PERIOD
    for steps in STEPS:
        for t1, t3 in product((0, 1), (0, 1)):
            for g in range(max_gap + 1):
                blk = Block(*steps, t1=t1, g=g, t3=t3, period=period)
                if offsets(pp, blk) is not None:
                    yield blk


def pattern_peak(prob, blk: Block, stop: float = float("inf")) -> float | None:
    """The largest memory of any device running the unsqueezed repeated block (W in the free slots);
    the squeeze never raises it above the limit, so a block over the limit is not worth building."""
    pp = prob.pp
    base = offsets(pp, blk)
    if base is None:
        return None
    # enough microbatches to reach the steady state: the longest lifespan on a device, in periods, plus slack
    life = max(row[3] - row[0] for row in base)
    m = min(prob.m, life // blk.period + 4)
    nc = 2 * pp
    mF, mB, mW = prob.mF, prob.mB, prob.mW  # memory rule (core.rules)
    out = 0.0
    for d in range(pp):
        c0, c1 = d, nc - 1 - d
        Td = [[base[d][k] + blk.period * j for j in range(m)] for k in range(4)]
        w1, w0 = _put_w(Td, m)
        dm = (mF[c0], mF[c1], mB[c1], mB[c0], mW[c1], mW[c0])
        ev = sorted([(t, k) for k in range(4) for t in Td[k]] + [(t, 4) for t in w1] + [(t, 5) for t in w0])
        cur = 0.0
        for _t, k in ev:
            cur += dm[k]
            if cur > out:
                out = cur
        if out > stop:  # over ``stop``: the exact peak is not needed
            return out
    return out


#: above this many jobs the blocks are ordered by their lifespans instead of their exact pattern peak (cheaper)
EXACT_ORDER_MAX_JOBS = 1000


def _lifespan(pp: int, blk: Block) -> float:
    """Slots from F to B summed over the two chunks, largest over the devices, in periods (a memory proxy)."""
    base = offsets(pp, blk)
    return max(row[3] - row[0] + row[2] - row[1] for row in base) / blk.period


def candidates(prob, max_jobs: int) -> Iterator[tuple[list[list[Job]], Block]]:
    """Job lists of the usable blocks whose repeated pattern fits the limit, the roomiest first, while the
    jobs built stay within ``max_jobs`` (each build places every job once)."""
    if not applies(prob):
        return
    njobs = 3 * prob.m * prob.nc
    stop = prob.limit + 1e-9
    if njobs > EXACT_ORDER_MAX_JOBS:  # big shapes: check the roomiest (by lifespan) first, build the first fits
        spent = 0
        for period in PERIODS:
            found = False
            for blk in sorted(blocks(prob.pp, period=period), key=lambda b: -_lifespan(prob.pp, b)):
                pk = pattern_peak(prob, blk, stop)
                if pk is None or pk > stop:
                    continue
                found = True
                for second in SECOND:
                    if spent + njobs > max_jobs:
                        return
                    spent += njobs
                    seqs = build(prob, replace(blk, second=second))
                    if seqs is not None:
                        yield seqs, replace(blk, second=second)
            if found:
                return
        return
    fits = []
    for period in PERIODS:  # longer periods (idle slots, less memory) only when no shorter one fits
        for blk in blocks(prob.pp, period=period):
            pk = pattern_peak(prob, blk, stop)
            if pk is not None and pk <= stop:
                for second in SECOND:
                    fits.append((-pk, len(fits), replace(blk, second=second)))
        if fits:
            break
    fits.sort()
    spent = 0
    for _pk, _i, blk in fits:
        if spent + njobs > max_jobs:
            return
        spent += njobs
        seqs = build(prob, blk)
        if seqs is not None:
            yield seqs, blk
