"""Makespan lower bounds under a memory limit (no torch).

Used by :mod:`pipeloom.schedule.v_shape` (``zbv``, ``vhalf``, ``vmin``), the exact builder
:mod:`pipeloom.schedule.optimal`, :mod:`.polish` and ``bench/zb_bounds.py``. Works on the integer job
graph of :mod:`.cpsat` (:class:`~pipeloom.schedule.search.cpsat.JobGraph`: the same jobs, lags, durations
and memory deltas as the exact solver and the simulator, all from :mod:`pipeloom.core.rules`).

Lower bound (:func:`lower_bound`)
---------------------------------
Notation, per device d: ``head[j]`` / ``tail[j]`` the longest dependency path before job j's
start / from its start to the end (j included); ``hF``, ``hB`` the smallest head of a forward /
of an input-grad backward B on d; ``Ftot``, ``BWtot`` the total forward / backward (B and W)
work on d; ``L`` the memory limit. Memory follows the device's order (the level after each
job is at most ``L``; F adds ``a_c``, B frees ``b_c``, W frees ``a_c - b_c``). Every term below
holds for every valid schedule, so their maximum is a lower bound of the makespan T:

1. critical path ``max_j head[j] + tail[j]`` and the device bound
   ``min head + work on d + min (tail - own duration)`` (as in ``optimal``);
2. warm-up (memory): no B or W can start before ``hB`` (W needs its B). The jobs before d's
   first B in d's order are forwards only; their memory is never freed before that B, so their
   ``a`` sum to at most ``L``, and they run inside ``[hF, s_B]`` where ``s_B >= hB`` is that B's
   start. Let ``Fpre(s)`` = the most forward work whose ``a`` fit in ``L`` (a knapsack over the
   local chunks, m copies each) capped at ``s - hF``. Everything else on d (all B and W, the
   other forwards) runs after ``s_B``, one job at a time, so
   ``T >= s_B + BWtot + Ftot - Fpre(s_B) >= hB + BWtot + Ftot - Fpre(hB)`` (the middle
   expression does not decrease with ``s_B``: ``Fpre`` grows by at most the time added);
3. last forward (memory): let P be the last forward in d's order. When P has run, every forward
   of d has run, so the memory after P is ``m * need_d - freed`` with ``need_d = sum_{c on d}
   a_c`` and ``freed`` what the B and W before P released; it is at most ``L``, so the B and W
   before P must free ``X = m*need_d - L``. Freeing costs time: per (microbatch, chunk) either
   nothing, B (frees ``b``, costs ``dB``) or B and W (frees ``a``, costs ``dB + dW``; W needs
   its B); ``Wfree`` = the least work that frees ``X`` (a small knapsack, exact or its LP
   relaxation, both lower bounds). If ``X > 0`` some B runs before P, so ``s_B < start(P)``;
   those B/W and every forward but P run before P, all of the B/W after ``s_B``; so by the
   argument of 2, ``start(P) >= hB + Wfree + max(0, Ftot - dF(P) - Fpre(hB))`` (when
   ``X <= 0`` no B need precede P and the term is skipped). P is the last forward of its
   microbatch on d, so it is on d's highest local chunk (a microbatch's forwards go up the
   chunks), and ``T >= start(P) + tail[F on that chunk]``.

4. steady state (memory; Little's law): let ``m(t)`` be the level after the last job of d that has
   started by time t (0 before the first). d's jobs start one at a time in d's order, so ``m(t)`` is the
   level after a prefix of that order: ``0 <= m(t) <= L`` at every t (this reads the order-based limit as a
   function of time; no timing of the memory inside a job is assumed). Each job's change counts from its
   start to T, so ``integral_0^T m(t) dt = sum over (j, c on d) of b_c (sB - sF) + (a_c - b_c) (sW - sF)``
   (start times of F, B, W of (j, c); F adds ``a_c``, B frees ``b_c``, W the rest, all ``>= 0``). The
   least ``sB - sF`` is ``res_c`` (:func:`residency`: the chain ``F(c) .. F(last), B(last) .. B(c+1)``
   with ``comm`` on each edge between devices, the same for every microbatch), and ``sW >= sB + dB_c``
   (W needs its B, on the same device). So the memory-time ``R = m * sum_c (b_c res_c + (a_c - b_c)
   (res_c + dB_c))`` is at most ``integral_0^T m(t) dt <= L T``. Sharper, ``m(t)`` is capped by
   ``u(t)``: 0 before ``hF``; before ``hB`` only forwards have started (no B yet, W needs its B), every one
   but the last finished after ``hF``, so ``m(t) <= amax + rho (t - hF)`` with ``rho = max a_c / dF_c``;
   ``L`` after. And the jobs not started at t must free ``m(t)`` (the level ends at 0; F only adds), one at
   a time inside ``[t, T]``, so ``m(t) <= sigma (T - t)`` with ``sigma`` the most any B or W frees per unit
   of time. So ``R <= A(T) = integral_0^T min(u(t), sigma (T - t)) dt``; A does not decrease with T, and
   T is at least the least T with ``A(T) >= R`` (:func:`steady_state_time`); on an integer graph the least
   integer (for each device order the earliest timing is optimal and integral). Where memory is scarce and m
   large (``vmin`` with the Zero Bubble costs at depth) this term is the binding one.

Example (``zbv`` pp 4, m 8, F=B=W=comm=1, limit 1p = 4 units, a = 1/2, b = 1/4): on the
last device, ``hB = 20``, ``Fpre = 8`` (8 forwards fit), ``X = 8 - 4 = 4`` units = 16 jobs of
1/4, so ``start(P) >= 20 + 16 + (16 - 1 - 8) = 43`` and ``T >= 43 + 22 = 65``: the official
generator's 65 is optimal there (CP-SAT alone proves only 54 in 90 s).

Example of term 4 (pp 2, vpp 1, m 4, F=B=W=1, comm 0, torch's memory model ``b = 0``, limit 1 unit): on
device 0, ``res = F + F + B = 3``, so ``R = 4 * 1 * (3 + 1) = 16`` and ``R / L = 16``; W frees 1 per unit
of time (``sigma = 1``) and ``u = L`` from ``hF = 0``, so ``A(T) = T - 1/2`` and ``T >= 16.5``, 17 on the
integer grid, where terms 1-3 give 16 (the CP-SAT optimum is 20).

The bounds are checked against the exact optimum on small shapes (tests/schedule/test_polish.py,
tests/schedule/test_bounds.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

from ...core.ir import Job, Kind, Placement, device_of
from ..registry import PlanSpec
from .cpsat import JobGraph, job_graph


@dataclass(frozen=True, slots=True)
class Bound:
    """A lower bound of the makespan and which term gave it."""

    value: float
    term: str
    """'critical path / device', 'warm-up (memory)', 'last forward (memory)' or 'steady state (memory)'"""
    device: int | None = None


def split_graph(spec: PlanSpec, placement: Placement) -> JobGraph:
    """The integer job graph of ``spec`` with split backward (B and W), as the bounds and the polish use it."""
    return job_graph(spec, placement, split=True)


def _max_f_work(g, chunks: list[int], cap_mem: int) -> int:
    """Most forward work on ``chunks`` (m copies each) whose memory sums to at most ``cap_mem``.

    Exact enumeration for few chunk kinds; else the LP relaxation (an upper bound, so still valid).
    """
    items = [(g.ia[c], g.iF[c]) for c in chunks]
    if not items:
        return 0
    if all(a <= 0 for a, _ in items):
        return g.m * sum(f for _, f in items)
    if len(items) <= 2 or (g.m + 1) ** (len(items) - 1) <= 20_000:
        first, rest = items[0], items[1:]
        best = 0
        for counts in product(range(g.m + 1), repeat=len(rest)):
            used = sum(n * a for n, (a, _) in zip(counts, rest))
            if used > cap_mem:
                continue
            work = sum(n * f for n, (_, f) in zip(counts, rest))
            a0, f0 = first
            n0 = g.m if a0 <= 0 else min(g.m, (cap_mem - used) // a0)
            best = max(best, work + n0 * f0)
        return best
    # LP relaxation: most work per unit of memory first (zero-memory chunks fit entirely)
    best, room = 0.0, float(cap_mem)
    for a, f in sorted(items, key=lambda x: -(x[1] / x[0]) if x[0] > 0 else -math.inf):
        take = g.m if a <= 0 else min(g.m, room / a)
        best += take * f
        room -= take * max(a, 0)
    return int(math.ceil(best - 1e-9))


#: dynamic-programming cells :func:`graph_bound` spends on :func:`_min_free_work` over all devices; past that,
#: the LP relaxation (never stronger, still valid; equal to the exact value on every shape of pp 16-128,
#: m 4pp, both cost sets of bench/schedules_at_scale.py at 0.5p, 0.75p and V-Min's limit, in 0.06 s instead of
#: 0.5 s at pp 128). Devices with the same chunk costs share one result
DP_CELLS = 500_000


def _min_free_work(g, chunks: list[int], need: int, exact: bool = True) -> float:
    """Least B/W work on ``chunks`` that frees at least ``need`` memory (per microbatch and chunk:
    nothing, B alone, or B and W). Exact by dynamic programming when small (and ``exact``), else the LP
    relaxation of that choice problem (a lower bound)."""
    if need <= 0:
        return 0.0
    opts = []  # per chunk: (freed, cost) of B alone and of B+W
    for c in chunks:
        opts.append(((g.ib[c], g.iB[c]), (g.ia[c], g.iB[c] + g.iW[c])))
    total_free = g.m * sum(o[1][0] for o in opts)
    if total_free < need:  # cannot happen for a feasible limit; be safe
        return 0.0
    groups = len(chunks) * g.m
    if exact and need * groups <= 2_000_000:
        INF = math.inf
        dp = [0.0] + [INF] * need  # dp[x]: least cost to free at least x (capped at need)
        for (fb, cb), (fw, cw) in opts:
            for _ in range(g.m):
                new = dp[:]
                for x in range(need + 1):
                    if dp[x] == INF:
                        continue
                    for fr, co in ((fb, cb), (fw, cw)):
                        y = min(need, x + fr)
                        if dp[x] + co < new[y]:
                            new[y] = dp[x] + co
                dp = new
        return dp[need]
    # LP relaxation: per chunk the cheaper-per-unit of "B then W" increments, convexified
    incs = []
    for (fb, cb), (fw, cw) in opts:
        if fw <= 0:
            continue  # a chunk whose activations round to 0 units (e.g. only the embedding) frees nothing
        if fb > 0 and cb / fb <= cw / fw:
            incs += [(cb / fb, fb), ((cw - cb) / (fw - fb) if fw > fb else math.inf, fw - fb)]
        else:
            incs.append((cw / fw, fw))
    cost, left = 0.0, float(need)
    for rate, fr in sorted(incs):
        take = min(left, g.m * fr)
        cost += take * rate
        left -= take
        if left <= 0:
            break
    return cost


def residency(g) -> list[int]:
    """Per chunk c, the least time from the start of F(j, c) to the start of B(j, c) (any microbatch j):
    the dependency chain up the chunks and back, ``F(c) .. F(last), B(last) .. B(c+1)`` with ``comm`` on every
    edge between devices (the only path from F(c) to B(c) besides the direct edge, and never shorter)."""
    nc, iF, iB, dev = g.nc, g.iF, g.iB, g.dev
    out = [0] * nc
    up = 0  # F(c) .. F(last) + B(last) .. B(c+1), with the comm of the edges between
    for c in range(nc - 1, -1, -1):
        if c < nc - 1:
            up += iB[c + 1] + (2 * g.icomm if dev[c] != dev[c + 1] else 0)
        up += iF[c]
        out[c] = up
    return out


def _area(T: float, L: float, hF: float, hB: float, amax: float, rho: float, sigma: float) -> float:
    """The most memory-time ``integral_0^T m(t) dt`` a device can hold under the caps of the steady-state term
    (:func:`steady_state_time`): ``m(t) <= u(t) = 0`` before ``hF``, ``min(L, amax + rho (t - hF))`` in
    ``[hF, hB)``, ``L`` after, and ``m(t) <= sigma (T - t)``. The integrand is piecewise linear between the
    breakpoints collected here, so the midpoint rule on each piece is exact."""
    def u(t: float) -> float:
        if t < hF:
            return 0.0
        if t < hB:
            return L if math.isinf(rho) else min(L, amax + rho * (t - hF))
        return L

    def cap(t: float) -> float:
        x = u(t)
        return x if math.isinf(sigma) else min(x, sigma * (T - t))

    pts = {0.0, T, hF, hB}
    if not math.isinf(rho) and rho > 0:
        pts.add(hF + (L - amax) / rho)
    if not math.isinf(sigma):
        pts.add(T - L / sigma)
        if not math.isinf(rho):
            pts.add((sigma * T - amax + rho * hF) / (rho + sigma))
    xs = sorted(x for x in pts if 0.0 <= x <= T)
    return sum((x1 - x0) * cap((x0 + x1) / 2) for x0, x1 in zip(xs, xs[1:]) if x1 > x0)


def steady_state_time(R: float, L: float, hF: float, hB: float, amax: float, rho: float, sigma: float,
                      integral: bool) -> float:
    """The least ``T`` with :func:`_area` ``(T) >= R`` (the memory-time a device must hold; see the module
    docstring, term 4); with ``integral`` the least such integer. ``_area`` does not decrease with ``T``."""
    if R <= 0:
        return 0.0
    hi = max(1.0, hB + R / L)
    while _area(hi, L, hF, hB, amax, rho, sigma) < R:
        hi *= 2
    lo = R / L  # _area(T) <= L*T
    if integral:
        lo_i, hi_i = int(math.floor(lo)), int(math.ceil(hi))
        while lo_i < hi_i:  # least integer with enough area (relative slack against float rounding)
            mid = (lo_i + hi_i) // 2
            if _area(mid, L, hF, hB, amax, rho, sigma) >= R * (1 - 1e-12):
                hi_i = mid
            else:
                lo_i = mid + 1
        return float(hi_i)
    for _ in range(200):
        mid = (lo + hi) / 2
        if _area(mid, L, hF, hB, amax, rho, sigma) >= R * (1 - 1e-12):
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-9 * max(1.0, hi):
            break
    return lo


def _steady_terms(g, d: int, chunks: list[int], res: list[int], hF: int, hB: int, integral: bool) -> float:
    """Term 4 (steady state, Little's law) of :func:`graph_bound` for device ``d``, in the graph's time units."""
    L = g.ilimit
    R = g.m * sum(g.ib[c] * res[c] + (g.ia[c] - g.ib[c]) * (res[c] + g.iB[c]) for c in chunks)
    if R <= 0 or L is None or L <= 0:
        return 0.0
    amax = max(g.ia[c] for c in chunks)
    rho = max((g.ia[c] / g.iF[c] if g.iF[c] > 0 else (math.inf if g.ia[c] > 0 else 0.0)) for c in chunks)
    rates = []
    for c in chunks:
        for fr, du in ((g.ib[c], g.iB[c]), (g.ia[c] - g.ib[c], g.iW[c])):
            rates.append(fr / du if du > 0 else (math.inf if fr > 0 else 0.0))
    sigma = max(rates)
    if sigma <= 0:
        sigma = math.inf
    return steady_state_time(R, L, hF, hB, amax, rho, sigma, integral)


def graph_bound(g, *, steady: bool = True) -> tuple[int, str, int | None]:
    """(bound in the graph's integer time, term, device) of :func:`lower_bound` on a job graph
    (``steady=False``: without term 4, the bound as it was before that term)."""
    best = (g.lb, "critical path / device", None)
    if g.ilimit is None:
        return best
    cells, memo = DP_CELLS, {}
    res = residency(g)
    by_dev: dict[int, list[int]] = {}
    for c in range(g.nc):
        by_dev.setdefault(g.dev[c], []).append(c)
    for d in range(g.pp):
        chunks = by_dev.get(d)
        if not chunks:
            continue
        fs = [Job(Kind.F, 0, c) for c in chunks]
        bs = [Job(Kind.B, 0, c) for c in chunks]
        hF = min(g.head[j] for j in fs)
        hB = min(g.head[j] for j in bs)   # heads do not depend on the microbatch
        ftot = g.m * sum(g.iF[c] for c in chunks)
        bwtot = g.m * sum(g.iB[c] + g.iW[c] for c in chunks)
        fpre = min(_max_f_work(g, chunks, g.ilimit), max(0, hB - hF))
        warm = hB + bwtot + ftot - fpre
        if warm > best[0]:
            best = (warm, "warm-up (memory)", d)
        if steady and not g.rounded:
            st = int(_steady_terms(g, d, chunks, res, hF, hB, True))
            if st > best[0]:
                best = (st, "steady state (memory)", d)
        top = max(chunks)
        need = g.m * sum(g.ia[c] for c in chunks) - g.ilimit
        key = (need, tuple((g.ia[c], g.ib[c], g.iB[c], g.iW[c]) for c in chunks))
        if key not in memo:
            size = need * len(chunks) * g.m
            memo[key] = _min_free_work(g, chunks, need, exact=size <= cells)
            if size <= cells and size <= 2_000_000:
                cells -= max(size, 0)
        wfree = int(math.ceil(memo[key] - 1e-9))
        if wfree <= 0:  # nothing must be freed: P may come before every B (the device bound covers it)
            continue
        last = hB + wfree + max(0, ftot - g.iF[top] - fpre) + g.tail[Job(Kind.F, 0, top)]
        if last > best[0]:
            best = (last, "last forward (memory)", d)
    return best


def microbatch_graph(spec: PlanSpec, placement: Placement) -> JobGraph:
    """The split job graph of ``spec`` built for one microbatch, then read for all of them.

    No dependency crosses microbatches (:mod:`pipeloom.core.rules`), so every head and tail is the
    same for each microbatch: the critical path and the terms of :func:`graph_bound` (which read the
    heads and tails of microbatch 0, chunk sums times ``m``) are exactly those of the full graph, for
    ``pp * vpp`` jobs of work instead of ``3 * m * pp * vpp`` (pp 128, m 512: 768 jobs, not 393 216).
    Only ``g.m`` and the device term of ``g.lb`` are set for the real ``m``; ``g.jobs`` stays
    microbatch 0's (not a graph to solve)."""
    from dataclasses import replace

    m = spec.microbatches
    g = split_graph(replace(spec, microbatches=1), placement)
    g.m = m
    lb = max(g.head[j] + g.tail[j] for j in g.jobs)  # the critical path (any microbatch)
    per: dict[int, list] = {}  # device -> [min head, work of one microbatch, min tail - own duration]
    for j in g.jobs:  # one pass (a scan of all jobs per device is quadratic in pp: pp 16 384 at m 1)
        du = g.dur(j.kind, j.chunk)
        x = per.get(g.dev[j.chunk])
        if x is None:
            per[g.dev[j.chunk]] = [g.head[j], du, g.tail[j] - du]
        else:
            x[0] = min(x[0], g.head[j])
            x[1] += du
            x[2] = min(x[2], g.tail[j] - du)
    for h, w, t in per.values():
        lb = max(lb, h + m * w + t)
    g.lb = lb
    return g


def lower_bound(spec: PlanSpec, placement: Placement | str = Placement.V) -> Bound:
    """A lower bound of the makespan of every valid B/W-split schedule of ``spec`` (under
    ``spec.mem_limit``) with ``placement`` (see the module docstring for the proof).

    Computed on :func:`microbatch_graph` (the same value as on the full job graph), so it is cheap at
    every size. It holds for unsplit schedules (BW jobs) too: a BW is a B with its W right after it,
    whose memory never rises in between."""
    g = microbatch_graph(spec, Placement(placement))
    v, term, d = graph_bound(g)
    if g.rounded:  # durations rounded to 1/tscale: every path or sum has < 2*njobs terms, each off by <= 1/2
        out = Bound(max(0.0, (v - 3 * g.m * g.nc) / g.tscale), term, d)
        st, sd = steady_bound(spec, Placement(placement))  # term 4 on the exact costs instead (no rounding)
        return Bound(st, "steady state (memory)", sd) if st > out.value else out
    return Bound(v / g.tscale, term, d)


def steady_bound(spec: PlanSpec, placement: Placement) -> tuple[float, int | None]:
    """Term 4 (steady state) of :func:`lower_bound` on ``spec``'s own costs and memory, in floats: (value,
    device). What :func:`lower_bound` uses where the integer graph rounds the costs (the other terms then
    lose a rounding slack; this one needs none)."""
    from types import SimpleNamespace

    if spec.mem_limit is None or not math.isfinite(spec.mem_limit):
        return 0.0, None
    nc = spec.pp * spec.vpp
    dF, dB, dW = spec.costs.per_chunk(nc)
    a, b = spec.mem.per_chunk(nc, spec.vpp)
    dev = [device_of(c, spec.pp, placement) for c in range(nc)]
    g = SimpleNamespace(m=spec.microbatches, nc=nc, dev=dev, iF=dF, iB=dB, iW=dW, icomm=spec.costs.comm,
                        ia=a, ib=b, ilimit=float(spec.mem_limit))
    headF, t = [0.0] * nc, 0.0  # one microbatch's chain: F up the chunks, then B back down
    for c in range(nc):
        if c > 0:
            t += dF[c - 1] + (g.icomm if dev[c] != dev[c - 1] else 0.0)
        headF[c] = t
    headB, t = [0.0] * nc, headF[-1] + dF[-1]
    for c in range(nc - 1, -1, -1):
        if c < nc - 1:
            t += dB[c + 1] + (g.icomm if dev[c] != dev[c + 1] else 0.0)
        headB[c] = t
    res = residency(g)
    best = (0.0, None)
    for d in sorted(set(dev)):
        chunks = [c for c in range(nc) if dev[c] == d]
        v = _steady_terms(g, d, chunks, res, min(headF[c] for c in chunks), min(headB[c] for c in chunks), False)
        if v > best[0]:
            best = (v, d)
    return best


def plan_bound(sched, spec: PlanSpec, makespan: float | None, peak: float | None,
               limit: float | None = None) -> dict:
    """``lower_bound``, ``gap`` and ``bound_limit`` for ``pipeloom plan/simulate --json`` and ``show``.

    The bound is :func:`lower_bound` for the schedule's shape and placement under ``limit`` if given, else
    the memory limit it was planned for (``meta['mem_limit']``, else ``spec.mem_limit``), or, without one,
    under its own peak memory: no valid schedule that fits that memory is faster. ``gap`` = makespan / bound - 1. All three
    are None where no bound applies: no makespan, overlapped pairs (two jobs at once on a device) or a
    memory model the bound does not cover."""
    out = {"lower_bound": None, "gap": None, "bound_limit": None}
    if makespan is None or (sched.overlapped and spec.costs.hides_pairs):
        return out
    if limit is None:
        limit = sched.meta.get("mem_limit", spec.mem_limit) if isinstance(sched.meta, dict) else spec.mem_limit
    if limit is None:
        limit = peak
    if limit is None or not math.isfinite(limit):
        return out
    from dataclasses import replace

    try:
        b = lower_bound(replace(spec, pp=sched.pp, vpp=sched.vpp, microbatches=sched.microbatches,
                                mem_limit=float(limit)), sched.placement).value
    except (ValueError, ZeroDivisionError):
        return out
    out["lower_bound"] = b
    out["bound_limit"] = float(limit)
    out["gap"] = (makespan / b - 1.0) if b > 0 else None
    return out
