"""The tuner's search space (no torch): the problem, one configuration, the caches they share, and the
enumeration of every configuration that can exist.

:class:`_Space` holds what configurations share: layer times, layer partitions, the memory accounting of
the chunks and, per layout, the one :func:`pipeloom.memory.budget.device_budget` call that says what each
device holds (statics, transient, unit bytes, the memory model in units).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..core.costs import MemLimit
from ..core.ir import Placement, chunks_of, device_of
from ..memory.budget import DeviceBudget, device_budget
from ..memory.layers import MemoryConfigError, TrainConfig, check_tp, chunk_memory
from ..memory.sharding import ZERO_LEVELS, zero_help
from ..models.config import ModelConfig
from ..partition.balance import bottleneck_dp
from ..partition.layer_costs import LayerCost, LayerCosts
from ..partition.layout import ends_as_layers, uniform
from ..partition.megatron import counts_to_layout
from ..schedule import registry
from .bounds import lower_bound, memory_lower_bound
from .comm_terms import TPOverlap
from .costs import Calibration, head_times, layer_times
from .gpus import GPU, divisors

RECOMPUTES = ("none", "selective", "full")
#: ZeRO levels searched unless asked: 0, 1 and 2 (timed: ZeRO-2's reduce-scatters after every backward,
#: pipeloom.sim.dp); ZeRO-3 on request (--zero 0,1,2,3): it never led the measured searches (docs/tune.md,
#: "Defaults"), costs their time again and ties ZeRO-1 at pp 1 with plans no one runs
DEFAULT_ZERO = (0, 1, 2)
#: layer partitions: 'uniform' (even, extras on the first chunks), 'balanced' (by cost, the head's time counted),
#: 'ends' (the embedding and the loss each take one layer's place: Llama 3's trim, first chunk possibly only the
#: embedding and last only the loss; searched by default: Llama 3 70B on 256 H100s leads 4% faster with it)
PARTITIONS = ("uniform", "balanced", "ends")
DEFAULT_PARTITIONS = ("uniform", "balanced", "ends")
#: builder options during the sweep: no CP-SAT polish, no proven bound in the meta, no zbvpp cool-down variants,
#: but the builders' own budget: a fixed 3000 made deep V plans 20-73% slower than their final plans (V shapes
#: ranked by plans never run); now within 1% (tests/tune/test_tune_sweep_vs_final.py). Leaders are re-planned.
SWEEP_OPTIONS = {"polish": 0, "bound": False, "pull_budget": 0}
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
    zero: tuple[int, ...] = DEFAULT_ZERO
    """ZeRO levels to try (:data:`pipeloom.memory.sharding.ZERO_LEVELS`: 1 shards the optimizer states over dp,
    2 also the gradients, 3 also the parameters)"""
    partitions: tuple[str, ...] = DEFAULT_PARTITIONS
    mem_limits: tuple[str, ...] = ("default", "fit")
    """how memory-aware builders get their limit: 'default' (their declared default), 'fit' (the GPU's room)"""
    mem_limit: MemLimit | None = None
    """``--mem-limit``: plan every memory-aware builder under this limit instead (mode 'given': units, Xp for
    each configuration's pp, or bytes per device through the configuration's device budget); None: search
    ``mem_limits``"""
    reserve: int = 2 * 1024 ** 3
    top: int = 5
    vpp: int | None = None
    """fix the number of chunks per device (None: search it up to max_vpp)"""
    dp: int | None = None
    """fix the data-parallel degree (None: gpus / (tp * pp) for every tp and pp searched)"""
    tp_overlap: str = "async"
    """how TP collectives overlap compute: off, async, chunked:K, fill (:mod:`pipeloom.tune.comm_terms`)"""
    tp_comm_overlap: bool = False
    """Megatron's ``--tp-comm-overlap`` (TransformerEngine userbuffers): forward collectives behind the GEMMs too"""
    dp_bucket_params: int | None = None
    """parameters per DP gradient bucket (None: Megatron's default max(40M, 1M x dp); :mod:`pipeloom.sim.dp`)"""
    # mixture of experts, long context, FP8 (pipeloom.tune.moe_costs, pipeloom.memory.moe)
    ep: int | None = None
    """fix the expert-parallel degree (None: search every ep dividing the experts and dp*cp, up to max_ep)"""
    max_ep: int | None = None
    cp: int | None = None
    """fix the context-parallel degree (None: search up to max_cp)"""
    max_cp: int = 1
    capacity_factor: float | None = None
    moe_imbalance: float = 1.0
    fp8: bool = False
    route_nodes: int | None = None
    """node-limited routing: each token to at most this many nodes (DeepSeek-V3: 4)"""
    recompute_norms: bool = False
    """light recompute: norms and MLA up-projections re-run in B (DeepSeek-V3)"""
    pair_fb: bool = False
    """add F&B pairs (:func:`pipeloom.schedule.pairing.pair_forward_backward`) to every schedule that does not
    pair by itself when the configuration has an all-to-all to hide (Megatron-Core's combined 1F1B)"""

    def __post_init__(self) -> None:
        for k in ("gpus", "global_batch", "seq", "max_vpp", "max_microbatch_size", "top", "vpp", "dp"):
            v = getattr(self, k)
            if (v is not None or k not in ("vpp", "dp")) and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise TuneError(f"{k} must be an integer >= 1, got {v!r}")
        pinned = {k: v for k, v in (("tp", self.tp), ("pp", self.pp), ("dp", self.dp), ("cp", self.cp))
                  if v is not None}
        prod = math.prod(pinned.values())
        every = {"tp", "pp", "dp"} <= set(pinned) and (self.cp is not None or self.max_cp == 1)
        if len(pinned) > 1 and (self.gpus % prod or (every and prod != self.gpus)):
            raise TuneError(f"{' x '.join(f'{k} {v}' for k, v in pinned.items())} = {prod} "
                            f"{'is not' if every else 'does not divide'} the {self.gpus} GPUs "
                            f"(tp x cp x pp x dp = GPUs); pin fewer degrees or change them")
        if self.vpp is not None and self.vpp > 1 and self.pp == 1:
            raise TuneError(f"vpp {self.vpp} with pp 1: virtual stages need a pipeline; fix pp > 1 or vpp 1")
        if self.gpus % self.gpu.gpus_per_node and self.gpus > self.gpu.gpus_per_node:
            raise TuneError(f"{self.gpus} GPUs are not whole nodes of {self.gpu.gpus_per_node}; give a multiple of "
                            f"--gpus-per-node (or fewer GPUs than one node)")
        bad = [r for r in self.recompute if r not in RECOMPUTES]
        if bad or not self.recompute:
            raise TuneError(f"recompute must be among {', '.join(RECOMPUTES)}, got {', '.join(bad) or 'none'}")
        if not self.zero or any(z not in ZERO_LEVELS or isinstance(z, bool) for z in self.zero):
            raise TuneError(f"zero must be among {', '.join(map(str, ZERO_LEVELS))} ({zero_help()}), "
                            f"got {self.zero!r}")
        if not self.partitions or any(p not in PARTITIONS for p in self.partitions):
            raise TuneError(f"partitions must be among {', '.join(PARTITIONS)}, got {self.partitions!r}")
        if not self.mem_limits or any(x not in ("default", "fit") for x in self.mem_limits):
            raise TuneError(f"memory limits must be among default, fit, got {self.mem_limits!r}")
        if self.mem_limit is not None:
            object.__setattr__(self, "mem_limit", MemLimit.parse(self.mem_limit))
        from .comm_terms import TPOverlap, TPOverlapError  # the overlap and bucket checks: tune/comm_terms.py
        try:
            TPOverlap.parse(self.tp_overlap)
        except TPOverlapError as e:
            raise TuneError(str(e)) from None
        if self.dp_bucket_params is not None and (not isinstance(self.dp_bucket_params, int) or self.dp_bucket_params < 1):
            raise TuneError(f"dp bucket size must be an integer >= 1 (parameters), got {self.dp_bucket_params!r}")

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
    ep: int = 1
    cp: int = 1
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
                self.recompute, self.zero, self.seg_layer_num, self.mem_limit_mode, self.ep, self.cp)

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
                "lower_bound_s": self.lower_bound_s, "ep": self.ep, "cp": self.cp}



def _divisors(n: int) -> list[int]:
    return divisors(n)  # tune/gpus.py: up to sqrt(n), not n


def builder_vpps(name: str, pp: int, layers: int, max_vpp: int, pin: int | None = None) -> list[int]:
    """The vpps to try with builder ``name``: its rule, at most ``max_vpp`` (or just ``pin``), never more chunks
    than ``layers`` (the caller adds 2 when the 'ends' partition may leave the first chunk only the embedding and
    the last only the loss), never vpp > 1 on pp 1 (one stage has no virtual stages a trainer could run)."""
    rule = registry.get(name).vpp
    hi = max(max_vpp, pin or 1)
    cands = {"1": [1], "2": [2], ">=2": list(range(2, hi + 1)), "any": list(range(2, hi + 1))}[rule]
    return [v for v in cands if pp * v <= layers and (pin is None or v == pin) and (pp > 1 or v == 1)]


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
        self.budgets: dict = {}
        self._owned: dict = {}
        self.sim_count = 0
        self.hits = 0
        self.summaries: dict = {}
        self.fresh: set = set()
        self.shapes: dict = {}

    # -------------------------------------------------------------- costs
    def times(self, tp: int, b: int, r: str, fused: bool = True, ep: int = 1, cp: int = 1):
        k = (tp, b, r, fused, ep, cp)
        if k not in self.layer_t:
            p = self.p
            from ..models.moe import load_factor
            from .moe_costs import Parallel, layer_times as moe_layer_times

            ov = TPOverlap.parse(p.tp_overlap, p.tp_comm_overlap)
            half = p.calibration.efficiency_half_hidden
            par = Parallel(ep=ep, cp=cp, load=load_factor(p.capacity_factor, p.moe_imbalance) if p.model.moe else 1.0,
                           fp8=p.fp8, route_nodes=p.route_nodes, recompute_norms=p.recompute_norms,
                           moe=p.model.moe)
            self.layer_t[k] = (moe_layer_times(p.model, self.gpu, self.eff, tp=tp, micro_batch=b, seq=p.seq, recompute=r,
                                               par=par, tp_overlap=ov, fused=fused, half_hidden=half),
                               head_times(p.model, self.gpu, self.eff, tp=tp, micro_batch=b, seq=p.seq // cp,
                                          half_hidden=half))
        return self.layer_t[k]

    def split(self, pp: int, vpp: int, placement: Placement, how: str, tp: int, b: int, r: str) -> tuple[int, ...]:
        L = self.p.model.layers
        if how == "ends":
            k = (pp, vpp, "ends")
            if k not in self.parts:
                self.parts[k] = tuple(ends_as_layers(L, pp, vpp))
            return self.parts[k]
        if how == "uniform":
            k = (pp, vpp, placement)
            if k not in self.parts:
                self.parts[k] = tuple(uniform(L, pp, vpp, placement).seg_layer_num)
            return self.parts[k]
        lt, ht = self.times(tp, b, r)
        mtp = getattr(self.p.model, "mtp_layers", 0)  # DeepSeek-V3's MTP modules: with the head (tune/costs.py)
        ratio = float(f"{((1 + mtp) * (ht.F + ht.B + ht.W) + mtp * (lt.F + lt.B + lt.W)) / (lt.F + lt.B + lt.W):.2g}")
        k = (pp, vpp, placement, ratio)
        if k not in self.parts:
            layer = LayerCost(F=1.0, B=0.0, W=0.0, mem=1.0)
            lc = LayerCosts(tuple([layer] * L), LayerCost(), LayerCost(F=ratio, mem=0.0))
            self.parts[k] = tuple(bottleneck_dp(lc, pp, vpp, placement).seg_layer_num)
        return self.parts[k]

    def memory(self, tp: int, b: int, r: str, zero: int, dp: int, seg: tuple[int, ...], ep: int = 1, cp: int = 1):
        k = (tp, b, r, zero, dp, seg, ep, cp)
        if k not in self.chunk_mem:
            p = self.p
            train = TrainConfig(seq=self.p.seq, micro_batch=b, tp=tp, sequence_parallel=tp > 1, recompute=r,
                                dp=dp, zero=zero, ep=ep, cp=cp, capacity_factor=p.capacity_factor,
                                moe_imbalance=p.moe_imbalance, fp8=p.fp8, recompute_norms=p.recompute_norms)
            chunks = chunk_memory(self.p.model, train, list(seg))
            self.chunk_mem[k] = (train, chunks)
        return self.chunk_mem[k]

    # -------------------------------------------------------------- memory
    def budget(self, c) -> DeviceBudget:
        """What each device of ``c`` holds: one :func:`~pipeloom.memory.budget.device_budget` call per
        layout (cached), the only way the tuner reads the memory model."""
        k = (c.tp, c.microbatch_size, c.recompute, c.zero, c.dp, c.seg_layer_num, c.pp, c.vpp, c.placement, c.ep, c.cp)
        hit = self.budgets.get(k)
        if hit is None:
            train, chunks = self.memory(c.tp, c.microbatch_size, c.recompute, c.zero, c.dp, c.seg_layer_num, c.ep,
                                        c.cp)
            hit = self.budgets[k] = device_budget(self.p.model, train, (c.pp, c.vpp, c.placement, c.seg_layer_num),
                                                  chunks=chunks)
        return hit

    def summary(self, c):
        """(the layout key of ``c``, the largest parameter count of a device, the memory lower bound in bytes).

        The enumeration asks this of every configuration, so only these numbers are kept per layout, not the
        budget itself: :meth:`budget` keeps the few the evaluation asks for (a cache of every layout's budget
        made the plan pool's forked workers slower: their garbage collector walks, and so copies, every object
        they inherit)."""
        k = (c.tp, c.microbatch_size, c.recompute, c.zero, c.dp, c.seg_layer_num, c.pp, c.vpp, c.placement, c.ep, c.cp)
        hit = self.summaries.get(k)
        if hit is None:
            budget = self.budgets.get(k)  # the key of budget()
            if budget is None:
                train, chunks = self.memory(c.tp, c.microbatch_size, c.recompute, c.zero, c.dp, c.seg_layer_num, c.ep,
                                            c.cp)
                budget = device_budget(self.p.model, train, (c.pp, c.vpp, c.placement, c.seg_layer_num), chunks=chunks)
            hit = self.summaries[k] = (k, max(budget.params), budget.lower_bound_bytes())
        return hit

    def fit_units(self, c) -> float:
        """The room of ``c``'s tightest device on this GPU (after the reserve), in units."""
        return self.budget(c).limit_units(self.p.gpu.memory, self.p.reserve)

    def given_limit(self, c) -> float | None:
        """The limit (units) the tuner hands ``c``'s builder: None in 'default' mode, the GPU's room (to 1/100
        unit) in 'fit', ``--mem-limit`` in 'given' (a size in bytes through the budget, to 1/100 unit)."""
        if c.mem_limit_mode == "default":
            return None
        if c.mem_limit_mode == "fit":
            return math.floor(self.fit_units(c) * 100) / 100
        lim = self.p.mem_limit
        if lim.is_bytes:
            return math.floor(self.budget(c).limit_units(int(lim.value), self.p.reserve) * 100) / 100
        return lim.units(c.pp)

    def owned(self, pp: int, vpp: int, placement: Placement):
        """(chunks of each device, whether the edge into chunk k crosses devices)."""
        k = (pp, vpp, placement)
        hit = self._owned.get(k)
        if hit is None:
            nc = pp * vpp
            devs = [device_of(c, pp, placement) for c in range(nc)]
            hit = self._owned[k] = ([chunks_of(d, pp, vpp, placement) for d in range(pp)],
                                    [k > 0 and devs[k] != devs[k - 1] for k in range(nc)])
        return hit

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
    bad_dp, pers = [], []
    for tp in tps:
        try:
            check_tp(model, TrainConfig(tp=tp, seq=prob.seq))
        except MemoryConfigError:
            drop(f"tp: does not divide heads/kv_heads/ffn/hidden of {model.name}")
            continue
        if prob.gpus % tp:
            drop("tp: does not divide the GPU count")
            continue
        for pp, cp in cp_pairs(prob, tp, drop):
            if prob.pp is not None and pp != prob.pp:
                continue
            if prob.max_pp is not None and pp > prob.max_pp:
                drop("pp: above --max-pp")
                continue
            if pp > model.layers:
                drop("pp: more stages than layers")
                continue
            dp = prob.gpus // (tp * pp * cp)
            if prob.dp is not None and dp != prob.dp:
                continue
            if prob.global_batch % dp:
                drop("dp: global batch not divisible by dp")
                bad_dp.append(dp)
                continue
            per = prob.global_batch // dp
            pers.append(per)
            for b in _divisors(per):
                if b > prob.max_microbatch_size or (prob.microbatch_sizes and b not in prob.microbatch_sizes):
                    continue
                m = per // b
                for r in prob.recompute:
                    for z, ep in ep_pairs(prob, dp, cp, drop):
                        if z and dp == 1:
                            continue  # any ZeRO level over one replica shards nothing: the plain optimizer
                        for name in names:
                            info = registry.get(name)
                            vpps = builder_vpps(name, pp, model.layers + (2 if "ends" in prob.partitions else 0),
                                                prob.max_vpp, prob.vpp)
                            if not vpps:
                                drop(f"schedule {name}: needs vpp > 1, which pp 1 cannot run" if pp == 1 else
                                     f"schedule {name}: needs more chunks than layers or a vpp above --max-vpp"
                                     if prob.vpp is None else f"schedule {name}: does not run vpp {prob.vpp}")
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
                                    limits = (("default",) if not info.memory_aware else ("given",)
                                              if prob.mem_limit is not None else prob.mem_limits)
                                    for lim in limits:
                                        searched += 1
                                        c = Config(tp=tp, pp=pp, dp=dp, vpp=vpp, microbatch_size=b, microbatches=m,
                                                   schedule=name, recompute=r, zero=z, partition=how,
                                                   mem_limit_mode=lim, seg_layer_num=seg, placement=placement,
                                                   ep=ep, cp=cp)
                                        c.mem_lower_bound = memory_lower_bound(space, c)
                                        if c.mem_lower_bound > avail_bytes:
                                            drop("memory: weights + optimizer + one microbatch over the GPU")
                                            out.append(c)  # kept aside for the 'fits nowhere' message
                                            c.fits = False
                                            continue
                                        c.lower_bound_s = lower_bound(space, c)
                                        out.append(c)
    if searched == 0 and prob.microbatch_sizes and pers and not any(
            per % b == 0 for per in pers for b in prob.microbatch_sizes):
        raise TuneError(f"micro-batch size {', '.join(map(str, prob.microbatch_sizes))} divides no batch per replica "
                        f"(global batch / dp = {', '.join(map(str, sorted(set(pers))))}); give a divisor of one")
    if searched == 0 and bad_dp:
        ok = sorted(set(bad_dp))
        raise TuneError(f"--global-batch {prob.global_batch} is not divisible by any data-parallel degree of "
                        f"{prob.gpus} GPUs (dp = GPUs / (tp*pp) in {', '.join(map(str, ok))}); global batches "
                        f"that work are multiples of one of them, e.g. {_nearest(prob.global_batch, ok)}")
    return out, searched


def cp_pairs(prob: Problem, tp: int, drop) -> list[tuple[int, int]]:
    """(pp, cp) of the enumeration: cp pinned (``prob.cp``) or every divisor up to ``max_cp`` whose zig-zag split
    divides the sequence (``seq % 2cp == 0``), pp every divisor of what is left."""
    out = []
    cps = [prob.cp] if prob.cp is not None else [c for c in _divisors(prob.gpus // tp) if c <= prob.max_cp]
    for cp in cps:
        if (prob.gpus // tp) % cp:
            drop("cp: does not divide the GPUs left after tp")
            continue
        if cp > 1 and prob.seq % (2 * cp):
            drop("cp: sequence not divisible by 2*cp (zig-zag split)")
            continue
        out += [(pp, cp) for pp in _divisors(prob.gpus // (tp * cp))]
    return out


def ep_pairs(prob: Problem, dp: int, cp: int, drop) -> list[tuple[int, int]]:
    """(zero, ep) of the enumeration: ep pinned (``prob.ep``) or, for a MoE model, every ep dividing the routed
    experts and dp * cp (Megatron carves EP out of DP), up to ``max_ep``; 1 for a dense model."""
    model = prob.model
    if prob.ep is not None:
        eps = [prob.ep]
    elif model.moe:
        eps = [e for e in _divisors(dp * cp) if model.experts % e == 0 and (prob.max_ep is None or e <= prob.max_ep)]
    else:
        eps = [1]
    ok = [e for e in eps if (dp * cp) % e == 0 and (e == 1 or (model.moe and model.experts % e == 0))]
    if len(ok) < len(eps):
        drop("ep: does not divide the experts and dp*cp", len(eps) - len(ok))
    return [(z, e) for z in prob.zero for e in ok]


def _nearest(gb: int, dps: list[int]) -> str:
    cands = sorted({(gb // d + k) * d for d in dps for k in (0, 1) if (gb // d + k) * d > 0})
    cands.sort(key=lambda x: abs(x - gb))
    return " or ".join(map(str, sorted(cands[:2])))

