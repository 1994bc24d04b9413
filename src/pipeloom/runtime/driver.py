"""The run's orchestration: spawn or join the ranks, build each rank's chunks, run the steps, gather the result.

:func:`run` is what ``pipeloom run`` calls: it spawns ``pp*dp*tp`` ranks on 127.0.0.1 (gloo) or, under
torchrun, runs this rank. Every rank builds only its chunks (the weights are deterministic, see
:mod:`pipeloom.models.llama`), runs ``steps`` optimizer steps and, with ``verify``, compares the first
step (:mod:`.verify`). What a run is (:class:`RunConfig`, :func:`prepare`) lives in :mod:`.config`.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import time
import traceback
import uuid

import torch
import torch.distributed as dist

from ..core.ir import Schedule
from ..schedule import io as schedule_io
from ..schedule import planning
from ..trace.writer import JobLog, parse_profile_steps
from .config import EXAMPLES, RunConfig, _check_shape, _split, model_config, prepare, resolve_schedule
from .executor import PipelineExecutor
from .launch import RankFailure, default_device, init_process_group, one_line, spawn, under_torchrun
from .tp_run import grad_digest, tp_counts, tp_exposed, tp_groups
from .verify import _gather_params, _named_fp32, _verify, _verify_params


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
    pp, dp, tp = sched.pp, cfg.dp, cfg.tp
    tp_group = None
    if tp > 1:
        pp_ranks, dp_group, tp_group, pp_rank, dp_rank, tp_rank = tp_groups(pp, dp, tp, cfg.timeout_s)
    else:
        pp_ranks, dp_group, pp_rank, dp_rank = _groups(pp, dp, cfg.timeout_s, cfg.rank_order)
    rank = dist.get_rank()
    device = default_device()
    mcfg = model_config(cfg, sched.num_chunks)
    split = _split(cfg, mcfg, sched.num_chunks)
    mine = sched.chunks_of(pp_rank)
    tied = None
    if cfg.model is not None and tp_group is not None:  # a transformers model's chunks, sharded (untied: no ties)
        mods = cfg.model.tp_chunks(split, mine, cfg.seed, tp_group, device)
    elif cfg.model is not None:
        from .tied import TiedGrads
        mods, ties = cfg.model.chunks(split, mine, cfg.seed, device)
        mesh = _MESHES[(dp, pp, cfg.rank_order)].mesh.tolist()  # global ranks as [dp][pp], whatever the order
        grid = mesh if cfg.rank_order == "dp-pp" else [list(r) for r in zip(*mesh)]
        tied = TiedGrads(ties, sched.device_of, grid, dict(zip(mine, mods)), pp_rank=pp_rank, dp_rank=dp_rank)
        if tied.cross and cfg.zero:
            raise ValueError("--zero 1 with weights tied across stages (here the embedding and the head) is not "
                             "supported: ZeRO-1 keeps the reduced gradients in shards; use --zero 0")
    elif tp_group is not None:
        from ..models.tp import build_tp_chunk_modules
        from ..models.tp_comm import set_link, set_regather
        set_link(cfg.tp_link_delay_ms / 1e3, jitter_seed=cfg.seed * 7919 + rank if cfg.tp_link_jitter else None,
                 timeout_s=cfg.timeout_s)
        set_regather(not cfg.keep_gathered_input)
        mods = build_tp_chunk_modules(mcfg, split, cfg.seed, group=tp_group, chunks=mine, device=device,
                                      sequence_parallel=cfg.sequence_parallel)
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
    pre_reduce = None
    if tp_group is not None:  # the loss from this rank's vocabulary slice of the logits (never gathered)
        import functools

        from ..models.tp import reduce_replicated_grads, vocab_parallel_loss
        loss_fn = functools.partial(vocab_parallel_loss, group=tp_group)
        by_chunk = dict(zip(mine, mods))

        def pre_reduce(k: int) -> None:
            # partial gradients (replicated key/value heads, SP norms) summed over the TP ranks once per step, after
            # the chunk's last W/BW and before its DP reduction (ZeRO-1 then shards whole gradients)
            reduce_replicated_grads(by_chunk[k].parameters(), tp_group, grad_of=ex.grads.views.get)
    ex = PipelineExecutor(sched, dict(zip(mine, mods)), loss_fn, pp_rank=pp_rank, pp_ranks=pp_ranks,
                          dp_group=dp_group, device=device, timeout_s=cfg.timeout_s, inject_delay_s=delay,
                          log=log, param_dtype=torch.bfloat16 if cfg.dtype == "bf16" else None, check=False,
                          strict_p2p=cfg.strict_p2p, reducer=reducer, loss_replicas=tp, tp_overlap=cfg.tp_overlap,
                          pre_reduce=pre_reduce)
    if cfg.fault_nan_mb is not None:
        def poisoned(out, target, _lf=ex.loss_fn):
            loss = _lf(out, target)
            return loss * float("nan") if ex.step_count == 0 and ex.current_job.mb == cfg.fault_nan_mb else loss
        ex.loss_fn = poisoned
    if cfg.fault_exit_rank == rank:
        def dead(job, run):
            os._exit(3)  # a crash without any report, like a killed process
        ex.on_job = dead
    if cfg.fault_hang_rank == rank and tp_group is not None:  # stops for good in its first backward
        def hang(job, run):
            if job.kind.value in ("B", "BW"):
                time.sleep(3600)
            run(job)
        ex.on_job = hang
    elif cfg.fault_hang_rank == rank:
        _hang_before_reduction(ex)
    _bound_world_waits(cfg.timeout_s)
    opt = make_optimizer(cfg, ex)
    c0 = tp_counts()
    losses, times, waits, tp_waits = [], [], [], []
    verify = params = None
    tied_diff = tp_diff = 0.0
    try:
        for step in range(cfg.steps):
            x, y = _batch(mcfg, cfg, sched, step, dp_rank)
            t0, w0 = time.perf_counter(), tp_exposed()
            loss = ex.step(x, y)
            times.append(time.perf_counter() - t0)
            tp_waits.append(tp_exposed() - w0)
            waits.append(ex.last_stats.wait_s)
            losses.append(loss)
            if tied:  # the one point between the step's gradients and the optimizer: sum the tied copies
                tied.reduce(lambda p: ex.master.get(p, p).grad)
            if cfg.return_params and step == 0:  # testing: the step's exact gradients, for bitwise comparisons
                digest = grad_digest(ex)
            if cfg.verify and step == 0:
                xs, ys = [], []  # the global batch of the first step: every replica's microbatches
                for r in range(cfg.dp):
                    x0, y0 = _batch(mcfg, cfg, sched, 0, r)
                    xs += x0
                    ys += y0
                verify, ref = _verify(ex, cfg, mcfg, loss, build_reference, xs, ys, tp_group=tp_group)
            opt.step()
            opt.zero_grad(set_to_none=True)
            ex.sync_params()
            if tied:
                tied_diff = max(tied_diff, tied.max_weight_diff())
            if tp_group is not None:  # replicated parameters must stay equal on the TP ranks after every step
                from ..models.tp import replica_diff
                tp_diff = max(tp_diff, *(replica_diff(m, tp_group) for m in mods))
            if step == 0:
                # the fp32 values once (with bf16 + ZeRO-1 an all-gather of the master shards)
                named = (_named_fp32(ex, opt, tp_group=tp_group) if cfg.verify or cfg.return_params else None)
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
    dist.all_gather_object(ranks, dict(rank=rank, pp_rank=pp_rank, dp_rank=dp_rank, **static,
                                       **({"grad_digest": digest} if cfg.return_params else {}),
                                       **(tp_counts(c0) if tp_group is not None else {})))
    ts = t.tolist()
    timed = ts[1:] if len(ts) > 1 else ts
    out = {"schedule": sched.name, "pp": pp, "vpp": sched.vpp, "dp": dp, "tp": tp, "sequence_parallel": cfg.sequence_parallel, "microbatches": sched.microbatches,
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
    if tp_group is not None:
        d = torch.tensor([tp_diff, statistics.median(tp_waits[1:] if len(tp_waits) > 1 else tp_waits)],
                         dtype=torch.float64)
        dist.all_reduce(d, op=dist.ReduceOp.MAX)
        out["tp_replica_param_diff"] = d[0].item()
        out["tp_overlap"], out["tp_link_delay_ms"] = cfg.tp_overlap, cfg.tp_link_delay_ms
        out["keep_gathered_input"] = cfg.keep_gathered_input
        out["tp_comm_wait_s"] = d[1].item()  # per step (median), the slowest rank: TP collectives not hidden
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
    from ..autograd.splitgrad import deferred_share
    mine = {}
    if dp_rank == 0:
        g = torch.Generator().manual_seed(cfg.seed)
        for k in sorted({c for _, c in ex._split}):  # chunks with W jobs (a TP chunk defers also for BW)
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
    from .grads import ZeroReduceScatter
    from .zero1 import Zero1Optimizer
    if isinstance(ex.reducer, ZeroReduceScatter):
        return Zero1Optimizer(ex.reducer, ex.grads, ex.master, torch.optim.AdamW, timeout_s=cfg.timeout_s, lr=cfg.lr)
    return torch.optim.AdamW(ex.parameters(), lr=cfg.lr)



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
    from .zero1 import Zero1Optimizer
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



def _hang_before_reduction(ex: PipelineExecutor) -> None:
    """Fault testing: this rank stops for good before its first data-parallel reduction."""
    red = ex.reducer
    for name in ("_launch", "finish"):
        if hasattr(red, name):
            def stuck(*a, **k):
                time.sleep(3600)
            setattr(red, name, stuck)
            return



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
    world = sched.pp * cfg.dp * cfg.tp
    if cfg.tp > 1 and cfg.model is not None:  # a model that cannot be split: one line before any process starts
        cfg.model.check_tp(cfg.tp)
    elif cfg.tp > 1:  # a tp that does not divide heads/kv_heads/ffn/vocab: one line before any process starts
        from ..models.tp import check_tp
        check_tp(mcfg, cfg.tp)
    if cfg.inject_delay and not 0 <= cfg.inject_delay[0] < world:
        raise ValueError(f"--inject-delay rank {cfg.inject_delay[0]} out of range: world size is {world}")
    if cfg.measure_costs and cfg.builder is None:
        raise ValueError("measured costs plan a registry schedule again; a given schedule (--plan) has fixed "
                         "jobs: drop measured costs or give --schedule NAME")
    if under_torchrun():
        if int(os.environ["WORLD_SIZE"]) != world:  # before the rendezvous: every rank says it at once
            shape = (f"pp*dp*tp = {sched.pp}*{cfg.dp}*{cfg.tp}" if cfg.tp > 1 else f"pp*dp = {sched.pp}*{cfg.dp}")
            raise ValueError(f"torchrun started {os.environ['WORLD_SIZE']} ranks; {shape} = {world}")
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
    check`` uses; with tp > 1 per TP index, the slowest index's per chunk:
    :func:`pipeloom.trace.tp_costs.fit_tp_chunk_costs`) and plan the registry schedule again with them. Spawned runs calibrate in their own
    ranks and plan in this process; under torchrun rank 0 fits (the log directory must be visible to it:
    one machine) and every rank plans the same deterministic schedule from the broadcast costs."""
    import tempfile
    from ..trace.reader import read_logs
    from ..trace.tp_costs import fit_tp_chunk_costs

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
            out = [fit_tp_chunk_costs(read_logs(box[0]), cfg.tp) if dist.get_rank() == 0 else None]
            dist.broadcast_object_list(out, src=0)
            measured = out[0]
        else:
            spawn(worker, sched.pp * cfg.dp * cfg.tp, (ccfg,), timeout_s=cfg.timeout_s)
            measured = fit_tp_chunk_costs(read_logs(tmp), cfg.tp)
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


# RunConfig, prepare, resolve_schedule, model_config, EXAMPLES: defined in .config, importable from here as before
__all__ = ["RunConfig", "run", "worker", "cases_worker", "prepare", "calibrate", "resolve_schedule", "model_config",
           "EXAMPLES"]
