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

Why the layout is not a policy of the list-scheduling loop (:mod:`pipeloom.sim.listsched`, which decides job by
job in time order from what the board has placed): a squeeze moves a job from its pattern slot ``t`` to the
earliest free slot ``s`` where the device's memory *at every slot from s to t*, jobs the pattern puts after
``s`` included, stays within the cap (the second squeeze: the whole row's peak), and it walks the jobs in the
order of their pattern slots, so a job walked later can take a slot earlier than one a job walked before it
took, by a check that reads that move. Slot ``s`` is decided by what comes after ``s``; a policy asked at ``s``
sees only the past, and could only replay a slot table computed first (the same algorithm plus a replay).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import product
from typing import Iterator

from ...core.ir import Job, Kind, Placement
from .vsqueeze import _squeeze, _squeeze_implicit_w
from .vsqueeze import _move_fits, _peak_implicit_w, _w_states  # noqa: F401 (tests reach them through this module)

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
        else:  # no W due: the free slots up to the next job change nothing
            t = slot
            continue
        t += 1
    for mb in p1:
        app(new(Job, (KW, mb, c1)))
    for mb in p0:
        app(new(Job, (KW, mb, c0)))
    return out


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
