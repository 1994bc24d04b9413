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
from dataclasses import dataclass
from typing import Iterator

from ...core.ir import Job, Kind, Placement

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Modulo:
    """One modulo pattern (recorded as the schedule's policy)."""

    period: float
    """time between consecutive microbatches' timetables"""
    order: str = "chain"
    """'chain': place jobs along microbatch 0's path; 'late': backwards first from the V's tip"""
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


def build(prob, mod: Modulo) -> list[list[Job]] | None:
    """Per-device job lists of ``m`` microbatches repeating the pattern (sorted by planned start)."""
    x = pattern(prob, mod)
    if x is None:
        return None
    P = mod.period
    ev: list[list[tuple]] = [[] for _ in range(prob.pp)]
    rank = {Kind.F: 0, Kind.B: 1, Kind.W: 2}
    for (k, c), t in x.items():
        lst = ev[prob.dev[c]]
        for j in range(prob.m):
            lst.append((t + j * P, rank[k], j, k, c))
    seqs = []
    for lst in ev:
        lst.sort()
        seqs.append([Job(k, j, c) for _, _, j, k, c in lst])
    return seqs


#: periods tried, as multiples of the work period (the smallest whose pattern fits the limit wins, mostly)
FACTORS = (1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.4, 1.5, 1.6, 1.75, 2.0, 2.25, 2.5, 3.0)


def candidates(prob, max_jobs: int) -> Iterator[tuple[list[list[Job]], Modulo]]:
    """Job lists of the patterns at the periods of :data:`FACTORS` times the work period, shortest first,
    within ``max_jobs`` placements."""
    njobs = 3 * prob.m * prob.nc
    n = max(1, max_jobs // max(njobs, 1))
    w = work_period(prob)
    for f in FACTORS[:n]:
        seqs = build(prob, Modulo(period=f * w))
        if seqs is not None:
            yield seqs, Modulo(period=f * w)
