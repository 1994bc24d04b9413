"""What one training run is: :class:`RunConfig` (the runtime's resolved settings) and :func:`prepare`, which
plans or validates its schedule once.

The settings file a user writes (``pipeloom run --config FILE``) is :class:`pipeloom.core.config.PipeloomConfig`,
nested and typed; the command line maps it, and its flags, onto the flat :class:`RunConfig` here, which is
what the ranks receive. Nothing here imports torch (the example model's config is imported where it is made).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..core.costs import Costs
from ..core.errors import ScheduleError
from ..core.ir import Schedule
from ..models.slicing import even_layer_split
from ..models.tp_modes import parse_overlap
from ..schedule import io as schedule_io
from ..schedule import planning
from ..schedule.registry import PlanSpec
from ..trace.writer import parse_profile_steps

EXAMPLES = ("llama-tiny",)


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """One training run of the example model."""

    schedule: str | Schedule = "1f1b"
    """registry name (planned once by :func:`prepare`), or a built :class:`Schedule` (ignored when ``plan``
    is given)"""
    pp: int = 2
    """pipeline stages"""
    vpp: int | None = None
    """chunks per stage (None: the schedule's default)"""
    dp: int = 1
    """data-parallel replicas (world size = pp * dp * tp)"""
    tp: int = 1
    """tensor-parallel ranks per stage (:mod:`pipeloom.models.tp`; the innermost mesh dimension: a stage's TP
    ranks are consecutive global ranks). tp > 1 runs the built-in Llama, or a transformers Llama/Mistral
    (``model``, :mod:`pipeloom.integrations.hf_tp`, without sequence parallelism); measured costs are the
    slowest TP rank's (:func:`pipeloom.trace.tp_costs.fit_tp_chunk_costs`)"""
    sequence_parallel: bool = False
    """with tp > 1: the hidden states between the GEMM pairs and between stages hold seq_len/tp tokens per rank"""
    microbatches: int = 4
    """microbatches per step"""
    steps: int = 1
    """optimizer steps"""
    microbatch_size: int = 2
    """sequences per microbatch"""
    seq_len: int = 16
    """tokens per sequence"""
    n_layers: int | None = None
    """decoder blocks (None: max(8, number of chunks))"""
    dim: int = 64
    """model width"""
    seed: int = 0
    """weights and data seed"""
    lr: float = 1e-3
    """AdamW learning rate"""
    verify: bool = False
    """compare the first step with a single-process reference"""
    log_dir: str | None = None
    """per-rank job logs (workerlog.<rank>)"""
    profile_steps: str | None = None
    """profiler window START:STOP (default with log_dir: every step)"""
    inject_delay: tuple[int, float] | None = None
    """(global rank, seconds): sleep in every job of that rank"""
    plan: Schedule | dict | None = None
    """a schedule file's content (a Schedule, or Schedule.to_dict() from --plan FILE) instead of building one"""
    mem_limit: str | None = None
    """memory limit for memory-aware builders (none, 1p, 1.5p, 2p, ...); ignored when ``spec`` is given"""
    spec: PlanSpec | None = None
    """what a registry ``schedule`` is planned with (costs, memory model and limit, builder options;
    its pp/vpp/microbatches win over the fields above); None: unit costs at ``mem_limit``"""
    layers_per_chunk: tuple[int, ...] | None = None
    """decoder layers of every global chunk (a layer partition's seg_layer_num); None: an even split"""
    measure_costs: bool = False
    """plan with measured costs: run ``calibrate_steps`` logged steps of a first plan, fit per-chunk
    F/B/W and comm (:func:`pipeloom.trace.check.fit_chunk_costs`), plan again, then run"""
    calibrate_steps: int = 3
    """timed steps of the calibration run (after one warm-up step)"""
    planned_costs: Costs | None = None
    """the costs the schedule was planned with (set by :func:`prepare`; written to the job logs)"""
    builder: str | None = None
    """the registry name the schedule was planned with (set by :func:`prepare`; None: a given schedule)"""
    checked: bool = False
    """set by :func:`prepare`: ``schedule`` is a planned or validated Schedule (ranks only check its shape)"""
    timeout_s: float = 120.0
    """longest wait on a peer"""
    dtype: str = "fp32"
    """fp32, or bf16 (bf16 parameters, fp32 master weights and grads)"""
    strict_p2p: bool | None = None
    """link-ordered P2P for both directions (default: only on NCCL)"""
    fault_nan_mb: int | None = None
    """testing: make the loss of this microbatch NaN in the first step"""
    fault_exit_rank: int | None = None
    """testing: this global rank dies (os._exit) at its first job"""
    model: object | None = None
    """a model of your own instead of the example (e.g. :class:`pipeloom.integrations.hf.HFRunModel`):
    attributes ``name``, ``layers``, ``vocab``, ``max_seq``; ``chunks(split, which, seed, device) ->
    (modules, ties)``, ``reference_step(seed, loss_fn, xs, ys) -> (loss, grads by name)`` and
    ``canonical(name)`` (a chunk's parameter name -> the reference's); picklable (sent to the ranks)"""
    data: str | None = None
    """a token file (flat uint16/uint32 ids, see :mod:`pipeloom.runtime.data`); None: synthetic data"""
    data_dtype: str = "uint16"
    """the token file's integer type"""
    overlap_grad_reduce: bool = False
    """dp > 1: start each chunk's gradient reduction asynchronously right after its last W/BW on the rank
    (overlapped with the pipeline drain) instead of one blocking all-reduce after the step. Off by default:
    measured on gloo/CPU it does not help (the reduction competes with compute for the same cores); turn it
    on where the reduction has its own link and engine (NCCL)"""
    zero: int = 0
    """1: ZeRO-1 (reduce-scatter the gradients, AdamW states and, with bf16, the fp32 master weights sharded
    over dp, all-gather the parameters); 0: every dp rank keeps the whole optimizer"""
    rank_order: str = "dp-pp"
    """how global ranks map onto (dp, pp): ``dp-pp`` (dp outer: ranks 0..pp-1 are one whole pipeline) or
    ``pp-dp`` (pp outer: ranks 0..dp-1 are the replicas of stage 0, so with one node per stage the pipeline
    crosses nodes and the dp reduction stays inside a node)"""
    return_params: bool = False
    """testing: rank 0's result carries every parameter after the first optimizer step (``params``, name ->
    flat list of floats, from dp replica 0) and the largest difference between dp replicas (``replica_param_diff``)"""
    fault_hang_rank: int | None = None
    """testing: this global rank stops (sleeps) before its first gradient reduction in the first step (with tp > 1: before its
    first backward job)"""
    measure_links: bool = False
    """after the steps, time an all-reduce of this rank's gradient bytes over its dp group (dp > 1) and put
    it, the device and the layers of every chunk in the result (``pipeloom run --calibrate``)"""
    tp_overlap: str = "off"
    """with tp > 1: what a column-parallel layer's input-gradient collective overlaps in the backward: ``off``,
    ``async`` (the layer's weight-gradient GEMMs, where the plan fuses B and W or a W follows its own B),
    ``chunked:K`` (the split B's dgrad in K token pieces), ``fill`` (queued W work of an earlier microbatch);
    see :mod:`pipeloom.runtime.tp_overlap`. Every mode gives bitwise the same result"""
    tp_link_delay_ms: float = 0.0
    """with tp > 1: an emulated link (tests, benches): every TP collective lands this many milliseconds late
    (a piece of a chunked one its share), waiting on a communication thread, no CPU used"""
    tp_link_jitter: bool = False
    """testing: each TP collective's link delay is drawn at random in [0, tp_link_delay_ms] (the race detector)"""
    keep_gathered_input: bool = False
    """with sequence parallelism: keep each column-parallel group's all-gathered input from F to its weight
    gradient (``pipeloom memory --keep-gathered-input`` counts it); False (the default, Megatron's): keep the
    sequence shard and gather it again before the weight gradients, double-buffered in W"""

    def __post_init__(self) -> None:
        for name in ("pp", "dp", "tp", "microbatches", "steps", "microbatch_size", "seq_len", "dim", "calibrate_steps"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.model is None and self.dim % 8:  # the example model has 4 heads, and rotary embeddings need an even head size
            raise ValueError(f"--dim {self.dim}: the example model needs a multiple of 8 (4 attention heads of an "
                             f"even size), e.g. {max(8, self.dim // 8 * 8)}")
        if self.dtype not in ("fp32", "bf16"):
            raise ValueError(f"dtype must be fp32 or bf16, got {self.dtype!r}")
        if self.rank_order not in ("dp-pp", "pp-dp"):
            raise ValueError(f"rank order must be dp-pp or pp-dp, got {self.rank_order!r}")
        if self.zero not in (0, 1):
            raise ValueError(f"zero must be 0 (replicated optimizer) or 1 (ZeRO-1: sharded over dp), got {self.zero!r}")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("--sequence-parallel splits the sequence over the tensor-parallel ranks: it needs --tp > 1")
        if self.keep_gathered_input and not self.sequence_parallel:
            raise ValueError("--keep-gathered-input is about sequence parallelism (the column-parallel groups' "
                             "gathered inputs): it needs --sequence-parallel")
        if self.sequence_parallel and self.seq_len % self.tp:
            raise ValueError(f"--sequence-parallel: --seq-len {self.seq_len} must be a multiple of --tp {self.tp} "
                             f"(each TP rank holds seq_len/tp tokens)")
        if self.tp != 1 and self.model is not None and self.sequence_parallel:
            raise ValueError(f"--tp {self.tp} runs pp x dp x tp with the built-in Llama only; "
                             f"not yet with --model and --sequence-parallel")
        parse_overlap(self.tp_overlap)
        if not (0 <= self.tp_link_delay_ms < float("inf")):
            raise ValueError(f"--tp-link-delay must be a finite number of milliseconds >= 0, got {self.tp_link_delay_ms}")
        if self.tp == 1 and (self.tp_overlap != "off" or self.tp_link_delay_ms):
            what = "--tp-overlap" if self.tp_overlap != "off" else "--tp-link-delay"
            raise ValueError(f"{what} is about tensor-parallel collectives: it needs --tp > 1")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout_s}")
        window = parse_profile_steps(self.profile_steps)
        if window and self.log_dir is None:
            raise ValueError(f"--profile-steps {self.profile_steps} needs --log-dir DIR (where the job logs go)")
        if window and window[0] >= self.steps:
            raise ValueError(f"--profile-steps {self.profile_steps} starts after the last step: the run has steps "
                             f"0..{self.steps - 1}, so nothing would be logged")


def prepare(cfg: RunConfig) -> RunConfig:
    """``cfg`` with ``schedule`` a checked :class:`Schedule` (planned or validated here, once) and pp, vpp,
    microbatches taken from it, ``checked`` set. A checked config is returned as it is (the ranks of a
    spawned run get it so and only check the schedule's shape)."""
    if cfg.checked:
        return cfg
    from ..schedule.validate import summary, validate
    costs = None
    if cfg.plan is not None or isinstance(cfg.schedule, Schedule):
        src = cfg.plan if cfg.plan is not None else cfg.schedule
        sched = schedule_io.from_dict(src) if isinstance(src, dict) else src
        v = validate(sched)
        if v:
            raise ScheduleError(f"plan {sched.name!r} is invalid: {summary(v)}")
    else:
        from ..schedule import registry
        spec = cfg.spec
        if spec is None:
            vpp = cfg.vpp if cfg.vpp is not None else registry.default_vpp(cfg.schedule)
            spec = planning.make_spec(pp=cfg.pp, microbatches=cfg.microbatches, vpp=vpp, mem_limit=cfg.mem_limit)
        sched, costs = planning.plan(cfg.schedule, spec), spec.costs
    if cfg.layers_per_chunk is not None and len(cfg.layers_per_chunk) != sched.num_chunks:
        raise ValueError(f"layers_per_chunk has {len(cfg.layers_per_chunk)} entries but the schedule has "
                         f"{sched.num_chunks} chunks (pp*vpp)")
    builder = cfg.schedule if isinstance(cfg.schedule, str) and cfg.plan is None else None
    if sched.witness is not None:  # the validator's shortcut (may hold memoryviews): not for pickling to ranks
        sched = dataclasses.replace(sched, witness=None)
    return dataclasses.replace(cfg, schedule=sched, plan=None, pp=sched.pp, vpp=sched.vpp, builder=builder,
                               microbatches=sched.microbatches, planned_costs=costs, checked=True)


def resolve_schedule(cfg: RunConfig) -> tuple[Schedule, dict | None]:
    """The schedule to run and the costs it was planned with (None for a given schedule), as a dict."""
    p = prepare(cfg)
    return p.schedule, None if p.planned_costs is None else p.planned_costs.to_dict()


def _check_shape(cfg: RunConfig, sched: Schedule) -> None:
    """The cheap per-rank check of a schedule planned and validated by the parent."""
    if sched.pp != cfg.pp or len(sched.devices) != sched.pp:
        raise ValueError(f"schedule {sched.name!r} is for pp={sched.pp} with {len(sched.devices)} device lists, "
                         f"the run has pp={cfg.pp}")


def _split(cfg: RunConfig, mcfg, num_chunks: int) -> list[list[int]]:
    """Global layer indices of every chunk: ``layers_per_chunk`` or an even split."""
    if cfg.layers_per_chunk is None:
        return even_layer_split(mcfg.layers, num_chunks)
    out, start = [], 0
    for n in cfg.layers_per_chunk:
        out.append(list(range(start, start + n)))
        start += n
    return out


def model_config(cfg: RunConfig, num_chunks: int):
    from ..models.llama import LlamaConfig
    if cfg.layers_per_chunk is not None:
        if any(n < 1 for n in cfg.layers_per_chunk):
            raise ValueError(f"layers_per_chunk {list(cfg.layers_per_chunk)}: every chunk needs >= 1 layer")
        if cfg.n_layers is not None and cfg.n_layers != sum(cfg.layers_per_chunk):
            raise ValueError(f"n_layers {cfg.n_layers} != {sum(cfg.layers_per_chunk)} layers in layers_per_chunk")
    n_layers = sum(cfg.layers_per_chunk) if cfg.layers_per_chunk is not None else \
        cfg.n_layers if cfg.n_layers is not None else max(8, num_chunks)
    if n_layers < num_chunks:
        raise ValueError(f"{n_layers} layers cannot fill {num_chunks} chunks (pp*vpp); use more layers")
    if cfg.model is not None:  # a model of its own: its layers are fixed (the shape is all the run needs here)
        m = cfg.model
        if n_layers != m.layers and (cfg.layers_per_chunk is not None or cfg.n_layers is not None):
            raise ValueError(f"model {m.name} has {m.layers} layers; the run asks for {n_layers}")
        if m.layers < num_chunks:
            raise ValueError(f"model {m.name} has {m.layers} layers, too few for {num_chunks} chunks (pp*vpp)")
        if cfg.seq_len > m.max_seq:
            raise ValueError(f"--seq-len {cfg.seq_len} exceeds model {m.name}'s {m.max_seq} positions")
        from types import SimpleNamespace
        return SimpleNamespace(layers=m.layers, vocab=m.vocab, seq=m.max_seq, name=m.name)
    return LlamaConfig(n_layers=n_layers, dim=cfg.dim, max_seq_len=cfg.seq_len)





def from_settings(settings) -> RunConfig:
    """The :class:`RunConfig` of a settings file's sections (:class:`pipeloom.core.config.PipeloomConfig`, e.g.
    ``PipeloomConfig.load("plan/pipeloom.toml")`` that ``pipeloom tune --out`` wrote), for the built-in example
    model. ``schedule.plan`` (a schedule file) is run as it is; else ``[schedule]`` is planned, with the chunks
    costed and the model's layers cut by ``[partition]`` (:func:`pipeloom.partition.partition_from_settings`),
    as ``pipeloom run --config FILE`` does. A transformers ``model.name`` is built by
    :class:`pipeloom.integrations.hf.HFRunModel` (``RunConfig(model=...)``) and refused here, naming the field."""
    from ..core.config import ConfigError, PipeloomConfig

    if not isinstance(settings, PipeloomConfig):
        raise ConfigError(f"expected a PipeloomConfig, got {type(settings).__name__}")
    s, p, m, t, j = settings.schedule, settings.partition, settings.model, settings.training, settings.job
    if m.name is not None and m.name not in EXAMPLES:
        raise ConfigError(f"model.name {m.name!r}: a transformers model is built by pipeloom.integrations.hf."
                          f"HFRunModel (RunConfig(model=...)) or 'pipeloom run --config FILE'; here: "
                          f"{', '.join(EXAMPLES)}")
    if m.weights:
        raise ConfigError("model.weights: the example model has seeded weights (a transformers model loads them)")
    if p.model is not None:
        raise ConfigError(f"partition.model {p.model!r}: a run costs the layers of the model it trains; leave "
                          f"partition.model out (it is for 'pipeloom plan')")
    common = dict(dp=t.dp, steps=t.steps, microbatch_size=t.microbatch_size, seq_len=t.seq_len, lr=t.lr, seed=t.seed,
                  dtype=t.dtype, zero=t.zero, overlap_grad_reduce=t.overlap_grad_reduce, rank_order=t.rank_order,
                  data=t.data, data_dtype=t.data_dtype, verify=j.verify, log_dir=j.log_dir,
                  profile_steps=j.profile_steps, timeout_s=j.timeout_s, dim=m.dim or 64, n_layers=p.layers,
                  layers_per_chunk=p.layers_per_chunk)
    if s.plan is not None:
        sched = schedule_io.load(s.plan)
        return RunConfig(plan=sched, pp=sched.pp, microbatches=sched.microbatches, **common)
    from ..schedule import registry

    try:
        registry.get(s.name)
    except ValueError as e:
        raise ConfigError(f"schedule.name: {e}") from None
    vpp = s.vpp if s.vpp is not None else registry.default_vpp(s.name)
    mem = s.mem
    if s.runtime == "torch":  # torch's runtime frees nothing at B
        from ..core.costs import MemModel, runtime_mem_model
        mem = runtime_mem_model("torch", a=MemModel.parse(s.mem).a)
    spec = planning.make_spec(pp=s.pp, microbatches=s.microbatches, vpp=vpp, costs=s.costs, mem=mem,
                              mem_limit=s.mem_limit, options=dict(s.options))
    split = p.layers_per_chunk
    if p.given():  # the chunks cost what their layers cost, as 'pipeloom plan' costs them
        if s.mem is not None:
            raise ConfigError("schedule.mem: with a [partition] the memory comes from the layers; leave out one of "
                              "the two")
        from ..partition import partition_from_settings, placement_of
        pplan = partition_from_settings(p, pp=s.pp, vpp=vpp, placement=placement_of(s.name, vpp, spec.options),
                                        base_costs=spec.costs, schedule=s.name, microbatches=s.microbatches,
                                        mem_limit=spec.mem_limit, options=spec.options)
        spec, split = pplan.apply(spec), tuple(pplan.partition.seg_layer_num)
    common["layers_per_chunk"] = split
    return RunConfig(schedule=s.name, pp=s.pp, vpp=vpp, microbatches=s.microbatches, spec=spec,
                     mem_limit=s.mem_limit, **common)


__all__ = ["RunConfig", "prepare", "resolve_schedule", "model_config", "from_settings", "EXAMPLES"]
