"""The CP-SAT view of a schedule shape, shared by the exact builder and the polish (no torch; ortools lazily).

:func:`job_graph` turns a :class:`~pipeloom.schedule.registry.PlanSpec` into an integer job graph (jobs,
lags, durations, memory, heads/tails and the path and device bounds) whose dependencies, durations and
memory deltas come from :mod:`pipeloom.core.rules`; :func:`solve_graph` builds and solves one CP-SAT model
of it (interval + reservoir, or time-indexed rows, or both). Used by :mod:`pipeloom.schedule.optimal` and
:mod:`.polish`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

from ...core import rules
from ...core.costs import Costs
from ...core.ir import Job, Kind, Placement, device_of
from ..registry import PlanSpec

TIME_RES = 10 ** 4  # largest denominator accepted as exact for a duration
MEM_RES = 10 ** 6


def scale_of(values: Sequence[float], max_den: int, fallback: int) -> tuple[int, bool]:
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


def to_int(v: float, scale: int) -> int:
    return int(round(v * scale))


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
        """Integer duration of a job (:func:`pipeloom.core.rules.duration` on the scaled costs)."""
        return rules.duration(k, c, self.iF, self.iB, self.iW)

    def delta(self, k: Kind, c: int) -> int:
        """Integer memory change of a job (:func:`pipeloom.core.rules.memory_delta` on the scaled model)."""
        return rules.memory_delta(k, self.ia[c], self.ib[c])

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
    tscale, t_rounded = scale_of(dF + dB + dW + [spec.costs.comm], TIME_RES, 1000)
    mscale, m_rounded = scale_of(a + b + ([limit] if limit is not None else []), 1000, MEM_RES)
    iF = [to_int(x, tscale) for x in dF]
    iB = [to_int(x, tscale) for x in dB]
    iW = [to_int(x, tscale) for x in dW]
    icomm = to_int(spec.costs.comm, tscale)
    ia = [to_int(x, mscale) for x in a]
    ib = [to_int(x, mscale) for x in b]
    ilimit = None if limit is None else int(math.floor(limit * mscale + 1e-6))
    dev = [device_of(c, pp, placement) for c in range(nc)]
    kinds = (Kind.F, Kind.B, Kind.W) if split else (Kind.F, Kind.BW)
    g = JobGraph(pp, vpp, m, nc, placement, split, tscale, mscale, t_rounded or m_rounded, iF, iB, iW, icomm,
                 ia, ib, ilimit, dev, [], {}, {}, {}, {}, 0)
    dur = g.dur
    jobs = [Job(k, mb, c) for mb in range(m) for c in range(nc) for k in kinds]
    # predecessors (the rules' dependencies): (job, lag) with lag = comm on a cross-device edge
    preds: dict[Job, list[tuple[Job, int]]] = {
        j: [(p, icomm if dev[p.chunk] != dev[j.chunk] else 0) for p in rules.dependencies(j, nc, split=split)]
        for j in jobs}
    # heads (earliest start) and tails (longest path from a job's start to the end)
    order = sorted(jobs, key=lambda j: topo_key(j, nc))
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
    by_dev: dict[int, list[Job]] = {}  # one pass over the jobs (a scan per device is quadratic in pp)
    for j in jobs:
        by_dev.setdefault(dev[j.chunk], []).append(j)
    for on in by_dev.values():
        lb = max(lb, min(head[j] for j in on) + sum(dur(j.kind, j.chunk) for j in on)
                 + min(tail[j] - dur(j.kind, j.chunk) for j in on))
    g.jobs, g.preds, g.succs, g.head, g.tail, g.lb = jobs, preds, succs, head, tail, lb
    return g


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
    status = solve_interruptibly(solver, model)
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


def topo_key(j: Job, nc: int) -> tuple:
    """A key that sorts jobs topologically: forwards by chunk, then backwards by reversed chunk."""
    k, mb, c = j
    if k is Kind.F:
        return (mb, c, 0)
    if k is Kind.W:
        return (mb, 2 * nc - c, 1)
    return (mb, 2 * nc - 1 - c, 0)


def hint_starts(res) -> dict[Job, float]:
    out = {}
    for d, seq in enumerate(res.schedule.devices):
        for i, j in enumerate(seq):
            out[j] = res.start[d][i]
    return out


def relabel_hint(starts: dict[Job, float], m: int, nc: int) -> dict[Job, float]:
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


#: set when Ctrl-C stopped a solve: ortools 9.15 then aborts the process in its static destructors at exit
#: ("terminate called without an active exception"), so the command line leaves with ``os._exit``
interrupted_solve = False


def solve_interruptibly(solver, model):
    """``solver.solve(model)``, stopped within a fraction of a second by Ctrl-C (SIGINT).

    CP-SAT's solve is one long C++ call during which Python runs no signal handler; in the main thread it
    therefore runs in a helper thread while the main thread waits in short joins, where a SIGINT raises
    KeyboardInterrupt: the search is then stopped (``stop_search``) and the interrupt passed on."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return solver.solve(model)
    box: dict = {}
    # CP-SAT's own SIGINT handler (installed process-wide by solve()) would take the signal from Python's and,
    # called outside the solving thread, aborts the process (std::bad_function_call, ortools 9.15)
    solver.parameters.catch_sigint_signal = False

    def target() -> None:
        try:
            box["status"] = solver.solve(model)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread below
            box["error"] = e

    t = threading.Thread(target=target, name="pipeloom-cp-sat", daemon=True)
    t.start()
    try:
        while t.is_alive():
            t.join(0.05)
    except KeyboardInterrupt:
        global interrupted_solve
        interrupted_solve = True
        solver.stop_search()
        t.join(5.0)
        raise
    if "error" in box:
        raise box["error"]
    return box["status"]
