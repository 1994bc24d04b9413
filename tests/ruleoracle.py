"""An independent oracle of the schedule rules, written out by hand for the tests (no code of pipeloom's).

It restates the pairing rules of ``core/ir.py``'s docstring in the plainest form and times a fixed
per-device order by brute force (sweep the devices until nothing moves), so that the timing kernel
(Python and C), the simulator and every planner can be checked against something none of them share:

    F(m, k)    needs F(m, k-1)                             (k > 0)
    B(m, k)    needs F(m, k) and B or BW of (m, k+1)       (k < last; the last chunk only its F)
    BW(m, k)   needs what B(m, k) needs
    W(m, k)    needs B(m, k)
    memory     F +a(k), B -b(k), W -(a(k) - b(k)), BW -a(k)
    time       start = max(device free, max over needs of (end + comm if the two chunks' devices differ))
               (+ delay), end = start + duration; an overlapped pair starts when both are ready and
               ends at start + p1 + p2 - p3
"""
from __future__ import annotations

from pipeloom.core.ir import Job, Kind, device_of


def oracle_needs(job: Job, nc: int) -> list[list[Job]]:
    """Per dependency, the jobs that can satisfy it (any one of them)."""
    kind, mb, k = job
    if kind is Kind.F:
        return [[Job(Kind.F, mb, k - 1)]] if k > 0 else []
    if kind is Kind.W:
        return [[Job(Kind.B, mb, k)]]
    out = [[Job(Kind.F, mb, k)]]
    if k < nc - 1:
        out.append([Job(Kind.B, mb, k + 1), Job(Kind.BW, mb, k + 1)])
    return out


def oracle_delta(kind: Kind, a: float, b: float) -> float:
    return {Kind.F: a, Kind.B: -b, Kind.W: -(a - b), Kind.BW: -a}[kind]


def oracle_peaks(devices, a, b) -> list[float]:
    out = []
    for seq in devices:
        cur = peak = 0.0
        for kind, _mb, c in seq:
            cur += oracle_delta(kind, a[c], b[c])
            peak = max(peak, cur)
        out.append(peak)
    return out


def oracle_time(devices, nc: int, pp: int, placement, dur, comm: float = 0.0, pairs=None, delays=None):
    """(start, end) per device and index, or None when the lists deadlock. ``dur(d, i, job)`` gives a duration;
    ``pairs[(d, i)] = (p1, p2, p3)``."""
    pairs = pairs or {}
    end_of: dict[Job, float] = {}
    start = [[None] * len(s) for s in devices]
    end = [[None] * len(s) for s in devices]
    ptr = [0] * len(devices)
    free = [0.0] * len(devices)

    def ready(job):
        r = 0.0
        for alts in oracle_needs(job, nc):
            got = [j for j in alts if j in end_of]
            if not got:
                return None
            e = end_of[got[0]]
            if device_of(got[0].chunk, pp, placement) != device_of(job.chunk, pp, placement):
                e += comm
            r = max(r, e)
        return r

    moved = True
    while moved:
        moved = False
        for d, seq in enumerate(devices):
            while ptr[d] < len(seq):
                i = ptr[d]
                group = [i, i + 1] if (d, i) in pairs and i + 1 < len(seq) else [i]
                rs = [ready(seq[x]) for x in group]
                if any(r is None for r in rs):
                    break
                s = max([free[d]] + rs)
                if delays is not None:
                    s = s + delays[d][i]
                if len(group) == 2:
                    p1, p2, p3 = pairs[(d, i)]
                    e = s + p1 + p2 - p3
                else:
                    e = s + dur(d, i, seq[i])
                for x in group:
                    start[d][x], end[d][x] = s, e
                    end_of[seq[x]] = e
                free[d] = e
                ptr[d] += len(group)
                moved = True
    if any(ptr[d] < len(s) for d, s in enumerate(devices)):
        return None
    return start, end


def chunk_dur(dF, dB, dW):
    """``dur`` for :func:`oracle_time` from per-chunk F, B, W durations (BW = B + W)."""
    def dur(_d, _i, job):
        kind, _mb, c = job
        return {Kind.F: dF[c], Kind.B: dB[c], Kind.W: dW[c], Kind.BW: dB[c] + dW[c]}[kind]
    return dur


def oracle_valid(sched) -> bool:
    """Every (mb, chunk) has one F and B+W or BW, every job on its chunk's device, and the lists run."""
    nc, pp = sched.num_chunks, sched.pp
    seen = [j for _d, _i, j in sched.jobs()]
    if len(seen) != len(set(seen)):
        return False
    for mb in range(sched.microbatches):
        for c in range(nc):
            f = Job(Kind.F, mb, c) in seen
            split = Job(Kind.B, mb, c) in seen and Job(Kind.W, mb, c) in seen
            fused = Job(Kind.BW, mb, c) in seen
            if not f or split == fused:
                return False
    if any(device_of(j.chunk, pp, sched.placement) != d for d, _i, j in sched.jobs()):
        return False
    return oracle_time(sched.devices, nc, pp, sched.placement, lambda *_: 1.0) is not None
