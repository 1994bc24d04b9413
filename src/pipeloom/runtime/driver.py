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
from ..core.errors import ScheduleError
from .executor import PipelineExecutor, reference_step
from ..trace.writer import JobLog, parse_profile_steps
from .launch import RankFailure, default_device, init_process_group, one_line, spawn, under_torchrun
from ..schedule import io as schedule_io

EXAMPLES = ("llama-tiny",)


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """One training run of the example model."""

    schedule: str = "1f1b"
    """registry name (ignored when ``plan`` is given)"""
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
    plan: dict | None = None
    """a schedule as Schedule.to_dict() (from --plan FILE) instead of building one"""
    mem_limit: str | None = None
    """memory limit for memory-aware builders (none, 1p, 1.5p, 2p, ...)"""
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

    def __post_init__(self) -> None:
        for name in ("pp", "dp", "microbatches", "steps", "microbatch_size", "seq_len", "dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.dim % 8:  # the example model has 4 heads, and rotary embeddings need an even head size
            raise ValueError(f"--dim {self.dim}: the example model needs a multiple of 8 (4 attention heads of an "
                             f"even size), e.g. {max(8, self.dim // 8 * 8)}")
        if self.dtype not in ("fp32", "bf16"):
            raise ValueError(f"dtype must be fp32 or bf16, got {self.dtype!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout_s}")
        window = parse_profile_steps(self.profile_steps)
        if window and self.log_dir is None:
            raise ValueError(f"--profile-steps {self.profile_steps} needs --log-dir DIR (where the job logs go)")
        if window and window[0] >= self.steps:
            raise ValueError(f"--profile-steps {self.profile_steps} starts after the last step: the run has steps "
                             f"0..{self.steps - 1}, so nothing would be logged")


def resolve_schedule(cfg: RunConfig) -> tuple[Schedule, dict | None]:
    """The schedule to run and the costs it was planned with (for the log)."""
    if cfg.plan is not None:
        sched = schedule_io.from_dict(cfg.plan)
        from ..schedule.validate import summary, validate
        v = validate(sched)
        if v:
            raise ScheduleError(f"plan {sched.name!r} is invalid: {summary(v)}")
        return sched, None
    from ..schedule import registry
    vpp = cfg.vpp if cfg.vpp is not None else registry.default_vpp(cfg.schedule)
    spec = planning.make_spec(pp=cfg.pp, microbatches=cfg.microbatches, vpp=vpp, mem_limit=cfg.mem_limit)
    return planning.plan(cfg.schedule, spec), spec.costs.to_dict()


def model_config(cfg: RunConfig, num_chunks: int):
    from ..models.llama import LlamaConfig
    n_layers = cfg.n_layers if cfg.n_layers is not None else max(8, num_chunks)
    if n_layers < num_chunks:
        raise ValueError(f"{n_layers} layers cannot fill {num_chunks} chunks (pp*vpp); use more layers")
    return LlamaConfig(n_layers=n_layers, dim=cfg.dim, max_seq_len=cfg.seq_len)


def _batch(mcfg, cfg: RunConfig, sched: Schedule, step: int, replica: int):
    from ..models.llama import synthetic_batch
    M = sched.microbatches
    x, y = synthetic_batch(mcfg, M * cfg.microbatch_size, cfg.seq_len, seed=cfg.seed * 1_000_003 + step * 1009 + replica)
    return list(x.chunk(M)), list(y.chunk(M))


_MESHES: dict = {}


def _groups(pp: int, dp: int):
    """(pp global ranks of my pipeline, dp group or None, pp_rank, dp_rank) on a (dp, pp) DeviceMesh."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != pp * dp:
        raise ValueError(f"world size {world} != pp*dp = {pp}*{dp}")
    key = (dp, pp)
    if key not in _MESHES:
        from torch.distributed.device_mesh import init_device_mesh
        dev = default_device()
        _MESHES[key] = init_device_mesh(dev.type, (dp, pp), mesh_dim_names=("dp", "pp"))
    mesh = _MESHES[key]
    pp_ranks = dist.get_process_group_ranks(mesh.get_group("pp"))
    dp_group = mesh.get_group("dp") if dp > 1 else None
    return pp_ranks, dp_group, mesh.get_local_rank("pp"), mesh.get_local_rank("dp")


def worker(cfg: RunConfig) -> dict:
    """Run ``cfg`` on this rank (process group already initialised); rank 0 returns the result."""
    from ..models.llama import build_chunk_modules, build_reference, even_layer_split, loss_fn
    sched, costs = resolve_schedule(cfg)
    pp, dp = sched.pp, cfg.dp
    pp_ranks, dp_group, pp_rank, dp_rank = _groups(pp, dp)
    rank = dist.get_rank()
    device = default_device()
    mcfg = model_config(cfg, sched.num_chunks)
    split = even_layer_split(mcfg.layers, sched.num_chunks)
    mine = sched.chunks_of(pp_rank)
    mods = build_chunk_modules(mcfg, split, cfg.seed, chunks=mine, device=device)
    window = parse_profile_steps(cfg.profile_steps) or ((0, cfg.steps) if cfg.log_dir else None)
    run_id = [uuid.uuid4().hex[:12] if rank == 0 else None]
    if cfg.log_dir:  # every rank has the same cfg, so all of them take part
        dist.broadcast_object_list(run_id, src=0)
    log = JobLog(cfg.log_dir, rank=rank, local_rank=int(os.environ.get("LOCAL_RANK", rank)),
                 world_size=dist.get_world_size(), pp=pp, dp=dp, pp_rank=pp_rank, dp_rank=dp_rank,
                 schedule=schedule_io.to_dict(sched), costs=costs, profile_steps=window,
                 machine=int(os.environ.get("GROUP_RANK", 0)), run_id=run_id[0]) if cfg.log_dir else None
    delay = cfg.inject_delay[1] if cfg.inject_delay and cfg.inject_delay[0] == rank else 0.0
    ex = PipelineExecutor(sched, dict(zip(mine, mods)), loss_fn, pp_rank=pp_rank, pp_ranks=pp_ranks,
                          dp_group=dp_group, device=device, timeout_s=cfg.timeout_s, inject_delay_s=delay,
                          log=log, param_dtype=torch.bfloat16 if cfg.dtype == "bf16" else None, check=False,
                          strict_p2p=cfg.strict_p2p)
    if cfg.fault_nan_mb is not None:
        def poisoned(out, target, _lf=ex.loss_fn):
            loss = _lf(out, target)
            return loss * float("nan") if ex.step_count == 0 and ex.current_job.mb == cfg.fault_nan_mb else loss
        ex.loss_fn = poisoned
    if cfg.fault_exit_rank == rank:
        def dead(job, run):
            os._exit(3)  # a crash without any report, like a killed process
        ex.on_job = dead
    opt = torch.optim.AdamW(ex.parameters(), lr=cfg.lr)
    losses, times, waits = [], [], []
    verify = None
    try:
        for step in range(cfg.steps):
            x, y = _batch(mcfg, cfg, sched, step, dp_rank)
            t0 = time.perf_counter()
            loss = ex.step(x, y)
            times.append(time.perf_counter() - t0)
            waits.append(ex.last_stats.wait_s)
            losses.append(loss)
            if cfg.verify and step == 0:
                verify = _verify(ex, cfg, mcfg, sched, loss, build_reference)
            opt.step()
            opt.zero_grad(set_to_none=True)
            ex.sync_params()
    finally:
        if log is not None:
            log.close(cfg.steps - 1)
    # slowest rank's time per step; skip the first step (shape negotiation, warm-up) when there are more
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    ts = t.tolist()
    timed = ts[1:] if len(ts) > 1 else ts
    out = {"schedule": sched.name, "pp": pp, "vpp": sched.vpp, "dp": dp, "microbatches": sched.microbatches,
           "steps": cfg.steps, "loss": losses[-1], "losses": losses, "step_time_s": statistics.median(timed),
           "dtype": cfg.dtype, "world_size": dist.get_world_size()}
    if verify is not None:
        out.update(verify)
    return out if rank == 0 else None


def _verify(ex: PipelineExecutor, cfg: RunConfig, mcfg, sched: Schedule, loss: float, build_reference) -> dict:
    """Each rank runs the (tiny) reference itself and compares its own chunks; MAX over ranks."""
    from ..models.llama import loss_fn
    ref = build_reference(mcfg, cfg.seed)
    xs, ys = [], []
    for r in range(cfg.dp):
        x, y = _batch(mcfg, cfg, sched, 0, r)
        xs += x
        ys += y
    ref_loss, ref_grads = reference_step(ref, loss_fn, xs, ys)
    gd, missing = 0.0, 0
    for name, p in ex.named_parameters():
        if p.grad is None or name not in ref_grads:
            missing += 1
            continue
        gd = max(gd, (p.grad.detach().float().cpu() - ref_grads[name]).abs().max().item())
    t = torch.tensor([abs(loss - ref_loss), gd, float(missing)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {"max_loss_diff": t[0].item(), "max_grad_diff": t[1].item(), "reference_loss": ref_loss,
            "params_missing_grad": int(t[2].item())}


def run(cfg: RunConfig, *, example: str = "llama-tiny") -> dict:
    """Run the example: in-process under torchrun, else spawn pp*dp local ranks (gloo, 127.0.0.1)."""
    if example not in EXAMPLES:
        raise ValueError(f"unknown example {example!r}; available: {', '.join(EXAMPLES)}")
    sched, _ = resolve_schedule(cfg)  # fail fast on a bad schedule before starting processes
    if cfg.plan is not None:
        cfg = dataclasses.replace(cfg, pp=sched.pp, microbatches=sched.microbatches)
    model_config(cfg, sched.num_chunks)
    world = sched.pp * cfg.dp
    if cfg.inject_delay and not 0 <= cfg.inject_delay[0] < world:
        raise ValueError(f"--inject-delay rank {cfg.inject_delay[0]} out of range: world size is {world}")
    if under_torchrun():
        if int(os.environ["WORLD_SIZE"]) != world:  # before the rendezvous: every rank says it at once
            raise ValueError(f"torchrun started {os.environ['WORLD_SIZE']} ranks; "
                             f"pp*dp = {sched.pp}*{cfg.dp} = {world}")
        init_process_group(max(cfg.timeout_s, 300.0))
        try:
            return worker(cfg)
        except Exception as e:  # as from spawn: one line naming this rank (the CLI prints it, no traceback)
            raise RankFailure(dist.get_rank(), one_line(e), tb=traceback.format_exc()) from e
        finally:
            try:
                dist.destroy_process_group()
            except Exception:
                pass
    return spawn(worker, world, (cfg,), timeout_s=cfg.timeout_s)


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


__all__ = ["RunConfig", "run", "worker", "cases_worker", "resolve_schedule", "EXAMPLES"]
