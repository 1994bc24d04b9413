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
      memory terms of :func:`pipeloom.schedule.search.bounds.lower_bound` (warm-up and last forward);
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

from ..core.costs import MemModel
from ..core.errors import DeadlockError
from ..sim import kernel, listsched
from ..sim.simulate import memory_profile, simulate
from ..core.ir import Job, Kind, Placement, Schedule, device_of
from . import registry as _registry
from .registry import Option, PlanSpec, register
from ..core.errors import ScheduleError
from ..core import progress
from ..core.limits import MAX_SOLVER_SECONDS

#: the solver refuses larger problems unless ``allow_large=True`` (e.g. pp 4, m 8, vpp 2, split)
MAX_JOBS = 192



def min_feasible_limit(pp: int, vpp: int, placement: Placement | str, mem: MemModel | None = None) -> float:
    """Smallest memory limit (units) under which any valid schedule exists: ``max_d sum_{c on d} a_c``
    (:func:`pipeloom.schedule.registry.min_feasible_limit`, the one floor)."""
    return _registry.min_feasible_limit(pp, vpp, placement, mem)


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
    reserved = [0.0] * pp     # promised to admitted microbatches whose forward has not reached d yet
    # the list-scheduling board: readiness (core.rules as the timing kernel's tables), each device's clock
    # (``free``), live activation memory (``mem``, core.rules.memory_delta) and the job lists
    board = listsched.Board.make(pp, m, kernel.Rules.make(pp, nc, placement, comm), dF, dB, dW, a, b)
    cur, free = board.mem, board.free
    kbase = {k: kernel.KIND_INDEX[k] * nc for k in kernel.KINDS}  # a job's board slot: kbase[kind] + chunk

    def ready(kind: Kind, mb: int, c: int) -> float | None:
        """When the job's needs are met on device dev[c], comm added across devices; None: not yet."""
        r = board.ready(kbase[kind] + c, mb)
        return None if r < 0 else r

    next_f = [0] * nc         # forwards on each chunk go in microbatch order
    pending_b: list[set] = [set() for _ in range(pp)]   # (mb, c) whose F is done, backward not started
    pending_w: list[list] = [[] for _ in range(pp)]     # (mb, c, ready time) after B
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
                if c == 0 and any(cur[x] + reserved[x] + need[x] > lim for x in range(pp)):
                    continue  # admission: every device must be able to hold the new microbatch
                r = ready(Kind.F, mb, c)
                if r is None:
                    continue
                cands.append((max(free[d], r), 1 if f_first else 2, -c, ("F", mb, c)))
            for mb, c in pending_b[d]:
                r = ready(Kind.B, mb, c)
                if r is None:
                    continue
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
        kind = {"F": Kind.F, "B": Kind.B if split else Kind.BW, "W": Kind.W}[k]
        e = board.commit(d, kbase[kind] + c, mb, s)
        if kind is Kind.F:
            if c == 0:
                for x in range(pp):
                    reserved[x] += need[x]
            reserved[d] -= a[c]
            next_f[c] += 1
            pending_b[d].add((mb, c))
        elif kind is Kind.W:
            pending_w[d] = [x for x in pending_w[d] if (x[0], x[1]) != (mb, c)]
        else:
            pending_b[d].discard((mb, c))
            if split:
                pending_w[d].append((mb, c, e))
        placed += 1
    return board.seqs


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


# ----------------------------------------------------------------------------- builder
#: the options of the ``optimal`` builder (see its docstring)
OPTIONS = (
    Option(name="time_limit", type="float", min=0, min_open=True, max=MAX_SOLVER_SECONDS, default=10.0,
           help="solver seconds"),
    Option(name="placement", type="choice", choices=("v", "interleaved"), default=None,
           help="chunk placement (default v for vpp 2, else interleaved)"),
    Option(name="backward", type="choice", choices=("split", "bw"), default="split",
           help="split = B and W jobs, bw = fused backward"),
    Option(name="workers", type="int", min=1, max=256, default=None,
           help="CP-SAT search workers (default: CPUs, at most 8)"),
    Option(name="seed", type="int", default=0, min=0, max=2**31 - 1, help="solver random seed (CP-SAT's is 32-bit)"),
    Option(name="allow_large", type="bool", default=False, help=f"solve above {MAX_JOBS} jobs"),
    Option(name="hints", type="bool", default=True, help="also start from the other builders' schedules"),
    Option(name="formulation", type="choice", choices=("auto", "interval", "time", "both"), default="auto",
           help="CP-SAT model"),
    Option(name="start_from", type="any", default=None, help="extra Schedules to start from"))


def _placement(vpp: int, options: dict) -> Placement:
    """optimal's placement: option ``placement``, default v for vpp 2, else interleaved."""
    return Placement(str(options.get("placement", "v" if vpp == 2 else "interleaved")).lower())


def _shapes(pp: int, vpp: int, m: int, options: dict) -> str | None:
    """optimal's declared shapes: at most ``MAX_JOBS`` jobs (unless the option allow_large is true)."""
    split = str(options.get("backward", "split")).lower() != "bw"
    n_jobs = m * pp * vpp * (3 if split else 2)
    if n_jobs > MAX_JOBS and options.get("allow_large", False) is not True:
        return (f"optimal: pp={pp} vpp={vpp} m={m} has {n_jobs} jobs; the exact solver takes at most {MAX_JOBS} "
                f"(e.g. pp<=4, m<=8, vpp<=2 with split backward); pass the option allow_large=True to try anyway "
                f"(it returns the best schedule found in time_limit with its proven bound)")
    return None


@register("optimal", description="exact minimum makespan under the memory limit (OR-Tools CP-SAT; small shapes: "
                                 f"at most {MAX_JOBS} jobs, e.g. pp<=4, m<=8, vpp<=2)",
          vpp="any", memory_aware=True, options=OPTIONS, placement=_placement, shapes=_shapes)
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
    # the CP-SAT machinery is imported when the builder runs, not when the registry loads the families
    from .search.bounds import graph_bound
    from .search.cpsat import hint_starts, job_graph, relabel_hint, solve_graph

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
    too_large = _shapes(pp, vpp, m, opts)
    if too_large:
        raise ScheduleError(too_large)

    dF, dB, dW = spec.costs.per_chunk(nc)
    if split and any(x <= 0 for x in dF + dB + dW):
        raise ScheduleError("optimal: every F, B and W duration must be > 0 (use backward=bw if W is 0)")
    if not split and (any(x <= 0 for x in dF) or any(x + y <= 0 for x, y in zip(dB, dW))):
        raise ScheduleError("optimal: every F and B+W duration must be > 0")
    a, b = spec.mem.per_chunk(nc, vpp)
    limit = _registry.effective_limit("optimal", spec)

    t_start = time.perf_counter()
    g = job_graph(spec, placement, split)
    if split:  # the memory-aware terms of pipeloom.schedule.search.bounds (proofs there) raise the path bound
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
    hint_start = relabel_hint(hint_starts(best_hint[1]), m, nc)
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
        # ortools loaded before the report that says Ctrl-C stops the solve: an interrupt inside its module
        # initialisation would surface as an ImportError
        from ortools.sat.python import cp_model  # noqa: F401
        progress.report(f"solving with CP-SAT ({form} model, {len(jobs)} jobs, at most {budget:.3g} s; Ctrl-C stops)")
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


def _finish(spec, placement, backward, vals, jobs, dev, nc, tscale, status_name, source, objective, bound, wall,
            time_limit, workers, formulation, limit, best_hint, rounded) -> Schedule:
    """Order each device's jobs by start time, fill meta, re-simulate and check."""
    from .search.cpsat import topo_key

    pp, vpp, m = spec.pp, spec.vpp, spec.microbatches
    devices = []
    for d in range(pp):
        on = [j for j in jobs if dev[j.chunk] == d]
        on.sort(key=lambda j: (vals[j], topo_key(j, nc)))
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


