"""The built-in ``llama-tiny`` example: train a small Llama decoder on synthetic data with any schedule.

:func:`run` is what ``pipeloom run --example llama-tiny`` calls: it spawns ``pp*dp`` ranks on
127.0.0.1 (gloo) or, under torchrun, runs this rank. Every rank builds only its chunks (the
weights are deterministic, see :mod:`pipeloom.models.llama`), runs ``steps`` optimizer steps and,
with ``verify``, compares the first step's loss and every parameter gradient with a
single-process reference on the same global batch.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import time
import traceback
import uuid
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..schedule import planning
from ..core.ir import Schedule
from ..core.costs import Costs
from ..core.errors import ScheduleError
from ..schedule.registry import PlanSpec
from .executor import PipelineExecutor, reference_step
from ..trace.writer import JobLog, parse_profile_steps
from .launch import RankFailure, default_device, init_process_group, one_line, spawn, under_torchrun
from ..models.slicing import even_layer_split
from ..schedule import io as schedule_io

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
    """data-parallel replicas (world size = pp * dp)"""
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
    """testing: this global rank stops (sleeps) before its first gradient reduction in the first step"""
    measure_links: bool = False
    """after the steps, time an all-reduce of this rank's gradient bytes over its dp group (dp > 1) and put
    it, the device and the layers of every chunk in the result (``pipeloom run --calibrate``)"""

    def __post_init__(self) -> None:
        for name in ("pp", "dp", "microbatches", "steps", "microbatch_size", "seq_len", "dim", "calibrate_steps"):
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


def _batch(mcfg, cfg: RunConfig, sched: Schedule, step: int, replica: int):
    M = sched.microbatches
    seed = cfg.seed * 1_000_003 + step * 1009 + replica
    if cfg.data is not None:
        from .data import TokenFile
        xn, yn = TokenFile(cfg.data, cfg.data_dtype).batch(M * cfg.microbatch_size, cfg.seq_len, seed)
        x, y = torch.from_numpy(xn), torch.from_numpy(yn)
    else:
        from ..models.llama import synthetic_batch
        x, y = synthetic_batch(mcfg, M * cfg.microbatch_size, cfg.seq_len, seed=seed)
    return list(x.chunk(M)), list(y.chunk(M))


_MESHES: dict = {}


def _groups(pp: int, dp: int, timeout_s: float | None = None, order: str = "dp-pp"):
    """(pp global ranks of my pipeline, dp group or None, pp_rank, dp_rank) on a DeviceMesh of shape
    (dp, pp) (``order`` dp-pp) or (pp, dp) (pp-dp)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != pp * dp:
        raise ValueError(f"world size {world} != pp*dp = {pp}*{dp}")
    key = (dp, pp, order)
    if key not in _MESHES:
        from torch.distributed.device_mesh import init_device_mesh
        dev = default_device()
        shape, names = ((dp, pp), ("dp", "pp")) if order == "dp-pp" else ((pp, dp), ("pp", "dp"))
        _MESHES[key] = init_device_mesh(dev.type, shape, mesh_dim_names=names)
    mesh = _MESHES[key]
    pp_ranks = dist.get_process_group_ranks(mesh.get_group("pp"))
    dp_group = _dp_group(mesh, pp, dp, timeout_s, order) if dp > 1 else None
    return pp_ranks, dp_group, mesh.get_local_rank("pp"), mesh.get_local_rank("dp")


def _dp_group(mesh, pp: int, dp: int, timeout_s: float | None, order: str):
    """The mesh's dp group of this rank, or (with ``timeout_s``) the same ranks in a group whose
    collectives give up after ``timeout_s`` (gloo ignores a collective's wait timeout and uses its
    group's; every rank creates every dp group, in the same order, once per timeout)."""
    if timeout_s is None:
        return mesh.get_group("dp")
    key = ("dp", dp, pp, order, float(timeout_s))
    if key not in _MESHES:
        import datetime as _dt
        ranks = [[s + k * pp for k in range(dp)] if order == "dp-pp" else [s * dp + k for k in range(dp)]
                 for s in range(pp)]
        groups = [dist.new_group(r, timeout=_dt.timedelta(seconds=timeout_s)) for r in ranks]
        mine = groups[mesh.get_local_rank("pp")]
        assert dist.get_rank() in ranks[mesh.get_local_rank("pp")]
        _MESHES[key] = mine
    return _MESHES[key]


def worker(cfg: RunConfig) -> dict:
    """Run ``cfg`` on this rank (process group already initialised); rank 0 returns the result."""
    from ..models.llama import build_chunk_modules, build_reference, loss_fn
    if not cfg.checked:
        cfg = prepare(cfg)  # a config made by hand (tests' cases_worker): every rank plans the same
    sched = cfg.schedule
    _check_shape(cfg, sched)
    costs = cfg.planned_costs.to_dict() if cfg.planned_costs is not None else None
    pp, dp = sched.pp, cfg.dp
    pp_ranks, dp_group, pp_rank, dp_rank = _groups(pp, dp, cfg.timeout_s, cfg.rank_order)
    rank = dist.get_rank()
    device = default_device()
    mcfg = model_config(cfg, sched.num_chunks)
    split = _split(cfg, mcfg, sched.num_chunks)
    mine = sched.chunks_of(pp_rank)
    tied = None
    if cfg.model is not None:
        from .tied import TiedGrads
        mods, ties = cfg.model.chunks(split, mine, cfg.seed, device)
        mesh = _MESHES[(dp, pp, cfg.rank_order)].mesh.tolist()  # global ranks as [dp][pp], whatever the order
        grid = mesh if cfg.rank_order == "dp-pp" else [list(r) for r in zip(*mesh)]
        tied = TiedGrads(ties, sched.device_of, grid, dict(zip(mine, mods)), pp_rank=pp_rank, dp_rank=dp_rank)
        if tied.cross and cfg.zero:
            raise ValueError("--zero 1 with weights tied across stages (here the embedding and the head) is not "
                             "supported: ZeRO-1 keeps the reduced gradients in shards; use --zero 0")
    else:
        mods = build_chunk_modules(mcfg, split, cfg.seed, chunks=mine, device=device)
    window = parse_profile_steps(cfg.profile_steps) or ((0, cfg.steps) if cfg.log_dir else None)
    run_id = [uuid.uuid4().hex[:12] if rank == 0 else None]
    if cfg.log_dir:  # every rank has the same cfg, so all of them take part
        dist.broadcast_object_list(run_id, src=0)
    log = JobLog(cfg.log_dir, rank=rank, local_rank=int(os.environ.get("LOCAL_RANK", rank)),
                 world_size=dist.get_world_size(), pp=pp, dp=dp, pp_rank=pp_rank, dp_rank=dp_rank,
                 schedule=schedule_io.to_dict(sched), costs=costs, profile_steps=window,
                 machine=int(os.environ.get("GROUP_RANK", 0)), run_id=run_id[0],
                 model={"layers": sum(map(len, split)), "layers_per_chunk": [len(c) for c in split]}) \
        if cfg.log_dir else None
    delay = cfg.inject_delay[1] if cfg.inject_delay and cfg.inject_delay[0] == rank else 0.0
    reducer = make_dp_reducer(cfg, dp_group)
    ex = PipelineExecutor(sched, dict(zip(mine, mods)), loss_fn, pp_rank=pp_rank, pp_ranks=pp_ranks,
                          dp_group=dp_group, device=device, timeout_s=cfg.timeout_s, inject_delay_s=delay,
                          log=log, param_dtype=torch.bfloat16 if cfg.dtype == "bf16" else None, check=False,
                          strict_p2p=cfg.strict_p2p, reducer=reducer)
    if cfg.fault_nan_mb is not None:
        def poisoned(out, target, _lf=ex.loss_fn):
            loss = _lf(out, target)
            return loss * float("nan") if ex.step_count == 0 and ex.current_job.mb == cfg.fault_nan_mb else loss
        ex.loss_fn = poisoned
    if cfg.fault_exit_rank == rank:
        def dead(job, run):
            os._exit(3)  # a crash without any report, like a killed process
        ex.on_job = dead
    if cfg.fault_hang_rank == rank:
        _hang_before_reduction(ex)
    _bound_world_waits(cfg.timeout_s)
    opt = make_optimizer(cfg, ex)
    losses, times, waits = [], [], []
    verify = params = None
    tied_diff = 0.0
    try:
        for step in range(cfg.steps):
            x, y = _batch(mcfg, cfg, sched, step, dp_rank)
            t0 = time.perf_counter()
            loss = ex.step(x, y)
            times.append(time.perf_counter() - t0)
            waits.append(ex.last_stats.wait_s)
            losses.append(loss)
            if tied:  # the one point between the step's gradients and the optimizer: sum the tied copies
                tied.reduce(lambda p: ex.master.get(p, p).grad)
            if cfg.verify and step == 0:
                verify, ref = _verify(ex, cfg, mcfg, sched, loss, build_reference)
            opt.step()
            opt.zero_grad(set_to_none=True)
            ex.sync_params()
            if tied:
                tied_diff = max(tied_diff, tied.max_weight_diff())
            if step == 0:
                # the fp32 values once (with bf16 + ZeRO-1 an all-gather of the master shards)
                named = _named_fp32(ex, opt) if cfg.verify or cfg.return_params else None
                if cfg.verify:
                    verify.update(_verify_params(named, ref))
                static = _static_bytes(ex, opt)
                if cfg.return_params:
                    params = _gather_params(named, dp_rank)
    finally:
        if log is not None:
            log.close(cfg.steps - 1)
    # slowest rank's time per step; skip the first step (shape negotiation, warm-up) when there are more
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, dict(rank=rank, pp_rank=pp_rank, dp_rank=dp_rank, **static))
    ts = t.tolist()
    timed = ts[1:] if len(ts) > 1 else ts
    out = {"schedule": sched.name, "pp": pp, "vpp": sched.vpp, "dp": dp, "microbatches": sched.microbatches,
           "steps": cfg.steps, "loss": losses[-1], "losses": losses, "step_time_s": statistics.median(timed),
           "dtype": cfg.dtype, "world_size": dist.get_world_size(), "zero": cfg.zero,
           "overlap_grad_reduce": cfg.overlap_grad_reduce and dp > 1, "rank_bytes": ranks}
    if verify is not None:
        out.update(verify)
    if cfg.model is not None:
        out["model"] = cfg.model.name
    if tied is not None:
        d = torch.tensor([tied_diff], dtype=torch.float64)
        dist.all_reduce(d, op=dist.ReduceOp.MAX)
        out["tied_across_stages"] = len(tied.cross)
        out["tied_weight_diff"] = d.item()
    out["deferred_wgrad_share"] = _deferred_shares(ex, cfg, mcfg, sched, dp_rank)
    if cfg.measure_links:
        out.update(_measure_links(mods, dp_group, dp, device))
        out["layers_per_chunk"] = [len(x) for x in split]
    if cfg.return_params:
        out.update(params or {})
    return out if rank == 0 else None


def _deferred_shares(ex: PipelineExecutor, cfg: RunConfig, mcfg, sched: Schedule, dp_rank: int) -> dict | None:
    """Per chunk with W jobs: the share of its weight-gradient FLOPs the split backward defers to W
    (:func:`.splitgrad.deferred_share`, measured on one microbatch); None when the schedule has no W."""
    from .splitgrad import deferred_share
    mine = {}
    if dp_rank == 0:
        g = torch.Generator().manual_seed(cfg.seed)
        for k in sorted(ex._splitgrad):
            if k == 0:
                x = _batch(mcfg, cfg, sched, 0, 0)[0][0].to(ex.device)
            else:
                shape, dtype = ex._in_meta[k]
                x = torch.randn(shape, generator=g).to(device=ex.device, dtype=dtype)
            mine[k] = deferred_share(ex.modules[k], x)["share"]
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    shares = {k: v for d in every for k, v in d.items()}
    return {str(k): shares[k] for k in sorted(shares)} or None


def _measure_links(mods, dp_group, dp: int, device) -> dict:
    """The device's name and, with dp > 1, the median of 3 timed all-reduces (after one warm-up) of this
    rank's fp32 gradient bytes over its dp group (every rank runs it, one group per stage)."""
    import platform

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine() or "cpu")
    out = {"device": {"type": device.type, "name": name}}
    if dp > 1:
        numel = sum(p.numel() for m in mods for p in m.parameters())
        buf = torch.ones(numel, dtype=torch.float32, device=device)
        times = []
        for i in range(4):
            t0 = time.perf_counter()
            dist.all_reduce(buf, group=dp_group)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i:
                times.append(time.perf_counter() - t0)
        out["dp_allreduce"] = {"bytes": numel * 4, "ranks": dp, "seconds": statistics.median(times)}
    return out


def make_dp_reducer(cfg: RunConfig, dp_group):
    """The gradient reducer of the run's options: ZeRO-1 reduce-scatter, per-chunk overlapped all-reduce,
    or one all-reduce after the step; every wait bounded by ``timeout_s``."""
    from .grads import AllReduceAfterAccumulation, OverlappedAllReduce, ZeroReduceScatter
    if cfg.zero == 1:
        return ZeroReduceScatter(dp_group, overlap=cfg.overlap_grad_reduce, timeout_s=cfg.timeout_s)
    if cfg.overlap_grad_reduce:
        return OverlappedAllReduce(dp_group, timeout_s=cfg.timeout_s)
    return AllReduceAfterAccumulation(dp_group, timeout_s=cfg.timeout_s)


def make_optimizer(cfg: RunConfig, ex: PipelineExecutor):
    """AdamW over the executor's parameters, or over this rank's ZeRO-1 shards."""
    from .grads import Zero1Optimizer, ZeroReduceScatter
    if isinstance(ex.reducer, ZeroReduceScatter):
        return Zero1Optimizer(ex.reducer, ex.grads, ex.master, torch.optim.AdamW, timeout_s=cfg.timeout_s, lr=cfg.lr)
    return torch.optim.AdamW(ex.parameters(), lr=cfg.lr)


def _gather_params(named: list, dp_rank: int) -> dict | None:
    """Testing: every rank's fp32 parameters (``named``: :func:`_named_fp32`) to rank 0 (see
    ``RunConfig.return_params``)."""
    mine = {n: p.detach().float().cpu().clone() for n, p in named}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, (dp_rank, mine))
    if dist.get_rank() != 0:
        return None
    first = {n: t for r, ps in every if r == 0 for n, t in ps.items()}
    diff = max([(t - first[n]).abs().max().item() for r, ps in every if r != 0 for n, t in ps.items()] or [0.0])
    # plain lists: tensors would go back through the spawn queue as shared memory of an exiting process
    return {"params": {n: t.flatten().tolist() for n, t in first.items()}, "replica_param_diff": diff}


def _bound_world_waits(timeout_s: float) -> None:
    """After setup (every rank has built its model: one barrier with the setup allowance), let the world
    group's collectives (the step's loss all-reduce) wait at most ``max(timeout_s, 30)`` instead of the group's
    setup timeout (300 s at least): gloo applies a group's timeout, not a per-wait one, so a dead node
    would otherwise hold the other node's ranks for minutes."""
    import datetime as _dt

    from .grads import barrier
    barrier(None, max(timeout_s, 120.0), "the barrier before the first step")
    try:
        from torch.distributed.distributed_c10d import _set_pg_timeout
        # not below 30 s: the pipeline's own P2P waits give up after timeout_s and name the job; a world
        # timeout as short as theirs raced them (a peer's send failing first hid the "timed out" message)
        _set_pg_timeout(_dt.timedelta(seconds=max(timeout_s, 30.0)))
    except (ImportError, RuntimeError, ValueError):  # an older torch or a backend without it: the group's timeout
        pass


def _static_bytes(ex: PipelineExecutor, opt) -> dict:
    """Measured bytes of this rank's static training state after an optimizer step, as distinct
    storages (a tensor that is a view of another is counted once, padding included): parameters
    (the modules' parameters: bf16 or fp32, the ZeRO-1 flat tensor when they live in one), the
    gradient buffer, and the optimizer (its per-element state tensors plus every fp32 master
    weight: the executor's full copies, or ZeRO-1's master shards; storages already counted as
    parameters, e.g. fp32 ZeRO-1 shards that are views of the parameters, are not counted again)."""
    from .grads import Zero1Optimizer
    seen: set = set()

    def nb(ts) -> int:
        total = 0
        for t in ts:
            st = t.untyped_storage()
            if st.data_ptr() not in seen:
                seen.add(st.data_ptr())
                total += st.nbytes()
        return total

    state = [t for st in getattr(opt, "optimizer", opt).state.values() for t in st.values()
             if torch.is_tensor(t) and t.dim() > 0]
    params = nb(p.detach() for p in ex._allp)
    grads = nb([ex.grads.flat])
    masters = list(ex.master.values()) + ([opt.flat] if isinstance(opt, Zero1Optimizer) else [])
    return {"params_bytes": params, "grads_bytes": grads, "optimizer_bytes": nb(state) + nb(m.detach() for m in masters)}


def _named_fp32(ex: PipelineExecutor, opt) -> list:
    """(name, fp32 value) of every parameter of this rank: the parameters, the executor's master
    copies, or (bf16 + ZeRO-1) the master shards all-gathered for the check (a dp collective)."""
    from .grads import Zero1Optimizer
    if not (isinstance(opt, Zero1Optimizer) and opt.sharded_master):
        return ex.named_parameters()
    full = opt.full_master()  # (the executor's master map is empty then: its names map to the bf16 parameters)
    return [(n, full[p]) for n, p in ex.named_parameters()]


def _hang_before_reduction(ex: PipelineExecutor) -> None:
    """Fault testing: this rank stops for good before its first data-parallel reduction."""
    red = ex.reducer
    for name in ("_launch", "finish"):
        if hasattr(red, name):
            def stuck(*a, **k):
                time.sleep(3600)
            setattr(red, name, stuck)
            return


def _verify(ex: PipelineExecutor, cfg: RunConfig, mcfg, sched: Schedule, loss: float, build_reference):
    """Each rank runs the (tiny) reference itself and compares its own chunks; MAX over ranks. Returns
    the comparison and the reference model after one AdamW step (for :func:`_verify_params`). With
    ZeRO-1 the reduced gradients are the shards: each rank compares its shards."""
    from ..models.llama import loss_fn
    from .grads import ZeroReduceScatter
    xs, ys = [], []
    for r in range(cfg.dp):
        x, y = _batch(mcfg, cfg, sched, 0, r)
        xs += x
        ys += y
    if cfg.model is not None:  # the unsplit model; a chunk's name of a tied weight -> the reference's
        ref_loss, ref_grads = cfg.model.reference_step(cfg.seed, loss_fn, xs, ys)
        ref, canon = cfg.model.reference, cfg.model.canonical
    else:
        ref = build_reference(mcfg, cfg.seed)
        ref_loss, ref_grads = reference_step(ref, loss_fn, xs, ys)
        canon = str
    gd, missing = 0.0, 0
    if isinstance(ex.reducer, ZeroReduceScatter):
        names = {p: canon(n) for k in sorted(ex.modules) for n, p in ex.modules[k].named_parameters()}
        buf = ex.grads
        flat = torch.zeros(buf.flat.numel(), dtype=torch.float32)
        for seg in buf.segments:
            off = seg.start
            for p in seg.params:
                g = ref_grads.get(names[p])
                if g is None:
                    missing += 1
                else:
                    flat[off:off + p.numel()] = g.flatten()
                off += p.numel()
        for seg, sh in zip(buf.segments, ex.reducer.shard_grads()):
            lo, hi = ex.reducer.shard(seg)
            gd = max(gd, (sh.detach().float().cpu() - flat[lo:hi]).abs().max().item() if hi > lo else 0.0)
    else:
        for name, p in ex.named_parameters():
            name = canon(name)
            if p.grad is None or name not in ref_grads:
                missing += 1
                continue
            gd = max(gd, (p.grad.detach().float().cpu() - ref_grads[name]).abs().max().item())
    t = torch.tensor([abs(loss - ref_loss), gd, float(missing)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    ropt = torch.optim.AdamW(ref.parameters(), lr=cfg.lr)
    ropt.step()
    return {"max_loss_diff": t[0].item(), "max_grad_diff": t[1].item(), "reference_loss": ref_loss,
            "params_missing_grad": int(t[2].item())}, (ref, canon)


def _verify_params(named: list, ref_and_names) -> dict:
    """After the first optimizer step: max |parameter - reference parameter after one AdamW step|
    (``named``: the fp32 values from :func:`_named_fp32`: parameters, or master weights with bf16),
    MAX over ranks."""
    ref, canon = ref_and_names
    want = dict(ref.named_parameters())
    d = 0.0
    for name, p in named:
        name = canon(name)
        if name in want:
            d = max(d, (p.detach().float().cpu() - want[name].detach()).abs().max().item())
    t = torch.tensor([d], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {"max_param_diff": t[0].item()}


def run(cfg: RunConfig, *, example: str = "llama-tiny") -> dict:
    """Run the example: in-process under torchrun, else spawn pp*dp local ranks (gloo, 127.0.0.1).

    The schedule is planned (or a given one validated) once here; with ``measure_costs`` it is then
    planned again from the costs of a short calibration run (see :func:`calibrate`). Rank 0's result
    carries ``planned_costs`` (the costs the run's schedule was planned with, as a dict)."""
    if example not in EXAMPLES:
        raise ValueError(f"unknown example {example!r}; available: {', '.join(EXAMPLES)}")
    cfg = prepare(cfg)  # fail fast on a bad schedule before starting processes
    sched = cfg.schedule
    mcfg = model_config(cfg, sched.num_chunks)
    if cfg.data is not None:  # a short file or ids beyond the vocabulary: one line, before any process starts
        from .data import TokenFile
        TokenFile(cfg.data, cfg.data_dtype).check(mcfg.vocab, cfg.seq_len)
    world = sched.pp * cfg.dp
    if cfg.inject_delay and not 0 <= cfg.inject_delay[0] < world:
        raise ValueError(f"--inject-delay rank {cfg.inject_delay[0]} out of range: world size is {world}")
    if cfg.measure_costs and cfg.builder is None:
        raise ValueError("measured costs plan a registry schedule again; a given schedule (--plan) has fixed "
                         "jobs: drop measured costs or give --schedule NAME")
    if under_torchrun():
        if int(os.environ["WORLD_SIZE"]) != world:  # before the rendezvous: every rank says it at once
            raise ValueError(f"torchrun started {os.environ['WORLD_SIZE']} ranks; "
                             f"pp*dp = {sched.pp}*{cfg.dp} = {world}")
        init_process_group(max(cfg.timeout_s, 300.0))
        try:
            if cfg.measure_costs:
                cfg = calibrate(cfg)
            return _with_costs(worker(cfg), cfg)
        except Exception as e:  # as from spawn: one line naming this rank (the CLI prints it, no traceback)
            raise RankFailure(dist.get_rank(), one_line(e), tb=traceback.format_exc()) from e
        finally:
            try:
                dist.destroy_process_group()
            except Exception:
                pass
    if cfg.measure_costs:
        cfg = calibrate(cfg)
    return _with_costs(spawn(worker, world, (cfg,), timeout_s=cfg.timeout_s), cfg)


def _with_costs(res: dict | None, cfg: RunConfig) -> dict | None:
    if res is not None:
        res["planned_costs"] = cfg.planned_costs.to_dict() if cfg.planned_costs is not None else None
    return res


def calibrate(cfg: RunConfig) -> RunConfig:
    """Measured costs: run one warm-up and ``calibrate_steps`` logged steps of ``cfg``'s (first) schedule
    (no optimizer step is kept: the calibration run is separate from the real one), fit every chunk's
    F, B, W and the comm latency in ms (:func:`pipeloom.trace.check.fit_chunk_costs`, the fit ``pipeloom
    check`` uses) and plan the registry schedule again with them. Spawned runs calibrate in their own
    ranks and plan in this process; under torchrun rank 0 fits (the log directory must be visible to it:
    one machine) and every rank plans the same deterministic schedule from the broadcast costs."""
    import tempfile
    from ..trace.check import fit_chunk_costs
    from ..trace.reader import read_logs

    sched = cfg.schedule
    warm, n = 1, cfg.calibrate_steps
    torchrun = under_torchrun()
    with tempfile.TemporaryDirectory(prefix="pipeloom-calibrate-") as tmp:
        box = [tmp]
        if torchrun:
            dist.broadcast_object_list(box, src=0)
        ccfg = dataclasses.replace(cfg, steps=warm + n, log_dir=box[0], profile_steps=f"{warm}:{warm + n}",
                                   verify=False, measure_costs=False, fault_nan_mb=None, fault_exit_rank=None)
        if torchrun:
            worker(ccfg)
            from .grads import barrier
            barrier(None, cfg.timeout_s, "the barrier after the calibration run")
            out = [fit_chunk_costs(read_logs(box[0])) if dist.get_rank() == 0 else None]
            dist.broadcast_object_list(out, src=0)
            measured = out[0]
        else:
            spawn(worker, sched.pp * cfg.dp, (ccfg,), timeout_s=cfg.timeout_s)
            measured = fit_chunk_costs(read_logs(tmp))
    base = cfg.spec if cfg.spec is not None else planning.make_spec(
        pp=sched.pp, microbatches=sched.microbatches, vpp=sched.vpp, mem_limit=cfg.mem_limit)
    measured = dataclasses.replace(measured, overlap=base.costs.overlap)
    spec = dataclasses.replace(base, costs=measured)
    again = planning.plan(cfg.builder, spec)
    if again.witness is not None:
        again = dataclasses.replace(again, witness=None)
    return dataclasses.replace(cfg, schedule=again, spec=spec, planned_costs=measured, measure_costs=False)


def cases_worker(cases: list[dict]) -> list[dict]:
    """Run several configs in ONE process group (tests: process start dominates). Rank 0 returns all."""
    out = []
    for c in cases:
        try:
            res = worker(RunConfig(**c))
        except Exception as e:  # keep ranks in lock-step: every rank raises on the same (deterministic) case
            raise type(e)(f"case {c}: {e}") from e
        out.append(res)
    return out


__all__ = ["RunConfig", "run", "worker", "cases_worker", "prepare", "calibrate", "resolve_schedule", "EXAMPLES"]
