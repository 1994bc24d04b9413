"""Search tp, pp, vpp, dp, micro-batch size, schedule, memory limit, recompute, ZeRO-1 and the layer
partition for the fastest configuration that fits (no torch).

Order of work (the space of a 70B model on 1,024 GPUs holds tens of thousands of configurations):

1. enumerate every configuration; drop those that cannot exist (tp not dividing the heads, a global
   batch not divisible by dp x micro-batch, more chunks than layers, a builder's vpp rule) and those
   whose *memory lower bound* is over the GPU: parameters, gradients and optimizer states of the
   device plus one microbatch's activations of each of its chunks (every schedule holds that much
   when microbatch 0 turns around at the last chunk) plus the transient working set;
2. a *time lower bound* for each: the busiest device's compute ``m * sum(F+B+W)`` plus the forward
   chain before its first job, plus the optimizer step (every schedule pays these);
3. simulate in increasing order of that bound and stop once the bound passes the ``top``-th best
   step time found: nothing left can enter the ranking, so pruning never drops the best.

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
from ..core.ir import Kind, Placement, chunks_of
from ..memory.analytic import (MemoryConfigError, TrainConfig, _available_units, _device_params, activation_trace,
                               chunk_memory, check_tp, mem_model_for, static_bytes, transient_bytes)
from ..models.config import ModelConfig
from ..partition.balance import bottleneck_dp
from ..partition.layer_costs import LayerCost, LayerCosts
from ..partition.layout import uniform
from ..partition.megatron import counts_to_layout
from ..schedule import registry
from ..schedule.registry import PlanSpec
from ..sim.simulate import memory_profile, simulate
from .costs import (ACT_BYTES, GRAD_BYTES, PARAM_BYTES, Calibration, all_gather, all_reduce, head_times,
                    layer_times, p2p, reduce_scatter, step_model_flops)
from .bounds import step_bound
from .gpus import GPU, divisors

RECOMPUTES = ("none", "selective", "full")
PARTITIONS = ("uniform", "balanced")
#: builder options during the sweep (a twentieth of the greedy budget, no CP-SAT polish, no proven lower bound
#: in the plan's meta, no cool-down variants of zbvpp); the top configurations are planned again with the
#: builders' defaults before the final ranking
SWEEP_OPTIONS = {"budget": 3000, "polish": 0, "bound": False, "pull_budget": 0}
#: builders left out unless named: CP-SAT per configuration is far too slow for a sweep
SLOW = ("optimal",)


class TuneError(ValueError):
    """Bad tuner input, or a model that fits nowhere (one line, with what would work)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    model: ModelConfig
    gpus: int
    gpu: GPU
    global_batch: int
    seq: int
    calibration: Calibration = field(default_factory=Calibration)
    max_tp: int | None = None
    max_pp: int | None = None
    tp: int | None = None
    """fix the tensor-parallel degree (None: search it)"""
    pp: int | None = None
    """fix the pipeline degree (None: search it)"""
    microbatch_sizes: tuple[int, ...] | None = None
    """the micro-batch sizes to try (None: every divisor up to max_microbatch_size)"""
    max_vpp: int = 4
    max_microbatch_size: int = 8
    schedules: tuple[str, ...] | None = None
    recompute: tuple[str, ...] = RECOMPUTES
    zero: tuple[int, ...] = (0, 1)
    partitions: tuple[str, ...] = PARTITIONS
    mem_limits: tuple[str, ...] = ("default", "fit")
    reserve: int = 2 * 1024 ** 3
    top: int = 5

    def __post_init__(self) -> None:
        for k in ("gpus", "global_batch", "seq", "max_vpp", "max_microbatch_size", "top"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise TuneError(f"{k} must be an integer >= 1, got {v!r}")
        if self.gpus % self.gpu.gpus_per_node and self.gpus > self.gpu.gpus_per_node:
            raise TuneError(f"{self.gpus} GPUs are not whole nodes of {self.gpu.gpus_per_node}; give a multiple of "
                            f"--gpus-per-node (or fewer GPUs than one node)")
        bad = [r for r in self.recompute if r not in RECOMPUTES]
        if bad or not self.recompute:
            raise TuneError(f"recompute must be among {', '.join(RECOMPUTES)}, got {', '.join(bad) or 'none'}")
        if not self.zero or any(z not in (0, 1) for z in self.zero):
            raise TuneError(f"zero must be among 0, 1, got {self.zero!r}")
        if not self.partitions or any(p not in PARTITIONS for p in self.partitions):
            raise TuneError(f"partitions must be among {', '.join(PARTITIONS)}, got {self.partitions!r}")
        if not self.mem_limits or any(x not in ("default", "fit") for x in self.mem_limits):
            raise TuneError(f"memory limits must be among default, fit, got {self.mem_limits!r}")

    @property
    def gpn(self) -> int:
        return min(self.gpu.gpus_per_node, self.gpus)


@dataclass(slots=True)
class Config:
    """One point of the space and, once evaluated, its predicted performance."""

    tp: int
    pp: int
    dp: int
    vpp: int
    microbatch_size: int
    microbatches: int
    schedule: str
    recompute: str
    zero: int
    partition: str
    mem_limit_mode: str
    seg_layer_num: tuple[int, ...] = ()
    placement: Placement = Placement.INTERLEAVED
    lower_bound_s: float = 0.0
    mem_lower_bound: float = 0.0
    # filled by evaluate()
    mem_limit: float | None = None
    step_time_s: float | None = None
    makespan_s: float | None = None
    bubble: float | None = None
    exposed_comm_s: float | None = None
    optimizer_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_bytes: float | None = None
    device_peaks: list = field(default_factory=list)
    fits: bool | None = None
    error: str | None = None
    detail: dict = field(default_factory=dict)
    schedule_obj: object = None
    sim: object = None

    def key(self) -> tuple:
        return (self.tp, self.pp, self.dp, self.vpp, self.microbatch_size, self.microbatches, self.schedule,
                self.recompute, self.zero, self.seg_layer_num, self.mem_limit_mode)

    def to_dict(self) -> dict:
        return {"tp": self.tp, "pp": self.pp, "vpp": self.vpp, "dp": self.dp,
                "microbatch_size": self.microbatch_size, "microbatches": self.microbatches,
                "schedule": self.schedule, "mem_limit": self.mem_limit, "mem_limit_mode": self.mem_limit_mode,
                "recompute": self.recompute, "zero": self.zero, "partition": self.partition,
                "seg_layer_num": list(self.seg_layer_num),
                "megatron_layout": counts_to_layout(self.seg_layer_num)
                if self.placement is Placement.INTERLEAVED or self.vpp == 1 else None,
                "tokens_per_s": self.tokens_per_s, "mfu": self.mfu, "step_time_s": self.step_time_s,
                "makespan_s": self.makespan_s, "bubble": self.bubble, "exposed_comm_s": self.exposed_comm_s,
                "optimizer_s": self.optimizer_s, "peak_bytes": self.peak_bytes, "fits": self.fits,
                "lower_bound_s": self.lower_bound_s}


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
    limit_violations: list = field(default_factory=list)
    """plans of :data:`BOUNDED` builders that went over the limit :func:`memory_bound` assumed (none expected:
    any would make that bound unsafe and is reported in ``warnings``)"""

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
        if self.limit_violations:
            out["warnings"] = list(self.limit_violations)
        return out


def _divisors(n: int) -> list[int]:
    return divisors(n)  # tune/gpus.py: up to sqrt(n), not n


def builder_vpps(name: str, pp: int, layers: int, max_vpp: int) -> list[int]:
    rule = registry.get(name).vpp
    cands = {"1": [1], "2": [2], ">=2": list(range(2, max_vpp + 1)), "any": list(range(2, max_vpp + 1))}[rule]
    return [v for v in cands if pp * v <= layers]


class _Space:
    """Caches shared by the enumeration and the evaluation of one problem."""

    def __init__(self, prob: Problem) -> None:
        self.p = prob
        self.eff = prob.calibration.efficiency
        self.gpu = prob.calibration.apply(prob.gpu)
        self.layer_t: dict = {}
        self.head_t: dict = {}
        self.chunk_mem: dict = {}
        self.parts: dict = {}
        self.plans: dict = {}
        self.statics: dict = {}
        self.owned: dict = {}
        self.sim_count = 0
        self.hits = 0
        self.limit_violations: list[str] = []
        self.summaries: dict = {}
        self.fresh: set = set()
        self.shapes: dict = {}

    # -------------------------------------------------------------- costs
    def times(self, tp: int, b: int, r: str):
        k = (tp, b, r)
        if k not in self.layer_t:
            p = self.p
            self.layer_t[k] = (layer_times(p.model, self.gpu, self.eff, tp=tp, micro_batch=b, seq=p.seq, recompute=r),
                               head_times(p.model, self.gpu, self.eff, tp=tp, micro_batch=b, seq=p.seq))
        return self.layer_t[k]

    def split(self, pp: int, vpp: int, placement: Placement, how: str, tp: int, b: int, r: str) -> tuple[int, ...]:
        L = self.p.model.layers
        if how == "uniform":
            k = (pp, vpp, placement)
            if k not in self.parts:
                self.parts[k] = tuple(uniform(L, pp, vpp, placement).seg_layer_num)
            return self.parts[k]
        lt, ht = self.times(tp, b, r)
        ratio = float(f"{(ht.F + ht.B + ht.W) / (lt.F + lt.B + lt.W):.2g}")
        k = (pp, vpp, placement, ratio)
        if k not in self.parts:
            layer = LayerCost(F=1.0, B=0.0, W=0.0, mem=1.0)
            lc = LayerCosts(tuple([layer] * L), LayerCost(), LayerCost(F=ratio, mem=0.0))
            self.parts[k] = tuple(bottleneck_dp(lc, pp, vpp, placement).seg_layer_num)
        return self.parts[k]

    def memory(self, tp: int, b: int, r: str, zero: int, dp: int, seg: tuple[int, ...]):
        k = (tp, b, r, zero, dp, seg)
        if k not in self.chunk_mem:
            train = TrainConfig(seq=self.p.seq, micro_batch=b, tp=tp, sequence_parallel=tp > 1, recompute=r,
                                dp=dp, zero=zero)
            chunks = chunk_memory(self.p.model, train, list(seg))
            self.chunk_mem[k] = (train, chunks)
        return self.chunk_mem[k]


def _static(space: _Space, train, chunks, pp: int, vpp: int, placement: Placement):
    """Per device: (chunk list, static bytes, transient bytes, params)."""
    k = (train, id(chunks), pp, vpp, placement)
    hit = space.statics.get(k)
    if hit is None:
        hit = space.statics[k] = _static_new(space, train, chunks, pp, vpp, placement)
    return hit


def _static_new(space: _Space, train, chunks, pp: int, vpp: int, placement: Placement):
    out = []
    owned, _ = _owned(space, pp, vpp, placement)
    for d in range(pp):
        mine = [chunks[c] for c in owned[d]]
        params = _device_params(space.p.model, train, mine)
        st = sum(static_bytes(params, train))
        tr = transient_bytes(space.p.model, train, mine, split=True)
        out.append((mine, st, tr, params))
    return out


def chunk_costs(space: _Space, c: Config) -> tuple[list[float], list[float], list[float], float]:
    lt, ht = space.times(c.tp, c.microbatch_size, c.recompute)
    nc = c.pp * c.vpp
    F = [n * lt.F for n in c.seg_layer_num]
    B = [n * lt.B for n in c.seg_layer_num]
    W = [n * lt.W for n in c.seg_layer_num]
    F[nc - 1] += ht.F
    B[nc - 1] += ht.B
    W[nc - 1] += ht.W
    return F, B, W, comm_p2p(space, c)


def comm_p2p(space: _Space, c: Config) -> float:
    if c.pp == 1:
        return 0.0
    p = space.p
    link = space.gpu.intra if c.tp * c.dp * c.pp <= p.gpn else space.gpu.inter
    nbytes = c.microbatch_size * p.seq * p.model.hidden * ACT_BYTES / c.tp
    return p2p(nbytes, link)


def dp_link(space: _Space, c: Config):
    return space.gpu.intra if c.tp * c.dp <= space.p.gpn else space.gpu.inter


def dp_time(space: _Space, c: Config, params: float) -> float:
    """Seconds to reduce ``params`` parameters' gradients over dp (and re-gather them with ZeRO-1)."""
    link = dp_link(space, c)
    if c.zero:
        return reduce_scatter(params * GRAD_BYTES, c.dp, link) + all_gather(params * PARAM_BYTES, c.dp, link)
    return all_reduce(params * GRAD_BYTES, c.dp, link)


def optimizer_time(space: _Space, c: Config, params: float) -> float:
    z = c.dp if c.zero else 1
    return params * (28.0 / z + 2.0) / space.gpu.hbm_bandwidth


def _owned(space: _Space, pp: int, vpp: int, placement: Placement):
    """(chunks of each device, whether the edge into chunk k crosses devices)."""
    k = (pp, vpp, placement)
    hit = space.owned.get(k)
    if hit is None:
        from ..core.ir import device_of

        nc = pp * vpp
        devs = [device_of(c, pp, placement) for c in range(nc)]
        hit = space.owned[k] = ([chunks_of(d, pp, vpp, placement) for d in range(pp)],
                                [k > 0 and devs[k] != devs[k - 1] for k in range(nc)])
    return hit


def _summary(space: _Space, c: Config):
    """(statics of ``c``, the largest parameter count of a device, the memory lower bound in bytes), cached
    with the statics."""
    train, chunks = space.memory(c.tp, c.microbatch_size, c.recompute, c.zero, c.dp, c.seg_layer_num)
    statics = _static(space, train, chunks, c.pp, c.vpp, c.placement)
    hit = space.summaries.get(id(statics))
    if hit is None:
        need = max(st + tr + sum(ch.activation_bytes for ch in mine) for mine, st, tr, _ in statics)
        hit = space.summaries[id(statics)] = (statics, max(s[3] for s in statics), need)
    return hit


def memory_lower_bound(space: _Space, c: Config) -> float:
    """Bytes every schedule of ``c`` needs on its fullest device: parameters, gradients, optimizer states,
    the transient working set, and microbatch 0's activations on each of the device's chunks (all held
    when that microbatch's backward starts at the last chunk)."""
    return _summary(space, c)[2]


def _shape(space: _Space, c: Config):
    """Per (costs, partition, placement): prefix sums of F and of the device crossings, each device's
    first chunk and work per microbatch sum(F+B+W), sum(B), F of chunk 0 (what :func:`lower_bound` reads)."""
    k = (c.tp, c.microbatch_size, c.recompute, c.seg_layer_num, c.pp, c.vpp, c.placement)
    hit = space.shapes.get(k)
    if hit is None:
        F, B, W, _ = chunk_costs(space, c)
        owned, cross = _owned(space, c.pp, c.vpp, c.placement)
        fp, cc = [0.0], [0]
        for x, y in zip(F, cross):
            fp.append(fp[-1] + x)
            cc.append(cc[-1] + (1 if y else 0))
        dev = [(mine[0], sum(F[j] + B[j] + W[j] for j in mine)) for mine in owned]
        hit = space.shapes[k] = (fp, cc, dev, sum(B), F[0])
    return hit


def lower_bound(space: _Space, c: Config) -> float:
    """Seconds no schedule of ``c`` can beat (module docstring): the larger of
    * per device: the forward chain before its first chunk can start, plus its busy time;
    * the last microbatch: chunk 0 runs m-1 other forwards first, then that microbatch's forward and
      backward traverse every chunk (with the cross-device latencies);
    plus the optimizer step."""
    fp, cc, dev, sum_b, f0 = _shape(space, c)
    comm = comm_p2p(space, c)
    m = c.microbatches
    best = (m - 1) * f0 + fp[-1] + sum_b + 2 * comm * cc[-1]
    for first, work in dev:
        best = max(best, fp[first] + comm * cc[first] + m * work)
    return best + optimizer_time(space, c, _summary(space, c)[1])


#: builders whose plans are expensive enough to be worth a memory-aware bound before building them
BOUNDED = ("zbvpp", "zbv", "vhalf", "vmin")


def builder_limit(space: _Space, c: Config, a_r: tuple[float, ...]) -> float | None:
    """The memory limit (units of the rounded model the plan is built with) that the builder of ``c``
    plans under, or an upper bound of it; None when it plans without one. The registry's contract: a
    given limit is honoured (V-Half / V-Min may go below it); without one, ``default_limit(pp)`` raised
    at most to the smallest feasible limit ``max_d sum_{c on d} a``."""
    info = registry.get(c.schedule)
    if not info.memory_aware:
        return None
    if c.mem_limit_mode == "fit":
        units = _fit_units(space, c)
        return None if units is None else math.floor(units * 100) / 100
    if info.default_limit is None:
        return None
    owned, _ = _owned(space, c.pp, c.vpp, c.placement)
    floor = max(sum(a_r[k] for k in mine) for mine in owned)
    return max(float(info.default_limit(c.pp)), floor)


def _fit_units(space: _Space, c: Config) -> float | None:
    train, chunks = space.memory(c.tp, c.microbatch_size, c.recompute, c.zero, c.dp, c.seg_layer_num)
    U, _, _ = mem_model_for(chunks, c.pp)
    p = space.p
    return _available_units(p.model, train, chunks, c.pp, c.vpp, c.placement, p.gpu.memory, p.reserve, U)


def _rounded_mem(a, bfree) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The memory model plans are built with: ``a`` to 3 decimals, ``b`` to 3 decimals within [0, a]."""
    a_r = tuple(round(x, 3) for x in a)
    b_r = tuple(min(max(round(y, 3), 0.0), x) for x, y in zip(a_r, bfree))
    return a_r, b_r


def memory_bound(space: _Space, c: Config) -> float:
    """A step-time lower bound of ``c`` (:func:`pipeloom.tune.bounds.step_bound`) with its memory terms:
    the larger of the bound under each device's room on the GPU (in the exact memory model: holds for every
    schedule of ``c`` that fits) and, for the builders of :data:`BOUNDED`, the bound under the limit the
    builder plans with (in the rounded model it plans with: holds for its plan)."""
    F, B, W, comm = chunk_costs(space, c)
    owned, cross = _owned(space, c.pp, c.vpp, c.placement)
    owned = [sorted(o) for o in owned]
    train, chunks = space.memory(c.tp, c.microbatch_size, c.recompute, c.zero, c.dp, c.seg_layer_num)
    statics = _static(space, train, chunks, c.pp, c.vpp, c.placement)
    U, a, bfree = mem_model_for(chunks, c.pp)
    avail = space.p.gpu.memory - space.p.reserve
    room = [(avail - st - tr) / U for _, st, tr, _ in statics]
    buckets = [dp_time(space, c, ch.params) for ch in chunks]
    opt = max(optimizer_time(space, c, s[3]) for s in statics)
    m = c.microbatches
    best = step_bound(F, B, W, comm, cross, owned, m, a, bfree, room, buckets, opt)
    if c.schedule in BOUNDED:
        a_r, b_r = _rounded_mem(a, bfree)
        lim = builder_limit(space, c, a_r)
        if lim is not None:
            best = max(best, step_bound(F, B, W, comm, cross, owned, m, a_r, b_r, [lim] * c.pp, buckets, opt))
    return best


# ------------------------------------------------------------------------------------------ enumeration
def enumerate_space(prob: Problem, space: _Space, pruned: dict[str, int]) -> tuple[list[Config], int]:
    """Every configuration that can exist, with its bounds; the rest counted in ``pruned``."""
    model = prob.model
    names = list(prob.schedules) if prob.schedules else [n for n in registry.names() if n not in SLOW]
    for n in names:
        registry.get(n)
    if not prob.schedules:
        for n in SLOW:
            pruned[f"schedule {n}: left out (a CP-SAT solve per configuration; name it in --schedules)"] = 1
    gpn = prob.gpn
    avail_bytes = prob.gpu.memory - prob.reserve
    out: list[Config] = []
    searched = 0

    def drop(reason: str, n: int = 1) -> None:
        pruned[reason] = pruned.get(reason, 0) + n

    tps = [t for t in _divisors(gpn) if (prob.max_tp is None or t <= prob.max_tp) and prob.tp in (None, t)]
    if not tps:
        raise TuneError(f"no tensor-parallel degree to try: tp must divide the {gpn} GPUs of a node"
                        + (f" and be <= --max-tp {prob.max_tp}" if prob.max_tp else "")
                        + (f"; --tp {prob.tp} does not" if prob.tp else ""))
    bad_dp = []
    for tp in tps:
        try:
            check_tp(model, TrainConfig(tp=tp, seq=prob.seq))
        except MemoryConfigError:
            drop(f"tp: does not divide heads/kv_heads/ffn/hidden of {model.name}")
            continue
        if prob.gpus % tp:
            drop("tp: does not divide the GPU count")
            continue
        for pp in _divisors(prob.gpus // tp):
            if prob.pp is not None and pp != prob.pp:
                continue
            if prob.max_pp is not None and pp > prob.max_pp:
                drop("pp: above --max-pp")
                continue
            if pp > model.layers:
                drop("pp: more stages than layers")
                continue
            dp = prob.gpus // (tp * pp)
            if prob.global_batch % dp:
                drop("dp: global batch not divisible by dp")
                bad_dp.append(dp)
                continue
            per = prob.global_batch // dp
            for b in _divisors(per):
                if b > prob.max_microbatch_size or (prob.microbatch_sizes and b not in prob.microbatch_sizes):
                    continue
                m = per // b
                for r in prob.recompute:
                    for z in prob.zero:
                        if z and dp == 1:
                            continue  # ZeRO-1 over one replica is the plain optimizer
                        for name in names:
                            info = registry.get(name)
                            vpps = builder_vpps(name, pp, model.layers, prob.max_vpp)
                            if not vpps:
                                drop(f"schedule {name}: needs more chunks than layers or a vpp above --max-vpp")
                                continue
                            for vpp in vpps:
                                placement = info.placement_at(vpp)
                                seen = set()
                                for how in prob.partitions:
                                    try:
                                        seg = space.split(pp, vpp, placement, how, tp, b, r)
                                    except ValueError:
                                        drop("partition: cannot split the layers")
                                        continue
                                    if seg in seen:
                                        drop("partition: balanced equals uniform")
                                        continue
                                    seen.add(seg)
                                    limits = prob.mem_limits if info.memory_aware else ("default",)
                                    for lim in limits:
                                        searched += 1
                                        c = Config(tp=tp, pp=pp, dp=dp, vpp=vpp, microbatch_size=b, microbatches=m,
                                                   schedule=name, recompute=r, zero=z, partition=how,
                                                   mem_limit_mode=lim, seg_layer_num=seg, placement=placement)
                                        c.mem_lower_bound = memory_lower_bound(space, c)
                                        if c.mem_lower_bound > avail_bytes:
                                            drop("memory: weights + optimizer + one microbatch over the GPU")
                                            out.append(c)  # kept aside for the 'fits nowhere' message
                                            c.fits = False
                                            continue
                                        c.lower_bound_s = lower_bound(space, c)
                                        out.append(c)
    if searched == 0 and bad_dp:
        ok = sorted(set(bad_dp))
        raise TuneError(f"--global-batch {prob.global_batch} is not divisible by any data-parallel degree of "
                        f"{prob.gpus} GPUs (dp = GPUs / (tp*pp) in {', '.join(map(str, ok))}); global batches "
                        f"that work are multiples of one of them, e.g. {_nearest(prob.global_batch, ok)}")
    return out, searched


def _nearest(gb: int, dps: list[int]) -> str:
    cands = sorted({(gb // d + k) * d for d in dps for k in (0, 1) if (gb // d + k) * d > 0})
    cands.sort(key=lambda x: abs(x - gb))
    return " or ".join(map(str, sorted(cands[:2])))


# ------------------------------------------------------------------------------------------ evaluation
#: significant digits of the cost ratios a shared plan is keyed (and planned) on
PLAN_DIGITS = 3


def _q(x: float) -> float:
    return float(f"{x:.{PLAN_DIGITS}g}")


def _request(space: _Space, c: Config, refine: bool):
    """What :func:`evaluate` needs before simulating ``c``: the plan key and spec with the costs and memory
    model around them; None when ``c`` cannot be planned (its error is set)."""
    p = space.p
    F, B, W, comm = chunk_costs(space, c)
    unit = max(F) or 1.0
    train, chunks = space.memory(c.tp, c.microbatch_size, c.recompute, c.zero, c.dp, c.seg_layer_num)
    U, a, bfree = mem_model_for(chunks, c.pp)
    a_r, b_r = _rounded_mem(a, bfree)
    info = registry.get(c.schedule)
    limit = None
    if c.mem_limit_mode == "fit":
        units = _available_units(p.model, train, chunks, c.pp, c.vpp, c.placement, p.gpu.memory, p.reserve, U)
        if units < max(a_r):
            c.fits, c.error = False, "memory: no room for one chunk's activations"
            return None
        limit = math.floor(units * 100) / 100
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
    return key, spec, (F, B, W, comm, unit, train, chunks, U, a, bfree, a_r, b_r, limit)


def build_plan(name: str, spec: PlanSpec) -> tuple:
    """(schedule, None) or (None, the builder's one-line error): one plan of the sweep (also run in the
    worker processes of :func:`tune`)."""
    try:
        sched = registry.build(name, spec)
    except (ScheduleError, ValueError) as e:
        return None, str(e).splitlines()[0]
    # the builder's witness (a validation shortcut, memoryviews) is not needed to simulate, nor picklable
    return (dataclasses.replace(sched, witness=None) if sched.witness is not None else sched), None


def _store(space: _Space, c: Config, key, plan, a_r, b_r) -> None:
    space.plans[key] = plan
    space.sim_count += 1
    if plan[0] is not None and c.schedule in BOUNDED:
        # memory_bound trusts the builder to stay within builder_limit: check it on every plan
        lim = builder_limit(space, c, a_r)
        top = max(memory_profile(plan[0], MemModel(a=a_r, b=b_r))[0])
        if lim is not None and top > lim + 1e-6:
            space.limit_violations.append(f"{c.schedule} pp={c.pp} vpp={c.vpp} m={c.microbatches}: plan peaks "
                                          f"at {top:.4g} units over the limit {lim:.4g}")


def evaluate(space: _Space, c: Config, *, refine: bool = False) -> Config:
    """Simulate ``c``: step time, MFU, peak memory per device (fills the fields, returns ``c``).

    The schedule is built with :data:`SWEEP_OPTIONS` (where the builder reads them), or with the
    builder's defaults when ``refine``."""
    p = space.p
    req = _request(space, c, refine)
    if req is None:
        return c
    key, spec, (F, B, W, comm, unit, train, chunks, U, a, bfree, a_r, b_r, limit) = req
    plan = space.plans.get(key)
    if plan is None:
        _store(space, c, key, build_plan(c.schedule, spec), a_r, b_r)
        plan = space.plans[key]
    elif key in space.fresh:  # built ahead for this configuration by the batch of tune()
        space.fresh.discard(key)
    else:
        space.hits += 1
    if plan[0] is None:
        hit = (None, None, plan[1])
    else:
        exact = Costs(F=tuple(x / unit for x in F), B=tuple(x / unit for x in B), W=tuple(x / unit for x in W),
                      comm=comm / unit)
        hit = (plan[0], simulate(plan[0], exact), None)
    sched, sim, err = hit
    if err:
        c.fits, c.error = False, f"schedule {c.schedule}: {err}"
        return c
    c.schedule_obj, c.sim = sched, sim
    c.mem_limit = limit
    scale = unit
    makespan = sim.makespan * scale
    peaks, _ = activation_trace(sched, a, bfree)
    statics = _static(space, train, chunks, c.pp, c.vpp, c.placement)
    # dp reduction: one bucket per chunk, started when the chunk's last weight gradient is done
    finish = []
    for d in range(c.pp):
        ready: dict[int, float] = {}
        for (kind, mb, ch), e in zip(sched.devices[d], sim.end[d]):
            if kind is Kind.W or kind is Kind.BW:
                ready[ch] = max(ready.get(ch, 0.0), e * scale)
        t = 0.0
        for ch in sorted(ready, key=ready.get):
            t = max(t, ready[ch]) + dp_time(space, c, chunks[ch].params)
        dev_end = (sim.end[d][-1] * scale) if sim.end[d] else 0.0
        finish.append(max(dev_end, t))
    pipe = max(finish) if finish else makespan
    opt = max(optimizer_time(space, c, s[3]) for s in statics)
    c.makespan_s = makespan
    c.exposed_comm_s = max(0.0, pipe - makespan)
    c.optimizer_s = opt
    c.step_time_s = pipe + opt
    c.bubble = sim.bubble
    c.tokens_per_s = p.global_batch * p.seq / c.step_time_s
    c.mfu = step_model_flops(p.model, p.global_batch, p.seq) / (p.gpus * p.gpu.peak_flops * c.step_time_s)
    dev = [st + tr + pk * U for (mine, st, tr, _), pk in zip(statics, peaks)]
    c.device_peaks = dev
    c.peak_bytes = max(dev)
    c.fits = c.peak_bytes + p.reserve <= p.gpu.memory
    if not c.fits:
        c.error = "memory: simulated peak over the GPU"
    c.detail = {"unit_bytes": U, "peak_units": peaks, "comm_p2p_s": comm, "chunk_F_s": F, "chunk_B_s": B,
                "chunk_W_s": W, "dp_link": "intra" if dp_link(space, c) is space.gpu.intra else "inter"}
    return c


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
        _store(space, c, key, plan, ctx[10], ctx[11])
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
                      explain=_explain(space, ok[0]), limit_violations=space.limit_violations)


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
                     + (f" or >= {more} GPUs" if more else ""))


def _explain(space: _Space, c: Config) -> dict:
    p = space.p
    lt, ht = space.times(c.tp, c.microbatch_size, c.recompute)
    return {"gpu": space.gpu.to_dict(), "efficiency": space.eff, "calibration": p.calibration.to_dict(),
            "layer": {"F_s": lt.F, "B_s": lt.B, "W_s": lt.W, **lt.parts},
            "head": {"F_s": ht.F, "B_s": ht.B, "W_s": ht.W, **ht.parts},
            "p2p_s": comm_p2p(space, c), "dp_link": c.detail.get("dp_link"),
            "dp_bucket_s_per_chunk": [dp_time(space, c, ch.params) for ch in space.memory(
                c.tp, c.microbatch_size, c.recompute, c.zero, c.dp, c.seg_layer_num)[1]],
            "optimizer_s": c.optimizer_s, "makespan_s": c.makespan_s, "exposed_comm_s": c.exposed_comm_s,
            "step_time_s": c.step_time_s, "unit_bytes": c.detail.get("unit_bytes"),
            "peak_units": c.detail.get("peak_units"), "device_peak_bytes": c.device_peaks,
            "model_flops_per_step": step_model_flops(p.model, p.global_batch, p.seq),
            "reserve_bytes": p.reserve}


__all__ = ["Config", "PARTITIONS", "Problem", "RECOMPUTES", "SWEEP_OPTIONS", "TuneError", "TuneResult", "builder_vpps",
           "enumerate_space", "evaluate", "lower_bound", "memory_lower_bound", "tune"]
