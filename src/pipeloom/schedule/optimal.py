"""Exact minimum-makespan schedules for small shapes (OR-Tools CP-SAT).

The ``optimal`` builder solves pipeloom's own timing model exactly, so every heuristic can be
measured against the true optimum (or a proven lower bound) on small shapes:

    jobs         F, B, W (split backward, default) or F, BW (fused) for every (microbatch, chunk),
                 each on the device its chunk is placed on (V or interleaved placement)
    device       runs one job at a time (NoOverlap of the job intervals)
    dependencies the pairing rules of :mod:`pipeloom.core.ir`; ``comm`` is added on an edge
                 whose two jobs sit on different devices, nothing on the same device
    memory       along each device's order the running sum of F +a, B -b, W -(a-b), BW -a never
                 exceeds the limit (a reservoir constraint over the job start times: jobs on one
                 device never share a start time, so the level at a job's start is exactly the
                 memory after it in the device's order, as in :func:`pipeloom.sim.memory_profile`)
    objective    minimise the makespan (last end over all devices)

The per-device order of the returned schedule is the order of the solver's start times.
Re-timing that order with :func:`pipeloom.sim.simulate` (each job as early as its device and
dependencies allow) can only move jobs earlier, so its makespan is at most the solver's
objective, and equal to it when the status is OPTIMAL (the re-timed schedule is itself feasible).

Durations and memory are scaled to integers (CP-SAT is an integer solver): costs such as 1, 2.5
or 1/3 are exact; a cost that is no fraction with a denominator up to 10^4 is rounded to 1/1000
and ``meta['rounded']`` says so.

Help given to the solver, all of it sound:
    * microbatches are interchangeable (costs and memory depend on the chunk only), so the
      forwards on chunk 0 may be taken in microbatch order (symmetry breaking);
    * start windows from the longest dependency paths before and after each job (heads/tails)
      and the device bound  head_d + work_d + tail_d <= makespan; with split backward also the
      memory terms of :func:`pipeloom.schedule.search.polish.lower_bound` (warm-up and last forward);
    * a hint and an upper bound from cheap feasible schedules: a memory-reserving greedy list
      scheduler, the other registered builders of the same kind, and the one-microbatch-at-a-time
      schedule (which fits any limit >= the smallest feasible one, see :func:`min_feasible_limit`);
      when one of them meets the lower bound it is optimal and no search runs;
    * under a memory limit, a second phase adds time-indexed rows (y[j,t] = "j has started by t")
      whose LP relaxation is stronger; neither model alone proved every small case in our runs.

The smallest feasible memory limit is exact: right after microbatch i's last forward on device
d, every chunk of d holds i's activation (their B come later), so the peak is at least
``max_d sum_{c on d} a_c``; running the microbatches one at a time reaches it.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

from ..core.costs import Costs, MemModel
from ..core.errors import DeadlockError
from ..sim.simulate import memory_profile, simulate
from ..core.ir import Job, Kind, Placement, Schedule, device_of
from .registry import Option, PlanSpec, register
from ..core.errors import ScheduleError

#: the solver refuses larger problems unless ``allow_large=True`` (e.g. pp 4, m 8, vpp 2, split)
MAX_JOBS = 192
_TIME_RES = 10 ** 4  # largest denominator accepted as exact for a duration
_MEM_RES = 10 ** 6


# ----------------------------------------------------------------------------- helpers
def _scale_of(values: Sequence[float], max_den: int, fallback: int) -> tuple[int, bool]:
    """Smallest integer S with every value*S integral (denominators <= max_den); else (fallback, True)."""
    lcm = 1
    for v in values:
        fr = Fraction(v).limit_denominator(max_den)
        if abs(float(fr) - v) > 1e-9 * max(1.0, abs(v)):
            return fallback, True
        lcm = lcm * fr.denominator // math.gcd(lcm, fr.denominator)
        if lcm > fallback * 100:
            return fallback, True
    return lcm, False


def _to_int(v: float, scale: int) -> int:
    return int(round(v * scale))


def min_feasible_limit(pp: int, vpp: int, placement: Placement | str, mem: MemModel | None = None) -> float:
    """Smallest memory limit (units) under which any valid schedule exists: ``max_d sum_{c on d} a_c``.

    Every schedule needs it (a microbatch's activations on all chunks of a device are live right after
    its last forward there) and the one-microbatch-at-a-time schedule reaches it.
    """
    nc = pp * vpp
    a, _ = (mem or MemModel()).per_chunk(nc, vpp)
    per = [0.0] * pp
    for c in range(nc):
        per[device_of(c, pp, placement)] += a[c]
    return max(per)


def _serial_orders(pp: int, m: int, nc: int, placement: Placement, split: bool) -> list[list[Job]]:
    """One microbatch at a time: all its forwards, then its backwards (W right after its B)."""
    devs: list[list[Job]] = [[] for _ in range(pp)]
    for mb in range(m):
        for c in range(nc):
            devs[device_of(c, pp, placement)].append(Job(Kind.F, mb, c))
        for c in reversed(range(nc)):
            d = device_of(c, pp, placement)
            if split:
                devs[d] += [Job(Kind.B, mb, c), Job(Kind.W, mb, c)]
            else:
                devs[d].append(Job(Kind.BW, mb, c))
    return devs


def _greedy_orders(pp: int, m: int, nc: int, placement: Placement, split: bool,
                   dF, dB, dW, comm: float, a, b, limit: float | None, f_first: bool) -> list[list[Job]]:
    """Memory-safe list scheduling (a hint for the solver, never returned as the answer).

    Devices pick, at the earliest moment one of their jobs is ready, by priority: B/BW first,
    then F (or F first with ``f_first``), W last (W also runs when nothing else is ready). A new
    microbatch enters (F on chunk 0) only if every device can still hold all of its chunks on top
    of what is live and reserved, so admitted microbatches always finish: no deadlock.
    """
    dev = [device_of(c, pp, placement) for c in range(nc)]
    need = [0.0] * pp
    for c in range(nc):
        need[dev[c]] += a[c]
    lim = math.inf if limit is None else limit + 1e-9
    cur = [0.0] * pp          # live activation memory
    reserved = [0.0] * pp     # promised to admitted microbatches whose forward has not reached d yet
    free = [0.0] * pp
    f_end: dict[tuple[int, int], float] = {}
    g_end: dict[tuple[int, int], float] = {}  # input grad done (B or BW)
    next_f = [0] * nc         # forwards on each chunk go in microbatch order
    pending_b: list[set] = [set() for _ in range(pp)]   # (mb, c) whose F is done, backward not started
    pending_w: list[list] = [[] for _ in range(pp)]     # (mb, c, ready time) after B
    orders: list[list[Job]] = [[] for _ in range(pp)]
    total = m * nc * (3 if split else 2)
    placed = 0
    while placed < total:
        best = None  # (start, priority, device, job info)
        for d in range(pp):
            cands = []
            for c in range(nc):
                if dev[c] != d or next_f[c] >= m:
                    continue
                mb = next_f[c]
                if c == 0:
                    r = 0.0
                    if any(cur[x] + reserved[x] + need[x] > lim for x in range(pp)):
                        continue
                else:
                    e = f_end.get((mb, c - 1))
                    if e is None:
                        continue
                    r = e + (comm if dev[c - 1] != d else 0.0)
                cands.append((max(free[d], r), 1 if f_first else 2, -c, ("F", mb, c)))
            for mb, c in pending_b[d]:
                r = f_end[(mb, c)]
                if c < nc - 1:
                    e = g_end.get((mb, c + 1))
                    if e is None:
                        continue
                    r = max(r, e + (comm if dev[c + 1] != d else 0.0))
                cands.append((max(free[d], r), 2 if f_first else 1, -c, ("B", mb, c)))
            for mb, c, r in pending_w[d]:
                cands.append((max(free[d], r), 3, mb, ("W", mb, c)))
            if not cands:
                continue
            t0 = min(x[0] for x in cands)
            pick = min((x for x in cands if x[0] <= t0 + 1e-12), key=lambda x: (x[1], x[2]))
            if best is None or (pick[0], pick[1]) < (best[0], best[1]):
                best = (pick[0], pick[1], d, pick[3])
        if best is None:  # cannot happen for limit >= min_feasible_limit; be safe
            raise ScheduleError("greedy hint got stuck")
        s, _, d, (k, mb, c) = best
        if k == "F":
            dur = dF[c]
            if c == 0:
                for x in range(pp):
                    reserved[x] += need[x]
            reserved[d] -= a[c]
            cur[d] += a[c]
            f_end[(mb, c)] = s + dur
            next_f[c] += 1
            pending_b[d].add((mb, c))
            orders[d].append(Job(Kind.F, mb, c))
        elif k == "B":
            pending_b[d].discard((mb, c))
            if split:
                dur = dB[c]
                cur[d] -= b[c]
                pending_w[d].append((mb, c, s + dur))
                orders[d].append(Job(Kind.B, mb, c))
            else:
                dur = dB[c] + dW[c]
                cur[d] -= a[c]
                orders[d].append(Job(Kind.BW, mb, c))
            g_end[(mb, c)] = s + dur
        else:
            dur = dW[c]
            pending_w[d] = [x for x in pending_w[d] if (x[0], x[1]) != (mb, c)]
            cur[d] -= a[c] - b[c]
            orders[d].append(Job(Kind.W, mb, c))
        free[d] = s + dur
        placed += 1
    return orders


def _as_hint(s: Schedule, placement: Placement, split: bool) -> list[list[Job]] | None:
    """Device orders of ``s`` usable as a start for this model, or None (other placement/backward kind)."""
    if s.placement is not placement and s.vpp > 1:
        return None
    kinds = {j.kind for _, _, j in s.jobs()}
    if split and Kind.BW in kinds:
        # a fused BW is B then W at once: same timing and peak, so it converts into a split hint
        return [[x for j in seq for x in ((Job(Kind.B, j.mb, j.chunk), Job(Kind.W, j.mb, j.chunk))
                                          if j.kind is Kind.BW else (j,))] for seq in s.devices]
    if not split and (Kind.B in kinds or Kind.W in kinds):
        return None
    return [list(seq) for seq in s.devices]


def _registry_hints(spec: PlanSpec, placement: Placement, split: bool) -> list[tuple[str, list[list[Job]]]]:
    """Orders of the other registered builders that produce the same kind of schedule."""
    from . import registry

    out = []
    plain = PlanSpec(pp=spec.pp, microbatches=spec.microbatches, vpp=spec.vpp, costs=spec.costs,
                     mem=spec.mem, mem_limit=spec.mem_limit)
    for name in registry.names():
        if name == "optimal":
            continue
        info = registry.get(name)
        try:
            registry.check_vpp(info, spec.vpp)
            s = info.fn(plain)
        except Exception:  # noqa: BLE001 - a hint is optional; any builder failure just means no hint
            continue
        orders = _as_hint(s, placement, split)
        if orders is not None:
            out.append((name, orders))
    return out


# ----------------------------------------------------------------------------- the job graph (shared)
@dataclass(slots=True)
class JobGraph:
    """The solver's view of a shape, scaled to integers: jobs, lags, durations, memory, bounds.

    Shared by the ``optimal`` builder and the polish/lower bounds of :mod:`._polish`.
    ``head[j]``: longest dependency path before j's start; ``tail[j]``: longest path from j's
    start to the end (j's own duration included); ``lb``: the critical-path and device bounds.
    Times are in units of ``1/tscale``, memory in ``1/mscale``.
    """

    pp: int
    vpp: int
    m: int
    nc: int
    placement: Placement
    split: bool
    tscale: int
    mscale: int
    rounded: bool
    iF: list[int]
    iB: list[int]
    iW: list[int]
    icomm: int
    ia: list[int]
    ib: list[int]
    ilimit: int | None
    dev: list[int]
    jobs: list[Job]
    preds: dict
    succs: dict
    head: dict
    tail: dict
    lb: int

    def dur(self, k: Kind, c: int) -> int:
        if k is Kind.F:
            return self.iF[c]
        if k is Kind.B:
            return self.iB[c]
        if k is Kind.W:
            return self.iW[c]
        return self.iB[c] + self.iW[c]

    def delta(self, k: Kind, c: int) -> int:
        if k is Kind.F:
            return self.ia[c]
        if k is Kind.B:
            return -self.ib[c]
        if k is Kind.W:
            return -(self.ia[c] - self.ib[c])
        return -self.ia[c]

    def int_costs(self) -> Costs:
        return Costs(F=tuple(float(x) for x in self.iF), B=tuple(float(x) for x in self.iB),
                     W=tuple(float(x) for x in self.iW), comm=float(self.icomm))


def job_graph(spec: PlanSpec, placement: Placement, split: bool = True) -> JobGraph:
    """Integer job graph of ``spec`` (its costs, memory model and ``mem_limit``) for ``placement``."""
    pp, m, vpp = spec.pp, spec.microbatches, spec.vpp
    nc = pp * vpp
    dF, dB, dW = spec.costs.per_chunk(nc)
    a, b = spec.mem.per_chunk(nc, vpp)
    limit = spec.mem_limit
    tscale, t_rounded = _scale_of(dF + dB + dW + [spec.costs.comm], _TIME_RES, 1000)
    mscale, m_rounded = _scale_of(a + b + ([limit] if limit is not None else []), 1000, _MEM_RES)
    iF = [_to_int(x, tscale) for x in dF]
    iB = [_to_int(x, tscale) for x in dB]
    iW = [_to_int(x, tscale) for x in dW]
    icomm = _to_int(spec.costs.comm, tscale)
    ia = [_to_int(x, mscale) for x in a]
    ib = [_to_int(x, mscale) for x in b]
    ilimit = None if limit is None else int(math.floor(limit * mscale + 1e-6))
    dev = [device_of(c, pp, placement) for c in range(nc)]
    kinds = (Kind.F, Kind.B, Kind.W) if split else (Kind.F, Kind.BW)
    g = JobGraph(pp, vpp, m, nc, placement, split, tscale, mscale, t_rounded or m_rounded, iF, iB, iW, icomm,
                 ia, ib, ilimit, dev, [], {}, {}, {}, {}, 0)
    dur = g.dur
    G = Kind.B if split else Kind.BW  # the job that produces the input grad
    jobs = [Job(k, mb, c) for mb in range(m) for c in range(nc) for k in kinds]
    # predecessors: (job, lag) with lag = comm on a cross-device edge
    preds: dict[Job, list[tuple[Job, int]]] = {}
    for j in jobs:
        k, mb, c = j
        p = []
        if k is Kind.F and c > 0:
            p.append((Job(Kind.F, mb, c - 1), icomm if dev[c - 1] != dev[c] else 0))
        elif k is G:
            p.append((Job(Kind.F, mb, c), 0))
            if c < nc - 1:
                p.append((Job(G, mb, c + 1), icomm if dev[c + 1] != dev[c] else 0))
        elif k is Kind.W:
            p.append((Job(Kind.B, mb, c), 0))
        preds[j] = p
    # heads (earliest start) and tails (longest path from a job's start to the end)
    order = sorted(jobs, key=lambda j: _topo_key(j, nc))
    head = {}
    for j in order:
        head[j] = max((head[p] + dur(p.kind, p.chunk) + lag for p, lag in preds[j]), default=0)
    succs: dict[Job, list[tuple[Job, int]]] = {j: [] for j in jobs}
    for j in jobs:
        for p, lag in preds[j]:
            succs[p].append((j, lag))
    tail = {}
    for j in reversed(order):
        tail[j] = dur(j.kind, j.chunk) + max((lag + tail[s] for s, lag in succs[j]), default=0)
    lb = max(head[j] + tail[j] for j in jobs)
    for d in range(pp):
        on = [j for j in jobs if dev[j.chunk] == d]
        if on:
            lb = max(lb, min(head[j] for j in on) + sum(dur(j.kind, j.chunk) for j in on)
                     + min(tail[j] - dur(j.kind, j.chunk) for j in on))
    g.jobs, g.preds, g.succs, g.head, g.tail, g.lb = jobs, preds, succs, head, tail, lb
    return g


# ----------------------------------------------------------------------------- builder
#: the options of the ``optimal`` builder (see its docstring)
OPTIONS = (
    Option(name="time_limit", type="float", min=0, min_open=True, default=10.0, help="solver seconds"),
    Option(name="placement", type="choice", choices=("v", "interleaved"), default=None,
           help="chunk placement (default v for vpp 2, else interleaved)"),
    Option(name="backward", type="choice", choices=("split", "bw"), default="split",
           help="split = B and W jobs, bw = fused backward"),
    Option(name="workers", type="int", min=1, default=None, help="CP-SAT search workers (default: CPUs, at most 8)"),
    Option(name="seed", type="int", default=0, help="solver random seed"),
    Option(name="allow_large", type="bool", default=False, help=f"solve above {MAX_JOBS} jobs"),
    Option(name="hints", type="bool", default=True, help="also start from the other builders' schedules"),
    Option(name="formulation", type="choice", choices=("auto", "interval", "time", "both"), default="auto",
           help="CP-SAT model"),
    Option(name="start_from", type="any", default=None, help="extra Schedules to start from"))


def _placement(vpp: int, options: dict) -> Placement:
    """optimal's placement: option ``placement``, default v for vpp 2, else interleaved."""
    return Placement(str(options.get("placement", "v" if vpp == 2 else "interleaved")).lower())


@register("optimal", description="exact minimum makespan under the memory limit (OR-Tools CP-SAT; small shapes: "
                                 f"at most {MAX_JOBS} jobs, e.g. pp<=4, m<=8, vpp<=2)",
          vpp="any", memory_aware=True, options=OPTIONS, placement=_placement)
def optimal(spec: PlanSpec) -> Schedule:
    """Minimum-makespan schedule by CP-SAT.

    Options (``spec.options``):
        time_limit  seconds for the solver (default 10); on expiry the best schedule found is
                    returned with status FEASIBLE and the proven lower bound
        placement   ``v`` or ``interleaved`` (default ``v`` for vpp 2, else ``interleaved``)
        backward    ``split`` (B and W, default) or ``bw`` (fused BW)
        workers     CP-SAT search workers (default: CPU count, at most 8)
        seed        solver random seed (default 0)
        allow_large solve even above the size limit (expect FEASIBLE, not OPTIMAL)
        hints       also start from the other registered builders' schedules (default True; the
                    built-in greedy and serial starts are always used)
        start_from  extra Schedules to start from (e.g. heuristics the caller already built)
        formulation ``interval`` (NoOverlap + reservoir), ``time`` (time-indexed 0-1 rows with a
                    stronger LP instead of the reservoir), ``both``, or ``auto`` (default: interval
                    for half the time, then both from the best schedule found, under a memory
                    limit; interval alone without one)
    meta: status, objective, best_bound, gap (objective/bound - 1), wall_time_s, makespan
    (re-simulated), hint (the best starting schedule and its makespan).
    """
    opts = dict(spec.options)  # keys outside OPTIONS were refused by registry.build
    pp, m, vpp = spec.pp, spec.microbatches, spec.vpp
    nc = pp * vpp
    try:
        time_limit = float(opts.get("time_limit", 10.0))
    except (TypeError, ValueError):
        raise ScheduleError(f"optimal: time_limit must be a number of seconds, got {opts.get('time_limit')!r}") from None
    if not time_limit > 0:
        raise ScheduleError(f"optimal: time_limit must be > 0 seconds, got {time_limit}")
    placement_opt = str(opts.get("placement", "v" if vpp == 2 else "interleaved")).lower()
    if placement_opt not in ("v", "interleaved"):
        raise ScheduleError(f"optimal: placement must be 'v' or 'interleaved', got {placement_opt!r}")
    placement = Placement(placement_opt)
    backward = str(opts.get("backward", "split")).lower()
    if backward not in ("split", "bw"):
        raise ScheduleError(f"optimal: backward must be 'split' (B and W) or 'bw' (fused), got {backward!r}")
    split = backward == "split"
    formulation = str(opts.get("formulation", "auto")).lower()
    if formulation not in ("auto", "interval", "time", "both"):
        raise ScheduleError(f"optimal: formulation must be auto, interval, time or both, got {formulation!r}")
    try:
        workers = int(opts.get("workers", min(8, os.cpu_count() or 1)))
        seed = int(opts.get("seed", 0))
    except (TypeError, ValueError):
        raise ScheduleError("optimal: workers and seed must be integers") from None
    if workers < 1:
        raise ScheduleError(f"optimal: workers must be >= 1, got {workers}")
    for key in ("allow_large", "hints"):
        if not isinstance(opts.get(key, False), bool):
            raise ScheduleError(f"optimal: {key} must be true or false, got {opts[key]!r}")
    n_jobs = m * nc * (3 if split else 2)
    if n_jobs > MAX_JOBS and not opts.get("allow_large", False):
        raise ScheduleError(
            f"optimal: pp={pp} vpp={vpp} m={m} has {n_jobs} jobs; the exact solver takes at most {MAX_JOBS} "
            f"(e.g. pp<=4, m<=8, vpp<=2 with split backward); pass the option allow_large=True to try anyway "
            f"(it returns the best schedule found in time_limit with its proven bound)")

    dF, dB, dW = spec.costs.per_chunk(nc)
    if split and any(x <= 0 for x in dF + dB + dW):
        raise ScheduleError("optimal: every F, B and W duration must be > 0 (use backward=bw if W is 0)")
    if not split and (any(x <= 0 for x in dF) or any(x + y <= 0 for x, y in zip(dB, dW))):
        raise ScheduleError("optimal: every F and B+W duration must be > 0")
    a, b = spec.mem.per_chunk(nc, vpp)
    need = min_feasible_limit(pp, vpp, placement, spec.mem)
    limit = spec.mem_limit
    if limit is not None and limit < need - 1e-9:
        raise ScheduleError(
            f"optimal: memory limit {limit:g} units is infeasible for pp={pp} vpp={vpp} ({placement.value} "
            f"placement): every schedule needs at least {need:g} units (= {need / pp:g}p) on some device")

    t_start = time.perf_counter()
    g = job_graph(spec, placement, split)
    if split:  # the memory-aware terms of pipeloom.schedule.search.polish (proofs there) raise the path bound
        from .search.polish import graph_bound

        g.lb = max(g.lb, graph_bound(g)[0])
    jobs, dev, lb, tscale = g.jobs, g.dev, g.lb, g.tscale
    t_rounded = m_rounded = g.rounded

    # --- starting schedules: hint and upper bound
    icosts = g.int_costs()
    candidates: list[tuple[str, list[list[Job]]]] = [("serial", _serial_orders(pp, m, nc, placement, split))]
    for f_first in (False, True):
        try:
            candidates.append((f"greedy{'-f' if f_first else ''}",
                               _greedy_orders(pp, m, nc, placement, split, dF, dB, dW, spec.costs.comm,
                                              a, b, limit, f_first)))
        except ScheduleError:
            pass
    if opts.get("hints", True):
        candidates += _registry_hints(spec, placement, split)
    start_from = opts.get("start_from", ()) or ()
    if not isinstance(start_from, (list, tuple)):
        raise ScheduleError("optimal: start_from must hold Schedules of the same pp, vpp and microbatches")
    for given in start_from:
        if not isinstance(given, Schedule) or (given.pp, given.vpp, given.microbatches) != (pp, vpp, m):
            raise ScheduleError("optimal: start_from must hold Schedules of the same pp, vpp and microbatches")
        orders = _as_hint(given, placement, split)
        if orders is not None:
            candidates.append((given.name, orders))
    best_hint = None
    for name, orders in candidates:
        s = Schedule("hint", pp, vpp, m, placement, orders)
        if limit is not None and max(memory_profile(s, spec.mem)[0]) > limit + 1e-9:
            continue
        try:
            r = simulate(s, icosts)
        except DeadlockError:
            continue
        if best_hint is None or r.makespan < best_hint[1].makespan:
            best_hint = (name, r)
    assert best_hint is not None, "the serial schedule always fits a feasible limit"
    horizon = int(round(best_hint[1].makespan))
    hint_start = _relabel_hint(_hint_starts(best_hint[1]), m, nc)
    if lb >= horizon:  # a starting schedule already meets the lower bound: optimal, no search needed
        return _finish(spec, placement, backward, {j: hint_start[j] for j in jobs}, jobs, dev, nc, tscale,
                       "OPTIMAL", f"lower bound met by {best_hint[0]}", horizon, lb, time.perf_counter() - t_start,
                       time_limit, workers, "-", limit, best_hint, t_rounded or m_rounded)

    # --- CP-SAT
    if formulation == "auto":
        # Measured on the memory-bound V cases (pp 2-4, m 4-8, 1p, 2 workers): neither model dominates.
        # The interval model proves most cases fastest (pp4 m8 vpp1 1p: 4 s, the time-indexed one none
        # in 9 s); the time-indexed rows prove others it cannot (pp2 m6 vpp2 1p: 11 s vs none in 14 s).
        # So: interval for the first half of the time, then both, starting from the best found.
        phases = ["interval", "both"] if g.ilimit is not None else ["interval"]
    else:
        phases = [formulation]
    vals, objective, bound, status_name, used = hint_start, horizon, lb, "FEASIBLE", []
    source = f"hint ({best_hint[0]}); CP-SAT found nothing better in time_limit={time_limit:g} s"
    t_solve0 = time.perf_counter()
    for k, form in enumerate(phases):
        budget = (time_limit - (time.perf_counter() - t_solve0)) / (len(phases) - k)
        if budget <= 0.05:
            break
        used.append(form)
        res = solve_graph(g, form, vals, objective, time_limit=budget, workers=workers, seed=seed)
        if res is None:
            continue
        r_status, r_vals, r_obj, r_bound = res
        bound = max(bound, r_bound)
        if r_obj <= objective:
            vals, objective, source = r_vals, r_obj, "cp-sat"
        if r_status == "OPTIMAL" or bound >= objective:
            status_name = "OPTIMAL"
            break
    return _finish(spec, placement, backward, vals, jobs, dev, nc, tscale, status_name, source, objective, bound,
                   time.perf_counter() - t_start, time_limit, workers, "+".join(used), limit, best_hint,
                   t_rounded or m_rounded)


def solve_graph(g: "JobGraph", form: str, hint_vals: dict, horizon: int, *, time_limit: float | None = None,
                det_time: float | None = None, workers: int = 1, seed: int = 0, extra_lb: int = 0,
                params: dict | None = None, fixed_before: int | None = None, stats: dict | None = None):
    """Build and solve one CP-SAT model of ``g``; (status, starts, objective, bound) or None without a solution.

    ``horizon`` is the makespan of ``hint_vals``, a feasible schedule: the model looks for one at
    most that long, so it always has a solution and the bound it proves holds for every
    schedule. ``time_limit`` is wall seconds,
    ``det_time`` CP-SAT's deterministic time (the same result on any machine and load with one
    worker and a fixed seed). ``extra_lb`` is a makespan bound proved elsewhere; ``params`` more
    CP-SAT parameters by name. ``fixed_before``: every job whose hint starts before this time keeps
    that start (a window re-solve; the microbatch-order symmetry cut is then left out, as the fixed
    part need not follow it). ``stats``, if given, receives ``det_time``, the deterministic time used.
    """
    from ortools.sat.python import cp_model  # lazy: the core must import fast

    jobs, preds, succs, dur, delta, dev, head, tail = (g.jobs, g.preds, g.succs, g.dur, g.delta, g.dev, g.head,
                                                       g.tail)
    lb = max(g.lb, extra_lb)
    if lb > horizon:  # the caller's schedule would beat a proven bound: cannot happen; no model to solve
        return None
    model = cp_model.CpModel()
    start, end, itv = {}, {}, {}
    for j in jobs:
        du = dur(j.kind, j.chunk)
        v = int(round(hint_vals[j]))
        lo, hi = (v, v) if fixed_before is not None and v < fixed_before else (head[j], horizon - tail[j])
        s = model.new_int_var(lo, hi, f"s_{j}")
        start[j] = s
        end[j] = s + du
        itv[j] = model.new_fixed_size_interval_var(s, du, f"i_{j}")
    makespan = model.new_int_var(lb, horizon, "makespan")
    for j in jobs:
        for p, lag in preds[j]:
            model.add(start[j] >= end[p] + lag)
        if not succs[j]:
            model.add(makespan >= end[j])
    for d in range(g.pp):
        on = [j for j in jobs if dev[j.chunk] == d]
        model.add_no_overlap([itv[j] for j in on])
        if g.ilimit is not None and form in ("interval", "both"):
            model.add_reservoir_constraint([start[j] for j in on], [delta(j.kind, j.chunk) for j in on],
                                           0, g.ilimit)
    if form in ("time", "both"):
        _time_indexed(model, jobs, start, preds, dur, delta, dev, g.pp, g.ilimit, head, tail, horizon)
    # symmetry: microbatches are interchangeable, take chunk 0's forwards in microbatch order
    for mb in range(g.m - 1 if fixed_before is None else 0):
        model.add(start[Job(Kind.F, mb + 1, 0)] >= end[Job(Kind.F, mb, 0)])
    for j in jobs:
        model.add_hint(start[j], int(round(hint_vals[j])))
    model.add_hint(makespan, horizon)
    model.minimize(makespan)

    solver = cp_model.CpSolver()
    if time_limit is not None:
        solver.parameters.max_time_in_seconds = time_limit
    if det_time is not None:
        solver.parameters.max_deterministic_time = det_time
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    # probing in presolve costs seconds on these dense precedence models and did not pay off here
    solver.parameters.cp_model_probing_level = 0
    for k, v in (params or {}).items():
        setattr(solver.parameters, k, v)
    status = solver.solve(model)
    if stats is not None:
        stats["det_time"] = solver.deterministic_time
    if status == cp_model.INFEASIBLE:  # impossible: the hint is feasible; kept as a guard
        raise RuntimeError("optimal: CP-SAT reports a feasible starting schedule infeasible")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    vals = {j: solver.value(start[j]) for j in jobs}
    objective = int(round(solver.objective_value))
    bound = max(int(math.ceil(solver.best_objective_bound - 1e-9)), lb)
    return solver.status_name(status), vals, objective, bound


def _finish(spec, placement, backward, vals, jobs, dev, nc, tscale, status_name, source, objective, bound, wall,
            time_limit, workers, formulation, limit, best_hint, rounded) -> Schedule:
    """Order each device's jobs by start time, fill meta, re-simulate and check."""
    pp, vpp, m = spec.pp, spec.vpp, spec.microbatches
    devices = []
    for d in range(pp):
        on = [j for j in jobs if dev[j.chunk] == d]
        on.sort(key=lambda j: (vals[j], _topo_key(j, nc)))
        devices.append(tuple(on))
    objective = objective / tscale
    bound = bound / tscale
    meta = {
        "status": status_name,
        "source": source,
        "objective": objective,
        "best_bound": bound,
        "gap": (objective / bound - 1.0) if bound > 0 else 0.0,
        "wall_time_s": round(wall, 3),
        "time_limit": time_limit,
        "workers": workers,
        "formulation": formulation,
        "placement": placement.value,
        "backward": backward,
        "mem_limit": limit,
        "hint": {"from": best_hint[0], "makespan": best_hint[1].makespan / tscale},
    }
    if rounded:
        meta["rounded"] = True
    sched = Schedule("optimal", pp, vpp, m, placement, tuple(devices), meta=meta)
    # re-time the solver's order; ASAP re-timing never loses (see the module docstring)
    r = simulate(sched, spec.costs, spec.mem)
    meta["makespan"] = r.makespan
    if not rounded and r.makespan > objective + 1e-6:
        raise RuntimeError(f"optimal: re-simulated makespan {r.makespan} exceeds the solver's {objective}")
    return sched


def _topo_key(j: Job, nc: int) -> tuple:
    """A key that sorts jobs topologically: forwards by chunk, then backwards by reversed chunk."""
    k, mb, c = j
    if k is Kind.F:
        return (mb, c, 0)
    if k is Kind.W:
        return (mb, 2 * nc - c, 1)
    return (mb, 2 * nc - 1 - c, 0)


def _hint_starts(res) -> dict[Job, float]:
    out = {}
    for d, seq in enumerate(res.schedule.devices):
        for i, j in enumerate(seq):
            out[j] = res.start[d][i]
    return out


def _relabel_hint(starts: dict[Job, float], m: int, nc: int) -> dict[Job, float]:
    """Rename microbatches so chunk 0's forwards start in microbatch order (the model's symmetry rule)."""
    order = sorted(range(m), key=lambda mb: starts.get(Job(Kind.F, mb, 0), 0.0))
    new_of = {old: new for new, old in enumerate(order)}
    return {Job(j.kind, new_of[j.mb], j.chunk): t for j, t in starts.items()}


def _time_indexed(model, jobs, start, preds, dur, delta, dev, pp, ilimit, head, tail, horizon) -> None:
    """Time-indexed 0-1 rows (strong LP relaxation): y[j,t] = 1 iff job j has started by time t.

    start_j = sum_t (1 - y[j,t]) over its window; precedence y[j,t] <= y[p, t - dur_p - lag];
    device: sum_j (y[j,t] - y[j,t-dur_j]) <= 1; memory: sum_j delta_j y[j,t] <= limit.
    """
    y = {}
    for j in jobs:
        lo, hi = head[j], horizon - tail[j]
        ys = {}
        prev = None
        for t in range(lo, hi + 1):
            v = model.new_bool_var("") if t < hi else model.new_constant(1)
            if prev is not None:
                model.add(v >= prev)
            ys[t] = v
            prev = v
        y[j] = (lo, hi, ys)
        model.add(start[j] == lo + sum(1 - ys[t] for t in range(lo, hi)))

    def yv(j, t):
        lo, hi, ys = y[j]
        if t < lo:
            return 0
        if t >= hi:
            return 1
        return ys[t]

    for j in jobs:
        lo, hi, _ = y[j]
        for p, lag in preds[j]:
            for t in range(lo, hi):
                model.add(yv(j, t) <= yv(p, t - dur(p.kind, p.chunk) - lag))
    for d in range(pp):
        on = [j for j in jobs if dev[j.chunk] == d]
        for t in range(horizon):
            terms = []
            for j in on:
                a_, b_ = yv(j, t), yv(j, t - dur(j.kind, j.chunk))
                if isinstance(a_, int) and isinstance(b_, int):
                    if a_ - b_:
                        terms.append(a_ - b_)
                    continue
                terms.append(a_ - b_)
            if terms:
                model.add(sum(terms) <= 1)
            if ilimit is not None:
                model.add(sum(delta(j.kind, j.chunk) * yv(j, t) for j in on) <= ilimit)

