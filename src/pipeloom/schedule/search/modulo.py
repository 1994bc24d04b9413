"""Modulo-scheduled V pipelines: one microbatch's timetable repeated every period, with real costs (no torch).

A candidate of the portfolio (:mod:`.portfolio`) for V placement under a memory limit, where the building
blocks of :mod:`.vblock` (laid out in unit slots, exact for F = B = W) leave bubbles: with uneven costs
(B about 2F, W about F, comm) a microbatch's chain down and up the V is longer than the slots assume.

The construction is modulo scheduling (software pipelining): find start times ``x(k, c)`` of microbatch 0's
jobs such that microbatch ``j`` can run the same timetable ``j * P`` later on every device without two jobs
overlapping, i.e. on each device the intervals ``[x, x + duration)`` taken modulo the period ``P`` are
disjoint. The jobs are placed in chain order (forwards down and up the V, then the input-grad backwards
back), each at the earliest time after its dependency where it fits the device's circle; then each W at the
first free place after its B. A microbatch then waits nowhere on its way through the V except where two jobs
of one device would collide, so the activation a device holds for it lives close to the shortest possible
time (the path from its forward to its backward): the memory of the pattern is set by ``P`` (a microbatch
every ``P`` time), and the candidates are the smallest periods whose pattern fits the limit.

The per-device order of all ``m`` timetables is the schedule; the caller re-times it with the kernel
(as soon as possible in that order: the warm-up and the cool-down compress by themselves) and checks the
memory limit (:func:`.localsearch.result_of`); memory depends on the order only.
"""
from __future__ import annotations

import math
from itertools import chain, repeat
from dataclasses import dataclass
from typing import Iterator

from ...core import rules
from ...core.ir import Job, Kind, Placement
from ...core.rules import EPS as _EPS


@dataclass(frozen=True, slots=True)
class Modulo:
    """One modulo pattern (recorded as the schedule's policy)."""

    period: float
    """time between consecutive microbatches' timetables"""
    builder: str = "modulo"


def applies(prob) -> bool:
    """V placement (any vpp >= 2)."""
    return prob.placement is Placement.V and prob.vpp >= 2


def work_period(prob) -> float:
    """Work of one microbatch on the busiest device: the shortest possible period."""
    return max(sum(prob.dF[c] + prob.dB[c] + prob.dW[c] for c in loc) for loc in prob.local)


class _Circle:
    """Busy intervals of one device modulo the period (sorted, non-overlapping starts in [0, P))."""

    __slots__ = ("P", "iv")

    def __init__(self, P: float):
        self.P = P
        self.iv: list[tuple[float, float]] = []

    def earliest(self, t0: float, dur: float) -> float | None:
        """Smallest t >= t0 where [t, t + dur) mod P is free; None if none within a period."""
        P = self.P
        if dur > P + _EPS:
            return None
        base = math.floor(t0 / P) * P
        s0 = t0 - base
        # candidate starts (mod P): s0 and every interval end at or after s0 (then the ones before, + P)
        cands = [s0] + sorted(((e % P) if e >= P else e) for _, e in self.iv)
        best = None
        for s in cands:
            if s < s0 - _EPS:
                s += P
            if s >= s0 + P - _EPS:
                continue
            if self._free(s % P, dur) and (best is None or s < best):
                best = s
        return None if best is None else base + best

    def _free(self, s: float, dur: float) -> bool:
        P = self.P
        e = s + dur
        for a, b in self.iv:
            # the interval [a, b) occupies [a, b) and, when it wraps, [a - P, b - P) and [a + P, b + P)
            for sh in (-P, 0.0, P):
                if a + sh < e - _EPS and s < b + sh - _EPS:
                    return False
        return True

    def add(self, t: float, dur: float) -> None:
        s = t % self.P
        self.iv.append((s, s + dur))


def pattern(prob, mod: Modulo) -> dict | None:
    """Microbatch 0's start times {(kind, chunk): t} of the pattern, or None when the period is too short."""
    P = mod.period
    nc = prob.nc
    circ = [_Circle(P) for _ in range(prob.pp)]
    x: dict = {}

    def put(k, c, ready, dur):
        d = prob.dev[c]
        t = circ[d].earliest(ready, dur)
        if t is None:
            return False
        circ[d].add(t, dur)
        x[(k, c)] = t
        return True

    t = 0.0
    for c in range(nc):
        ready = 0.0 if c == 0 else x[(Kind.F, c - 1)] + prob.dF[c - 1] + prob.fcomm[c]
        if not put(Kind.F, c, ready, prob.dF[c]):
            return None
    for c in range(nc - 1, -1, -1):
        ready = x[(Kind.F, c)] + prob.dF[c]
        if c != nc - 1:
            ready = max(ready, x[(Kind.B, c + 1)] + prob.dB[c + 1] + prob.bcomm[c])
        if not put(Kind.B, c, ready, prob.dB[c]):
            return None
    for loc in prob.local:  # W: oldest B first on each device
        for c in sorted(loc, key=lambda c: x[(Kind.B, c)]):
            if not put(Kind.W, c, x[(Kind.B, c)] + prob.dB[c], prob.dW[c]):
                return None
    return x


def build(prob, mod: Modulo, m: int | None = None, x: dict | None = None) -> list[list[Job]] | None:
    """Per-device job lists of ``m`` (default ``prob.m``) microbatches repeating the pattern, sorted by planned
    start (``x``: the pattern, if already made).

    The order is periodic, so it is generated, not sorted: a pattern job at ``t = q * P + s`` (``0 <= s < P``)
    runs for microbatch ``j`` in period ``q + j`` at offset ``s``; period by period, each device's pattern jobs
    in the order of their offsets (ties: kind F, B, W, then the earlier microbatch) give the ``j`` whose copy
    falls in it (pp 128, m 512: about half the time of sorting every copy; the steady state's copies come from
    C iterators, 0.26 -> 0.1 s)."""
    x = x or pattern(prob, mod)
    if x is None:
        return None
    m = prob.m if m is None else m
    P = mod.period
    ev: list[list[tuple]] = [[] for _ in range(prob.pp)]
    rank = {Kind.F: 0, Kind.B: 1, Kind.W: 2}
    for (k, c), t in x.items():
        q = math.floor(t / P)
        s = t - q * P
        if s >= P:  # rounding
            q, s = q + 1, s - P
        ev[prob.dev[c]].append((s, rank[k], -q, k, c))
    seqs = []
    new = tuple.__new__
    for lst in ev:
        lst.sort()
        pat = [(-nq, k, c) for _, _, nq, k, c in lst]
        if not pat:
            seqs.append([])
            continue
        qlo = min(q for q, _, _ in pat)
        qhi = max(q for q, _, _ in pat)
        # periods qlo .. qhi + m - 1; in the steady state qhi .. qlo + m - 1 every pattern job has a copy
        if qhi < qlo + m:
            head, tail = range(qlo, qhi), range(qlo + m, qhi + m)
        else:
            head, tail = range(qlo, qhi + m), range(0)
        out: list[Job] = []
        for n in head:
            out.extend([new(Job, (k, n - q, c)) for q, k, c in pat if 0 <= n - q < m])
        if qhi < qlo + m:  # the steady state, period-major, in pattern order (generated by C iterators)
            cols = [zip(repeat(k), range(qhi - q, qlo + m - q), repeat(c)) for q, k, c in pat]
            out.extend(map(new, repeat(Job), chain.from_iterable(zip(*cols))))
        for n in tail:
            out.extend([new(Job, (k, n - q, c)) for q, k, c in pat if 0 <= n - q < m])
        seqs.append(out)
    return seqs


def pattern_peak(prob, mod: Modulo, x: dict) -> float:
    """Peak memory of the pattern repeated for ``prob.m`` microbatches, in the order :func:`build` gives.

    Memory follows the order only, and the order is the pattern's start times, so the level right after a
    job that starts at ``tau`` is the sum over the device's pattern jobs ``(k, c)`` of their memory change
    times the number of microbatches whose copy has started by ``tau`` (no two jobs of a device start at
    the same time: the pattern has no collisions). The warm-up and the cool-down hold fewer microbatches
    than the steady state, so once ``m`` reaches it, its peak (taken one period after every job has started
    once) is the peak; for fewer microbatches the job lists are built and walked."""
    P = mod.period
    t0, t1 = min(x.values()), max(x.values())
    k = int(math.ceil((t1 - t0) / P)) + 1  # copies in flight at most (the steady state)
    if prob.m <= k:
        seqs = build(prob, mod, None, x)
        table = rules.memory_deltas(prob.nc, prob.a, prob.b)
        return max(rules.peak_memory(seq, prob.a, prob.b, table)[0] for seq in seqs)
    delta = {Kind.F: prob.mF, Kind.B: prob.mB, Kind.W: prob.mW}
    on: list[list[tuple[float, float]]] = [[] for _ in range(prob.pp)]
    for (kind, c), t in x.items():
        on[prob.dev[c]].append((t, delta[kind][c]))
    peak = 0.0
    base = t1 + P  # every job has started at least once before base
    for jobs in on:
        for te, _ in jobs:
            tau = base + ((te - base) % P)
            level = sum(dm * (math.floor((tau - t) / P + 1e-9) + 1) for t, dm in jobs)
            peak = max(peak, level)
    return peak


#: periods tried, as multiples of the work period: the shortest whose pattern fits the limit, then the next
FACTORS = (1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.4, 1.5, 1.6, 1.75, 2.0, 2.25, 2.5, 3.0)


def candidates(prob, max_jobs: int) -> Iterator[tuple[list[list[Job]], Modulo]]:
    """Job lists of the patterns at the shortest periods of :data:`FACTORS` times the work period whose
    pattern fits the memory limit (:func:`pattern_peak`), within ``max_jobs`` placements (at least one)."""
    njobs = 3 * prob.m * prob.nc
    n = max(1, max_jobs // max(njobs, 1))
    w = work_period(prob)
    for f in FACTORS:
        if n <= 0:
            return
        mod = Modulo(period=f * w)
        x = pattern(prob, mod)
        if x is None or pattern_peak(prob, mod, x) > prob.limit + _EPS:
            continue
        n -= 1
        yield build(prob, mod, None, x), mod
