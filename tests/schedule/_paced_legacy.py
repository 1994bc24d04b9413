"""The paced pass as it was before it ran on the shared list-scheduling board: its own loop, readiness and memory
checks. Test-only oracle for tests/schedule/test_paced_board.py (the library has one copy of the rules)."""
from __future__ import annotations

import heapq
import math
from collections import deque

from pipeloom.core.ir import Job, Kind
from pipeloom.schedule.search.paced import _EPS, Pace, _new, timetable

INF = math.inf


def run_legacy(prob, pace: Pace, table: tuple[list[float], list[float]] | None = None) -> list[list[Job]] | None:
    """The pass with its own loop, readiness and memory checks (before :class:`PacedPolicy`); kept so the
    tests can check that the policy on the board places exactly the same jobs."""
    pp, m, nc = prob.pp, prob.m, prob.nc
    dF, dB, dW = prob.dF, prob.dB, prob.dW
    fcomm, bcomm, dev = prob.fcomm, prob.bcomm, prob.dev
    aF, mB, mW = prob.mF, prob.mB, prob.mW
    limit = prob.limit + _EPS
    P = pace.period
    slack = INF if pace.slack is None else pace.slack
    tf, tb = table or timetable(prob)
    bb = pace.b_bias * P
    last = nc - 1
    local = prob.local
    first = [loc[0] for loc in local]
    # room kept for the return leg when a new microbatch starts: head forwards of the largest other chunk
    keep = [pace.head * max((aF[c] for c in loc[1:]), default=0.0) for loc in local]
    fe = [[-1.0] * m for _ in range(nc)]
    be = [[-1.0] * m for _ in range(nc)]
    nf = [0] * nc
    nb = [0] * nc
    # per device, per local chunk what its two candidates read (no index arithmetic in the loop):
    # (chunk, own F ends, next chunk's B ends or None, comm on that edge, B's base target,
    #  previous chunk's F ends or None, comm on that edge, F's base target, memory an F must find free)
    cand = [tuple((c, fe[c], be[c + 1] if c != last else None, bcomm[c], tb[c] - bb,
                   fe[c - 1] if c else None, fcomm[c], tf[c], aF[c] + (keep[d] if c == first[d] else 0.0))
                  for c in loc) for d, loc in enumerate(local)]
    mem = [0.0] * pp
    t = [0.0] * pp
    pend: list[deque] = [deque() for _ in range(pp)]
    seqs: list[list[Job]] = [[] for _ in range(pp)]
    key = [0.0] * pp
    heap = [(0.0, d) for d in range(pp)]
    total = 3 * m * nc
    done = 0
    KF, KB, KW = Kind.F, Kind.B, Kind.W
    push, pop = heapq.heappush, heapq.heappop
    new = _new
    while heap:
        T, d = pop(heap)
        if T != key[d]:
            continue
        now = T + _EPS
        bt = INF     # the smallest target among the startable candidates ...
        kind = -1    # ... its kind (0 F, 1 B) and chunk
        c = -1
        due = INF    # earliest time a candidate becomes startable (ready and released)
        blocked = False
        md = mem[d]
        for ch, fec, ben, bcm, tb0, fep, fcm, tf0, need in cand[d]:
            mb = nb[ch]
            if mb < nf[ch]:  # backward
                r = fec[mb]
                if ben is not None:
                    e = ben[mb]
                    if e < 0:
                        r = INF
                    else:
                        e += bcm
                        if e > r:
                            r = e
                if r < INF:
                    tg = tb0 + mb * P
                    s = tg - slack
                    if r > s:
                        s = r
                    if s <= now:
                        if tg < bt:
                            bt, kind, c = tg, 1, ch
                    elif s < due:
                        due = s
            mb = nf[ch]
            if mb < m:  # forward
                if fep is None:
                    r = 0.0
                else:
                    r = fep[mb]
                    r = INF if r < 0 else r + fcm
                if r < INF:
                    tg = tf0 + mb * P
                    s = tg - slack
                    if r > s:
                        s = r
                    if md + need > limit:
                        if s <= now:
                            blocked = True
                    elif s <= now:
                        if tg < bt:
                            bt, kind, c = tg, 0, ch
                    elif s < due:
                        due = s
        if kind < 0:
            pw = pend[d]
            if pw and (blocked or due == INF or due - T >= dW[pw[0][1]] - _EPS):
                kind = 2
            elif due < INF:
                key[d] = due
                push(heap, (due, d))
                continue
            elif pw:
                kind = 2
            else:
                key[d] = INF  # asleep until a dependency is scheduled
                continue
        if kind == 0:
            mb = nf[c]
            nf[c] = mb + 1
            e = T + dF[c]
            fe[c][mb] = e
            mem[d] += aF[c]
            if c != last:
                d2 = dev[c + 1]
                if d2 != d:
                    k = e + fcomm[c + 1]
                    if t[d2] > k:
                        k = t[d2]
                    if k < key[d2]:
                        key[d2] = k
                        push(heap, (k, d2))
            job = new(Job, (KF, mb, c))
        elif kind == 1:
            mb = nb[c]
            nb[c] = mb + 1
            e = T + dB[c]
            be[c][mb] = e
            mem[d] += mB[c]
            pend[d].append((mb, c))
            if c:
                d2 = dev[c - 1]
                if d2 != d:
                    k = e + bcomm[c - 1]
                    if t[d2] > k:
                        k = t[d2]
                    if k < key[d2]:
                        key[d2] = k
                        push(heap, (k, d2))
            job = new(Job, (KB, mb, c))
        else:
            mb, c = pend[d].popleft()
            e = T + dW[c]
            mem[d] += mW[c]
            job = new(Job, (KW, mb, c))
        seqs[d].append(job)
        done += 1
        t[d] = e
        key[d] = e
        push(heap, (e, d))
    if done != total:
        return None
    return seqs
