"""Search tp, pp, vpp, dp, micro-batch size, schedule, memory limit, recompute, ZeRO-1 and the layer
partition for the fastest configuration that fits (no torch).

Order of work (the space of a 70B model on 1,024 GPUs holds tens of thousands of configurations):

1. enumerate every configuration (:func:`.space.enumerate_space`); drop those that cannot exist and those
   whose memory lower bound is over the GPU;
2. a cheap step-time lower bound for each, and a memory-aware one when its turn comes (:mod:`.bounds`,
   where every bound is written down once);
3. simulate in increasing order of the bound and stop once it passes the ``top``-th best step time found:
   nothing left can enter the ranking, so pruning never drops the best.

Simulations are cached by (schedule, pp, vpp, m, normalised per-chunk costs, memory model, limit).
"""
from __future__ import annotations

import copy
import dataclasses
import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from ..core.costs import Costs, MemModel
from ..core.errors import ScheduleError
from ..memory.budget import activation_trace
from ..schedule import registry
from ..schedule.registry import PlanSpec
from ..sim.dp import device_dp
from ..sim.simulate import simulate
from .bounds import BOUNDED, _rounded_mem, builder_limit, lower_bound, memory_bound, memory_lower_bound  # noqa: F401
from .comm_terms import TPOverlap
from .costs import (GRAD_BYTES, PARAM_BYTES, backward_fused, chunk_costs, comm_p2p, dp_bucket_params,  # noqa: F401
                    dp_link, dp_ranks_per_node, dp_time, optimizer_time, step_model_flops)
from .space import (PARTITIONS, RECOMPUTES, SLOW, SWEEP_OPTIONS, Config, Problem, TuneError,  # noqa: F401
                    _Space, builder_vpps, enumerate_space)


@dataclass(slots=True)
class TuneResult:
    problem: Problem
    configs: list[Config]
    """evaluated configurations, best first (fitting ones before the others)"""
    searched: int
    pruned: dict[str, int]
    simulations: int
    cache_hits: int
    seconds: float
    explain: dict = field(default_factory=dict)

    @property
    def best(self) -> Config | None:
        return self.configs[0] if self.configs and self.configs[0].fits else None

    def to_dict(self) -> dict:
        out = {"configs": [c.to_dict() for c in self.configs if c.fits], "searched": self.searched,
                "pruned": dict(sorted(self.pruned.items(), key=lambda kv: -kv[1])),
                "simulated": self.simulations, "cache_hits": self.cache_hits, "seconds": round(self.seconds, 3),
                "model": self.problem.model.name, "gpus": self.problem.gpus, "gpu": self.problem.gpu.to_dict(),
                "global_batch": self.problem.global_batch, "seq": self.problem.seq,
                "calibration": self.problem.calibration.to_dict()}
        return out



# ------------------------------------------------------------------------------------------ evaluation
#: significant digits of the cost ratios a shared plan is keyed (and planned) on
PLAN_DIGITS = 3


def _q(x: float) -> float:
    return float(f"{x:.{PLAN_DIGITS}g}")


def _request(space: _Space, c: Config, refine: bool):
    """What :func:`evaluate` needs before simulating ``c``: the plan key and spec with the costs and memory
    model around them; None when ``c`` cannot be planned (its error is set)."""
    F, B, W, comm = chunk_costs(space, c)
    unit = max(F) or 1.0
    budget = space.budget(c)
    a, bfree = budget.a, budget.b
    a_r, b_r = _rounded_mem(a, bfree, not backward_fused(c.schedule))
    info = registry.get(c.schedule)
    if c.mem_limit_mode == "fit" and space.fit_units(c) < max(a_r):
        c.fits, c.error = False, "memory: no room for one chunk's activations"
        return None
    limit = space.given_limit(c)
    opts = {} if refine else {k: v for k, v in SWEEP_OPTIONS.items() if k in info.option_names}
    # the plan (the job order) is shared by every configuration whose per-chunk cost ratios agree to
    # PLAN_DIGITS significant digits: it is planned once, with those rounded ratios (so it does not depend
    # on which configuration came first), then simulated with each configuration's own costs
    # (the final plans of the leaders, ``refine``, use the exact costs)
    q = (lambda x: x) if refine else _q
    qcosts = Costs(F=tuple(q(x / unit) for x in F), B=tuple(q(x / unit) for x in B),
                   W=tuple(q(x / unit) for x in W), comm=q(comm / unit))
    key = (c.schedule, c.pp, c.vpp, c.microbatches, qcosts.F, qcosts.B, qcosts.W, qcosts.comm,
           a_r, b_r, limit, tuple(sorted(opts.items())))
    spec = PlanSpec(pp=c.pp, vpp=c.vpp, microbatches=c.microbatches, costs=qcosts,
                    mem=MemModel(a=a_r, b=b_r), mem_limit=limit, options=opts)
    return key, spec, (F, B, W, comm, unit, budget, a_r, b_r, limit)


def build_plan(name: str, spec: PlanSpec) -> tuple:
    """(schedule, None) or (None, the builder's one-line error): one plan of the sweep (also run in the
    worker processes of :func:`tune`)."""
    try:
        sched = registry.build(name, spec)
    except (ScheduleError, ValueError) as e:
        return None, str(e).splitlines()[0]
    # the builder's witness (a validation shortcut, memoryviews) is not needed to simulate, nor picklable
    return (dataclasses.replace(sched, witness=None) if sched.witness is not None else sched), None


def _store(space: _Space, key, plan) -> None:
    # (memory_bound trusts each builder to stay within registry.effective_limit, the limit the builder itself
    # plans under; tests/tune/test_tune.py holds every plan of the bounded builders to it)
    space.plans[key] = plan
    space.sim_count += 1


def evaluate(space: _Space, c: Config, *, refine: bool = False) -> Config:
    """Simulate ``c``: step time, MFU, peak memory per device (fills the fields, returns ``c``).

    The schedule is built with :data:`SWEEP_OPTIONS` (where the builder reads them), or with the
    builder's defaults when ``refine``."""
    p = space.p
    req = _request(space, c, refine)
    if req is None:
        return c
    key, spec, (F, B, W, comm, unit, budget, a_r, b_r, limit) = req
    plan = space.plans.get(key)
    if plan is None:
        _store(space, key, build_plan(c.schedule, spec))
        plan = space.plans[key]
    elif key in space.fresh:  # built ahead for this configuration by the batch of tune()
        space.fresh.discard(key)
    else:
        space.hits += 1
    if plan[0] is None:
        hit = (None, None, plan[1])
    else:
        from .moe_costs import chunk_a2a

        B, fill = _fill_priced(space, c, plan[0], B, W)  # --tp-overlap fill: priced B by B of this plan
        aF, aB = chunk_a2a(space, c)  # the all-to-all an overlapped pair hides (0 without expert parallelism)
        exact = Costs(F=tuple(x / unit for x in F), B=tuple(x / unit for x in B), W=tuple(x / unit for x in W),
                      comm=comm / unit, a2a_F=tuple(x / unit for x in aF), a2a_B=tuple(x / unit for x in aB))
        from .moe_costs import pair_pass

        paired = pair_pass(space, c, plan[0], exact)  # tune --pair-fb: F&B pairs hide the all-to-all
        hit = (paired, simulate(paired, exact), None)
    sched, sim, err = hit
    if err:
        c.fits, c.error = False, f"schedule {c.schedule}: {err}"
        return c
    c.schedule_obj, c.sim = sched, sim
    c.mem_limit = limit
    scale = unit
    makespan = sim.makespan * scale
    peaks, _ = activation_trace(sched, budget.a, budget.b)
    chunks = budget.chunk_memory
    # dp reduction: pipeloom.sim.dp's one model (buckets through each chunk's last backward, queued on the
    # device's link; ZeRO-2/3 per microbatch), in the simulation's unit (``scale`` seconds)
    link = dp_link(space, c)
    grad = [ch.params * GRAD_BYTES for ch in chunks]
    par = [ch.params * PARAM_BYTES for ch in chunks]
    bucket = dp_bucket_params(space, c) * GRAD_BYTES
    from .moe_costs import grad_groups

    groups = grad_groups(space, c, chunks)  # dense over dp x cp, routed experts over dp x cp / ep
    finish, dp_ivs = [], []
    for d in range(c.pp):
        end, ivs = device_dp(sim, d, grad, c.dp, link, unit_s=scale, zero=c.zero, param_bytes=par, bucket_bytes=bucket,
                             units=c.seg_layer_num or None, groups=groups)
        finish.append(end * scale)
        dp_ivs.append(ivs)
    pipe = max(finish) if finish else makespan
    opt = max(optimizer_time(space, c, params, sum(ch.expert_params for ch in mine))
              for params, mine in zip(budget.params, budget.chunks))
    c.makespan_s = makespan
    c.exposed_comm_s = max(0.0, pipe - makespan)
    c.optimizer_s = opt
    c.step_time_s = pipe + opt
    c.bubble = sim.bubble
    c.tokens_per_s = p.global_batch * p.seq / c.step_time_s
    c.mfu = step_model_flops(p.model, p.global_batch, p.seq) / (p.gpus * p.gpu.peak_flops * c.step_time_s)
    dev = budget.peak_bytes(peaks)
    U = budget.unit_bytes
    c.device_peaks = dev
    c.peak_bytes = max(dev)
    c.fits = c.peak_bytes + p.reserve <= p.gpu.memory
    if not c.fits:
        c.error = "memory: simulated peak over the GPU"
    c.detail = {"unit_bytes": U, "peak_units": peaks, "comm_p2p_s": comm, "chunk_F_s": F, "chunk_B_s": B,
                "chunk_W_s": W, "dp_link": "intra" if dp_link(space, c) is space.gpu.intra else
                f"inter x {dp_ranks_per_node(space, c)} NICs",
                "dp_busy_s": max((sum(e - s for s, e, _ in ivs) * scale for ivs in dp_ivs), default=0.0),
                "dp_collectives": max((len(ivs) for ivs in dp_ivs), default=0), "tp_fill": fill}
    return c


def _fill_priced(space: _Space, c: Config, sched, B: list[float], W: list[float]) -> tuple[list[float], dict | None]:
    """Under ``--tp-overlap fill``, the per-chunk B seconds of ``c`` with each split B of ``sched`` hiding only what
    the W work pending at its position covers (:func:`pipeloom.tune.comm_terms.fill_b_costs`) and the counts
    ``--explain`` prints; else ``B`` unchanged and None."""
    if c.tp <= 1 or TPOverlap.parse(space.p.tp_overlap).mode != "fill":
        return B, None
    from .comm_terms import column_share, fill_b_costs

    lt = space.times(c.tp, c.microbatch_size, c.recompute, backward_fused(c.schedule), getattr(c, "ep", 1),
                     getattr(c, "cp", 1))[0]
    terms = lt.parts.get("tp_terms_s", {})
    red = terms.get("B", {}).get("tp_dgrad_reduce")
    if not red:
        return B, None
    # inputs gathered again for W (sequence parallelism): fill runs only a W's row-parallel GEMMs
    movable = 1.0 - column_share(space.p.model) if "tp_input_regather" in terms.get("W", {}) else 1.0
    out, pr = fill_b_costs(sched.devices, B, W, c.seg_layer_num, red["total"], red["exposed"], movable)
    return out, {"split_b_per_device": list(pr.split_b), "filled_b_per_device": list(pr.filled_b),
                 "hidden_s": sum(pr.hidden), "exposed_s": sum(pr.exposed), "w_share_fill_may_run": movable}


#: configurations taken from the queue at a time (their new plans are built together)
BATCH = 4


def _pool(workers: int | None):
    """A process pool for the plans (None: build here). ``workers`` None: one per core, at most 2."""
    import os

    if workers is None:
        workers = min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    if workers <= 1:
        return None
    import multiprocessing
    import signal

    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn").Pool(  # Ctrl-C is the parent's to handle
        workers, initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN))


def _build_ahead(space: _Space, batch: list[Config], pool) -> None:
    """Build the plans the configurations of ``batch`` will need and that are not built yet (each once),
    in ``pool`` when there is one and more than one plan to build."""
    todo: dict = {}
    for c in batch:
        req = _request(space, c, False)
        if req is not None and req[0] not in space.plans and req[0] not in todo:
            todo[req[0]] = (c, req)
    if len(todo) < 2 or pool is None:
        return  # evaluate() builds them one by one
    items = list(todo.values())
    plans = pool.starmap(build_plan, [(c.schedule, req[1]) for c, req in items])
    for (c, (key, _, ctx)), plan in zip(items, plans):
        _store(space, key, plan)
        space.fresh.add(key)


def tune(prob: Problem, *, progress: Callable[[int, int], None] | None = None, exhaustive: bool = False,
         workers: int | None = None) -> TuneResult:
    """Search the space of ``prob``; ``exhaustive`` simulates every configuration (no time-bound pruning);
    ``workers``: processes that build plans (None: one per core, at most 2; the result is the same)."""
    t0 = time.perf_counter()
    space = _Space(prob)
    pruned: dict[str, int] = {}
    cands, searched = enumerate_space(prob, space, pruned)
    live = [c for c in cands if c.fits is None]
    dead = [c for c in cands if c.fits is False]
    if not live:
        raise _fits_nowhere(prob, dead)
    # simulate in increasing order of the bound: first the cheap one of enumerate_space; a configuration
    # whose turn comes gets the memory-aware bound (memory_bound) and goes back in line if that is higher.
    # Stop when the next bound reaches the top-th best step time: nothing left can enter the ranking.
    # The heap is ordered by (bound, key, index): the same order on every run. Configurations are taken
    # BATCH at a time and their new plans built together (in `workers` processes when > 1), then
    # simulated in that order: the result depends on BATCH, not on the number of workers.
    heap = [(c.lower_bound_s, 0, c.key(), i) for i, c in enumerate(live)]
    heapq.heapify(heap)
    done: list[Config] = []
    best_times: list[float] = []
    n = len(live)
    settled = 0

    def cut(lb: float) -> bool:
        return not exhaustive and len(best_times) >= prob.top and lb >= best_times[prob.top - 1]

    pool = _pool(workers)
    try:
        while heap:
            batch: list[Config] = []
            while heap and len(batch) < BATCH and not cut(heap[0][0]):
                lb, tight, _, i = heapq.heappop(heap)
                c = live[i]
                if not tight and not exhaustive:
                    mb = memory_bound(space, c)
                    if mb > lb:
                        c.lower_bound_s = mb
                        heapq.heappush(heap, (mb, 1, c.key(), i))
                        continue
                batch.append(c)
            if not batch:
                break
            _build_ahead(space, batch, pool)
            for c in batch:
                evaluate(space, c)
                if c.fits:
                    best_times.append(c.step_time_s)
                    best_times.sort()
                    del best_times[prob.top:]
                elif c.error:
                    reason = c.error if c.error.startswith("memory") else c.error.split(":")[0] + ": builder refused"
                    pruned[reason] = pruned.get(reason, 0) + 1
                done.append(c)
                settled += 1
                if progress and (settled % 8 == 0):
                    progress(settled, n)
    finally:
        if pool is not None:
            pool.terminate()
    loose = sum(1 for e in heap if not e[1])
    if loose:
        pruned["bound: step-time lower bound above the top results"] = loose
    if len(heap) - loose:
        pruned["bound: memory-aware step-time bound above the top results"] = len(heap) - loose
    if progress:
        progress(n, n)
    ok = sorted((c for c in done if c.fits), key=lambda c: (c.step_time_s, c.peak_bytes, c.key()))
    # plan the leaders again with the builders' own defaults (polish can only shorten them: the bound stays valid)
    for i, c in enumerate(ok[:prob.top]):
        if any(k in registry.get(c.schedule).option_names for k in SWEEP_OPTIONS):
            again = evaluate(space, copy.copy(c), refine=True)
            if again.fits and again.step_time_s < c.step_time_s:
                ok[i] = again
    ok.sort(key=lambda c: (c.step_time_s, c.peak_bytes, c.key()))
    if not ok:
        raise _fits_nowhere(prob, dead + [c for c in done if not c.fits])
    rest = [c for c in done if not c.fits]
    return TuneResult(prob, ok + rest, searched, pruned, space.sim_count, space.hits, time.perf_counter() - t0,
                      explain=_explain(space, ok[0]))


def _fits_nowhere(prob: Problem, dead: list[Config]) -> TuneError:
    GiB = 1024 ** 3
    need = [c.peak_bytes if c.peak_bytes is not None else c.mem_lower_bound for c in dead]
    if not need:
        return TuneError(f"no configuration of {prob.model.name} on {prob.gpus} GPUs could be built; "
                         f"widen --schedules / --max-vpp or change --gpus")
    i = min(range(len(need)), key=need.__getitem__)
    c = dead[i]
    gpus = prob.gpus
    # more GPUs: parameters and optimizer states split over more pipeline stages / tensor ranks
    more = None
    for k in range(1, 8):
        g = prob.gpus * 2 ** k
        if g % prob.gpu.gpus_per_node and g > prob.gpu.gpus_per_node:
            continue
        try:
            sub = Problem(**{**{f: getattr(prob, f) for f in prob.__dataclass_fields__}, "gpus": g, "top": 1})
            sp = _Space(sub)
            cs, _ = enumerate_space(sub, sp, {})
        except TuneError:
            continue
        if any(x.fits is None for x in cs):
            more = g
            break
    return TuneError(f"{prob.model.name} fits in no searched configuration on {gpus} x {prob.gpu.name} "
                     f"({prob.gpu.memory / GiB:.0f} GiB, {prob.reserve / GiB:.0f} GiB reserved): the smallest need is "
                     f"{need[i] / GiB:.1f} GiB per device (tp={c.tp} pp={c.pp} vpp={c.vpp} recompute={c.recompute} "
                     f"zero={c.zero}); it needs GPUs of >= {math.ceil((need[i] + prob.reserve) / GiB)} GiB"
                     # `more` passed the memory lower bound only, not a simulated fit: say no more than that
                     + (f"; with {more} GPUs some configuration passes the memory lower bound (tune --gpus {more} "
                        f"says whether one fits)" if more else ""))


def _pairs(space: _Space, c: Config) -> bool:
    from .moe_costs import pairs

    return pairs(space, c)


def _groups_explain(space: _Space, c: Config) -> list[dict]:
    """The gradient groups the dp reduction uses (:func:`pipeloom.tune.moe_costs.grad_groups`): per group, its
    ranks, link and gradient parameters per chunk."""
    from .moe_costs import grad_groups

    chunks = space.memory(c.tp, c.microbatch_size, c.recompute, c.zero, c.dp, c.seg_layer_num, c.ep, c.cp)[1]
    return [{"ranks": g.ranks, "bandwidth": g.link.bandwidth, "latency_s": g.link.latency,
             "params_per_chunk": [ch.params * x for ch, x in zip(chunks, g.share)]}
            for g in grad_groups(space, c, chunks)]


def _explain(space: _Space, c: Config) -> dict:
    from ..models.moe import group_sizes

    p = space.p
    lt, ht = space.times(c.tp, c.microbatch_size, c.recompute, backward_fused(c.schedule), c.ep, c.cp)
    return {"gpu": space.gpu.to_dict(), "efficiency": space.eff, "calibration": p.calibration.to_dict(),
            "layer": {"F_s": lt.F, "B_s": lt.B, "W_s": lt.W, **lt.parts},
            "head": {"F_s": ht.F, "B_s": ht.B, "W_s": ht.W, **ht.parts},
            "p2p_s": comm_p2p(space, c), "dp_link": c.detail.get("dp_link"),
            "dp_bucket_s_per_chunk": [dp_time(space, c, ch.params) for ch in space.memory(
                c.tp, c.microbatch_size, c.recompute, c.zero, c.dp, c.seg_layer_num, c.ep, c.cp)[1]],
            "dp_bucket_params": dp_bucket_params(space, c),
            "dp_grad_groups": _groups_explain(space, c),
            "communication": _comm_explain(space, c, lt),
            "parallel": {"groups": group_sizes(tp=c.tp, cp=c.cp, ep=c.ep, dp=c.dp, pp=c.pp), "ep": c.ep, "cp": c.cp,
                         "fp8": p.fp8, "capacity_factor": p.capacity_factor,
                         "moe_imbalance": p.moe_imbalance, "route_nodes": p.route_nodes,
                         "pairs_hide_a2a": _pairs(space, c),
                         "fb_pairs": len(c.schedule_obj.overlapped) if c.schedule_obj is not None else None},
            "optimizer_s": c.optimizer_s, "makespan_s": c.makespan_s, "exposed_comm_s": c.exposed_comm_s,
            "step_time_s": c.step_time_s, "unit_bytes": c.detail.get("unit_bytes"),
            "peak_units": c.detail.get("peak_units"), "device_peak_bytes": c.device_peaks,
            "model_flops_per_step": step_model_flops(p.model, p.global_batch, p.seq),
            "reserve_bytes": p.reserve, "plan_bound": _plan_bound(space, c)}


def _plan_bound(space: _Space, c: Config) -> dict | None:
    """The best configuration's plan against its proven lower bound (:func:`..schedule.search.bounds.plan_bound`,
    at the limit it was planned under): ``lower_bound_s`` in seconds of pipeline time, ``gap`` = its makespan /
    bound - 1; None where no bound applies or the plan was not built."""
    from ..schedule.search.bounds import plan_bound

    for refine in (True, False):  # the final plan when the leaders were planned again, else the sweep's
        req = _request(space, c, refine)
        plan = space.plans.get(req[0]) if req is not None else None
        if plan is not None and plan[0] is not None:
            spec, unit = req[1], req[2][4]
            r = simulate(plan[0], spec.costs, spec.mem)
            b = plan_bound(plan[0], spec, r.makespan, max(r.peak_memory), spec.mem_limit)
            if b["lower_bound"] is None:
                return None
            gap = b["gap"] if b["gap"] is None or abs(b["gap"]) > 1e-12 else 0.0
            return {"makespan_s": r.makespan * unit, "lower_bound_s": b["lower_bound"] * unit, "gap": gap,
                    "bound_limit_units": b["bound_limit"], "final_plan": refine}
    return None


def _comm_explain(space: _Space, c: Config, lt) -> dict:
    """Every communication term of ``c``, exposed and hidden, per job kind (``--explain``): the TP terms of one
    layer and of the fullest chunk's pass (:mod:`pipeloom.tune.comm_terms`), the pipeline's P2P, the DP reduction."""
    terms = lt.parts.get("tp_terms_s", {})
    layers = max(c.seg_layer_num) if c.seg_layer_num else 0
    kinds = {}
    for kind in ("F", "B", "W"):
        t = terms.get(kind, {})
        tot = sum(v["total"] for v in t.values())
        exp = sum(v["exposed"] for v in t.values())
        label = {"F": "F", "B": "B (of a fused BW)" if lt.parts.get("backward") == "fused BW" else "B",
                 "W": "W"}[kind]
        kinds[label] = {**{n: dict(v) for n, v in t.items()},
                        "chunk_pass_exposed_s": exp * layers, "chunk_pass_hidden_s": (tot - exp) * layers}
    busy = c.detail.get("dp_busy_s", 0.0)
    exposed = c.exposed_comm_s or 0.0
    return {"tp_overlap": lt.parts.get("tp_overlap"), "backward": lt.parts.get("backward"),
            "tp_fill": c.detail.get("tp_fill"),  # fill: split Bs per device, those with pending W work, seconds
            "tp_per_layer_and_chunk_pass": kinds, "layers_in_fullest_chunk": layers,
            "pipeline_p2p_per_boundary_s": comm_p2p(space, c),
            "dp": {"link": c.detail.get("dp_link"), "zero": c.zero, "bucket_params": dp_bucket_params(space, c),
                   "collectives_on_busiest_device": c.detail.get("dp_collectives", 0),
                   "busiest_link_s": busy, "exposed_s": exposed, "hidden_s": max(0.0, busy - exposed)}}


__all__ = ["Config", "PARTITIONS", "Problem", "RECOMPUTES", "SWEEP_OPTIONS", "TuneError", "TuneResult", "builder_vpps",
           "enumerate_space", "evaluate", "lower_bound", "memory_lower_bound", "tune"]

