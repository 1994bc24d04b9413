"""Execute a pipeloom :class:`~pipeloom.core.ir.Schedule` on torch.distributed.

One :class:`PipelineExecutor` per rank holds the chunk modules of its pipeline stage and runs its
job list with a dispatch table ``Kind -> handler`` (F, B, W, BW): this module is the step driver (set-up,
the job loop, losses and gradients), the handlers and their message hand-off are in :mod:`.handlers`.
Per (microbatch m, chunk k):

    F(m,k)   x = input (tokens for chunk 0, else the activation from chunk k-1, received or local);
             y = module_k(x); the last chunk also computes loss_m = loss_fn(y, target_m).
             If the schedule splits this pair's backward (B and W jobs) every nn.Linear runs as a
             *deferred* linear (:mod:`pipeloom.autograd.splitgrad`): B computes only its input grad, (x, dy) wait in a stash.
    B(m,k)   autograd.grad of y (or loss_m / M) w.r.t. the chunk input and its parameters, with the
             incoming output grad; deferred linears contribute only dx, other parameters (norms,
             embeddings) get their grads here. The graph is freed; the input grad goes to chunk k-1.
    W(m,k)   for each stashed (x, dy): dW += dy^T x, db += sum(dy)   (the weight grads of B, later);
             the stash is freed.
    BW(m,k)  = B with nothing deferred: input and all weight grads in one pass (on a tensor-parallel
             chunk: F defers, then B and W at once, so every --tp-overlap mode shares W's arithmetic).

Gradients accumulate in one flat fp32 buffer per rank (:class:`~.grads.GradBuffer`; so bf16
parameters get fp32 "master" grads: products are computed from upcast operands and summed in
fp32, never rounded to bf16 in between), are made to agree over the data-parallel group by a
:class:`~.grads.GradReducer` (default: all-reduced ONCE after the last microbatch, reduce after
accumulation, not once per microbatch; the reducer is told when each chunk's last W/BW has run), and are
then installed as ``.grad`` of the parameters (fp32)
or of the fp32 master copies (bf16), ready for any torch optimizer. With fp32 parameters the
``.grad`` of every parameter IS its view of the buffer during the step, so autograd's AccumulateGrad
adds each gradient as soon as the backward computes it (no second pass over cold gradients).

The loss of the step is the mean of the microbatch losses (each backward is scaled by 1/M), so
the gradients equal those of one full-batch step of the same model.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..core.ir import Job, Kind, Schedule
from ..schedule.validate import summary, validate
from .commplan import Msg, build_comm_plan, needed, produced
from .handlers import JobHandlers, ScheduleRuntimeError
from ..trace.writer import JobLog
from .p2p import P2P, PeerError
from .grads import GradBuffer, GradReducer, barrier, make_reducer
from ..autograd.splitgrad import SplitGrad
from .timing import StepStats, _After, _Timer
from .tp_overlap import TPOverlap
from .reference import reference_step
from ..models.tp_comm import comm_stats


class NonFiniteLossError(RuntimeError):
    """A microbatch produced a NaN or infinite loss."""


# ------------------------------------------------------------------------ executor
class PipelineExecutor(JobHandlers):
    """Runs this rank's part of ``schedule``.

    Args:
        schedule: a valid schedule (checked with :func:`pipeloom.schedule.validate.validate`).
        modules: global chunk id -> module, for exactly the chunks ``schedule`` puts on ``pp_rank``.
        loss_fn: ``loss_fn(output_of_last_chunk, target) -> scalar``.
        pp_rank: this rank's pipeline stage (device index in the schedule).
        pp_ranks: global rank of every pipeline stage of this rank's pipeline (len pp).
        dp_group: process group of the data-parallel replicas of this stage (None: no DP).
        device: where the modules live (default: the first parameter's device).
        param_dtype: cast parameters to this dtype (e.g. torch.bfloat16) and keep fp32 master
            copies; use :meth:`parameters` for the optimizer and :meth:`sync_params` after it steps.
            (A :class:`~pipeloom.runtime.zero1.Zero1Optimizer` takes the master copies over: it keeps
            this rank's shards of them and empties ``master``, and writes the bf16 parameters itself.)
        timeout_s: longest wait for a peer before failing with the job and rank named.
        inject_delay_s: sleep this long inside every job (straggler testing).
        log: a :class:`JobLog` (per-rank job timings in the shared format) or None.
        strict_p2p: one op order per link for both directions (default: True on NCCL, where P2P
            pairs in issue order; False on gloo, where receives may be posted further ahead).
        recv_lookahead: receives posted ahead per peer in relaxed mode.
        reducer: how the data-parallel replicas' gradients are made to agree: a name from
            :data:`pipeloom.runtime.grads.REDUCERS` (``"allreduce"``: one all-reduce after
            accumulation) or any :class:`~pipeloom.runtime.grads.GradReducer`.
        on_job: observe or wrap every job: called as ``on_job(job, run)`` instead of the job's
            handler, where ``run(job)`` runs the handler (time it, log it, or, in fault tests, do
            not call it). Also settable later as the ``on_job`` attribute.
        loss_replicas: how many ranks of the last stage compute the same losses (its tensor-parallel
            ranks; 1 without TP): the world all-reduce of the losses is divided by ``dp * loss_replicas``.
        tp_overlap: what the tensor-parallel column-parallel GEMMs overlap with their input gradient's
            collective: ``off | async | chunked:K | fill`` (:mod:`pipeloom.runtime.tp_overlap`).
        pre_reduce: called with a chunk id after the chunk's last W/BW on this rank, before the reducer is told
            (the tensor-parallel sum of replicated parameters' partial gradients: before any DP reduction, so
            that ZeRO-1's shards get whole gradients).
    """

    def __init__(self, schedule: Schedule, modules: dict[int, nn.Module], loss_fn: Callable, *, pp_rank: int,
                 pp_ranks: Sequence[int], dp_group=None, device: torch.device | str | None = None,
                 param_dtype: torch.dtype | None = None, timeout_s: float = 300.0, inject_delay_s: float = 0.0,
                 log: JobLog | None = None, check: bool = True, strict_p2p: bool | None = None,
                 recv_lookahead: int = 4, reducer: str | GradReducer = "allreduce",
                 on_job: Callable[[Job, Callable[[Job], None]], None] | None = None,
                 loss_replicas: int = 1, tp_overlap: str = "off",
                 pre_reduce: Callable[[int], None] | None = None) -> None:
        if check:
            v = validate(schedule)
            if v:
                raise ValueError(f"schedule {schedule.name!r} is invalid: {summary(v)}")
        if not 0 <= pp_rank < schedule.pp:
            raise ValueError(f"pp_rank {pp_rank} out of range for pp={schedule.pp}")
        if len(pp_ranks) != schedule.pp:
            raise ValueError(f"pp_ranks lists {len(pp_ranks)} ranks; the schedule has pp={schedule.pp}")
        mine = schedule.chunks_of(pp_rank)
        if sorted(modules) != mine:
            raise ValueError(f"pp stage {pp_rank} holds chunks {mine} under {schedule.placement.value} placement; "
                             f"got modules for chunks {sorted(modules)}")
        self.sched = schedule
        self.me = pp_rank
        self.pp_ranks = list(pp_ranks)
        self.nc = schedule.num_chunks
        self.modules = {k: modules[k] for k in mine}
        self.loss_fn = loss_fn
        self.dp_group = dp_group
        self.dp = dist.get_world_size(dp_group) if dp_group is not None else 1
        #: ranks of the last stage that compute the same microbatch losses (tensor-parallel ranks): the world
        #: all-reduce of the losses counts each one that many times
        self.loss_replicas = int(loss_replicas)
        first = next((p for m in self.modules.values() for p in m.parameters()), None)
        self.device = torch.device(device) if device is not None else (first.device if first is not None else torch.device("cpu"))
        self.timeout_s = float(timeout_s)
        self.delay = float(inject_delay_s)
        self.log = log
        self.jobs = schedule.devices[pp_rank]
        split = {(j.mb, j.chunk) for j in self.jobs if j.kind is Kind.W}
        # per job, once: the message it receives and the one it produces, with the other device
        self._needs = {j: needed(j, schedule) for j in self.jobs}
        self._makes = {j: produced(j, schedule) for j in self.jobs}
        self._split = split
        # tensor-parallel chunks: every pair defers (a BW computes its stash at once), so that every overlap
        # mode computes the weight gradients with the same arithmetic (runtime/tp_overlap.py)
        self.tp = TPOverlap(self.jobs, self.modules, tp_overlap)
        self._defer = split | self.tp.defer_bw
        self._job_i = -1
        self._handlers: dict[Kind, Callable[[Job], None]] = {
            Kind.F: self._run_f, Kind.B: self._run_b, Kind.W: self._run_w, Kind.BW: self._run_b,
        }
        self.on_job = on_job
        self.pre_reduce = pre_reduce
        # deferred linears (autograd/splitgrad.py): forward hooks on the nn.Linear instances of the chunks that
        # some W job of this rank splits (the other chunks' modules run exactly as given)
        self._splitgrad: dict[int, SplitGrad] = {k: SplitGrad(m) for k, m in self.modules.items()
                                                 if any(c == k for _, c in self._defer)}
        # parameters, master copies, flat fp32 grad buffer
        self.params: dict[int, list[nn.Parameter]] = {k: [p for p in m.parameters() if p.requires_grad]
                                                      for k, m in self.modules.items()}
        # B of a split pair differentiates only w.r.t. the parameters that are not deferred to W
        self._b_params: dict[int, list[nn.Parameter]] = {
            k: (self._splitgrad[k].kept(ps) if k in self._splitgrad else ps) for k, ps in self.params.items()}
        allp = list(dict.fromkeys(p for k in mine for p in self.params[k]))  # once each, even if shared
        self.param_dtype = param_dtype
        self.master: dict[nn.Parameter, torch.Tensor] = {}
        if param_dtype is not None:
            for p in allp:
                mp = nn.Parameter(p.detach().to(torch.float32).clone())
                self.master[p] = mp
            with torch.no_grad():
                for m in self.modules.values():
                    m.to(dtype=param_dtype)
            # nn.Module.to keeps Parameter identity, so self.params stays valid
        self._allp = allp
        # fp32 parameters: autograd's own AccumulateGrad adds each gradient into the step's flat
        # buffer (the parameters' .grad are views of it during a step) while the gradient is
        # still hot in cache, as torch does; bf16 parameters get fp32 master grads added by hand
        self._direct = not self.master and all(p.dtype == torch.float32 for p in allp)
        self.grads = GradBuffer(allp, self.params, self.device)
        self.reducer = make_reducer(reducer, dp_group)
        # after the last W/BW of a chunk on this rank: tell the reducer (job index -> chunk)
        last_wgrad = {j.chunk: i for i, j in enumerate(self.jobs) if j.kind in (Kind.W, Kind.BW)}
        self._chunk_done_after = {i: k for k, i in last_wgrad.items()}
        # communication
        plan = build_comm_plan(schedule)
        self.p2p = P2P(plan.ops(pp_rank), self.pp_ranks, pp_rank, device=self.device, timeout_s=timeout_s,
                       strict=strict_p2p, recv_lookahead=recv_lookahead)
        self.p2p.shape_of = self._shape_of
        self._meta: dict[int, tuple[torch.Size, torch.dtype]] = {}  # chunk -> output shape/dtype
        self._in_meta: dict[int, tuple[torch.Size, torch.dtype]] = {}  # chunk -> input shape/dtype
        self._timer = _Timer(self.device)
        # gloo: reduce the losses asynchronously as soon as this rank has computed all of its own
        # (right after its last loss-producing F; at once on ranks without the last chunk), so the
        # step's end does not wait for a collective. NCCL: one blocking all-reduce at the end, as
        # collectives and P2P share communicators there.
        self._early_loss = dist.get_backend() == "gloo"
        last = [i for i, j in enumerate(self.jobs) if j.kind is Kind.F and j.chunk == self.nc - 1]
        self._loss_after = last[-1] if last else -1
        self.step_count = 0
        self.current_job: Job | None = None  # the job being run (for loss hooks and error messages)
        self.last_stats: StepStats | None = None

    # ------------------------------------------------------------------ public
    def parameters(self) -> list[nn.Parameter]:
        """What to give the optimizer: the module parameters (fp32) or their fp32 master copies."""
        ps = list(dict.fromkeys(p for k in sorted(self.params) for p in self.params[k]))
        return [self.master[p] for p in ps] if self.master else ps

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        out = []
        for k in sorted(self.modules):
            for name, p in self.modules[k].named_parameters():
                if p.requires_grad:
                    out.append((name, self.master.get(p, p)))
        return out

    @torch.no_grad()
    def sync_params(self) -> None:
        """After ``optimizer.step()`` on the master copies: round them into the bf16 parameters."""
        for p, mp in self.master.items():
            p.copy_(mp.to(p.dtype))

    @property
    def handlers(self) -> dict[Kind, Callable[[Job], None]]:
        """The dispatch table (a copy): job kind -> the handler that runs it."""
        return dict(self._handlers)

    def close(self) -> None:
        """Remove the split-backward hooks from the modules (they run as given again)."""
        for sg in self._splitgrad.values():
            sg.close()
        self._splitgrad.clear()

    def step(self, inputs: Sequence[torch.Tensor] | torch.Tensor | None = None,
             targets: Sequence[torch.Tensor] | torch.Tensor | None = None) -> float:
        """Run one schedule (all microbatches); return the mean loss; leave grads on the parameters.

        ``inputs``: the M microbatch inputs (a list, or one tensor split along dim 0); needed on
        the rank holding chunk 0. ``targets`` likewise on the rank holding the last chunk.
        """
        M = self.sched.microbatches
        step = self.step_count
        self._inputs = self._split_mb(inputs, M, "inputs") if 0 in self.modules else None
        self._targets = self._split_mb(targets, M, "targets") if (self.nc - 1) in self.modules else None
        if not self._meta and not self._in_meta:
            self._negotiate_shapes()
        profiled = self.log is not None and self.log.profiled(step)
        if profiled:
            barrier(None, self.timeout_s, f"step {step}: the barrier before a logged step")
            self.log.begin_step(step)
        self._inp: dict[tuple[int, int], torch.Tensor] = {}
        self._out: dict[tuple[int, int], torch.Tensor] = {}
        self._local: dict[Msg, torch.Tensor] = {}
        self._stash: dict[tuple[int, int], list] = {}
        self._outbox: list[tuple[Msg, torch.Tensor]] = []
        self._losses = torch.zeros(M, dtype=torch.float32, device=self.device)
        self.grads.reset()
        self.reducer.start(self.grads)
        self.p2p.reset()
        user_grads = self.grads.lend() if self._direct else None
        records: list[tuple[Job, float, float, float, float]] = []
        t0 = time.perf_counter()
        cpu_log = profiled and not self._timer.cuda  # ready/done are host times: CPU devices only
        try:
            compute = self._run_jobs(profiled, cpu_log, records)
            self.p2p.finish(step)
            self._timer.resolve()
            if self._inp or self._out or self._stash or self._local:
                left = list(self._inp) + list(self._out) + list(self._stash)
                raise ScheduleRuntimeError(f"rank {dist.get_rank()}: step {step} left unfinished work for (mb, chunk) "
                                           f"{left[:4]}")
            # losses: every rank learns them (sum over the world of the last stages' values / dp)
            if self._loss_work is not None:
                self.p2p._wait(self._loss_work, f"step {step}: all-reduce of the microbatch losses")
            else:
                dist.all_reduce(self._losses)
            losses = (self._losses / (self.dp * self.loss_replicas)).tolist()
            bad = [m for m, v in enumerate(losses) if v != v or v in (float("inf"), float("-inf"))]
            if bad:
                raise NonFiniteLossError(f"step {step}: loss is {losses[bad[0]]} at microbatch {bad[0]}"
                                         + (f" (and {len(bad) - 1} more microbatches)" if len(bad) > 1 else ""))
            # gradients: the reducer completes its work (default: one all-reduce), then install
            self.reducer.finish()
        finally:
            if user_grads is not None:  # the step's grads are in the buffer: the user's come back as they were
                self.grads.restore(user_grads)
        self.grads.install(self.master)
        loss = sum(losses) / M
        if self.log is not None:
            tp_wait = self._tp_wait or {}
            for i, (j, s, e, *rd) in enumerate(records):
                self.log.job(step, j.kind.value, j.mb, j.chunk, self.me, s, e,
                             ready=rd[0] if len(rd) == 2 else None, done=rd[1] if len(rd) == 2 else None,
                             tp_comm=tp_wait.get(i))
            self.log.end_step(step, loss)
        self.last_stats = StepStats(step, loss, losses, time.perf_counter() - t0, self.p2p.wait_s, compute)
        self.step_count += 1
        return loss

    def _run_jobs(self, profiled: bool, cpu_log: bool, records: list) -> float:
        """Run this rank's job list in order; return the time spent in the handlers."""
        compute = 0.0
        self._loss_work = None
        if self._early_loss and self._loss_after < 0:
            self._loss_work = dist.all_reduce(self._losses, async_op=True)
        self.p2p.advance(where=f"step {self.step_count}, before the first job")  # post the first receives
        handlers, on_job, chunk_done = self._handlers, self.on_job, self._chunk_done_after
        tp_log = self._tp_wait = {} if profiled and self.tp.tp else None
        stats = comm_stats()
        for i, job in enumerate(self.jobs):
            handler = handlers.get(job.kind)
            if handler is None:
                raise ScheduleRuntimeError(f"rank {dist.get_rank()}: no handler for job {job} (kind {job.kind!r}); "
                                           f"known kinds: {', '.join(str(k) for k in handlers)}")
            self.current_job, self._job_i = job, i
            # Job boundaries (docs/bench/runtime.md): the job is READY when its network input is in
            # hand (the blocking wait for a peer ends here: that wait is bubble, not the job's time);
            # it is DONE when its outputs are handed to the transport and the receives they unblock
            # are posted. start/end bracket the compute inside [ready, done].
            self._receive(job)
            ready = time.time() if cpu_log else 0.0
            ts = self._timer.start()
            c0 = time.perf_counter()
            w0 = stats.exposed_s
            if self.delay:  # straggler injection: the job's outputs come late by this much
                time.sleep(self.delay)
            if on_job is None:
                handler(job)
            else:
                on_job(job, handler)
            compute += time.perf_counter() - c0
            if tp_log is not None:
                tp_log[i] = stats.exposed_s - w0
            if i in chunk_done:
                if self.pre_reduce is not None:
                    self.pre_reduce(chunk_done[i])
                self.reducer.chunk_done(chunk_done[i])
            if profiled:
                self._timer.stop(ts, lambda s, e, j=job, r=ready: records.append((j, s, e, r)))
            if self._outbox:
                for msg, t in self._outbox:
                    self.p2p.send(msg, t, post=False)
                self._outbox.clear()
            # this job's sends and every receive the link order now allows: one call
            self.p2p.advance(where=_After(self.step_count, job))
            self.p2p.poll_sends()
            if i == self._loss_after and self._early_loss:
                self._loss_work = dist.all_reduce(self._losses, async_op=True)
            if cpu_log:
                records[-1] = records[-1] + (time.time(),)
        return compute

    @torch.no_grad()
    def _negotiate_shapes(self) -> None:
        """Once: walk the chunks in order, run each on zeros of its input shape, pass shapes on.

        Starts with a barrier so that the first collective involves every rank (NCCL requires
        that before batched P2P)."""
        barrier(None, max(self.timeout_s, self.p2p.setup_timeout_s), "the barrier before shape negotiation")
        for k in sorted(self.modules):
            if k == 0:
                x = self._inputs[0].to(self.device)
            else:
                src = self.sched.device_of(k - 1)
                if src == self.me:
                    shape, dtype = self._meta[k - 1]
                else:
                    shape, dtype = self.p2p.recv_header(src, f"chunk {k}")
                x = torch.zeros(shape, dtype=dtype, device=self.device)
            self._in_meta[k] = (x.shape, x.dtype)
            if k == self.nc - 1:
                continue
            y = self.modules[k](x)
            if not isinstance(y, torch.Tensor):
                raise TypeError(f"chunk {k} returned {type(y).__name__}; pipeline chunks must return one tensor")
            self._meta[k] = (y.shape, y.dtype)
            dst = self.sched.device_of(k + 1)
            if dst != self.me:
                self.p2p.send_header(dst, y.shape, y.dtype)

    @staticmethod
    def _split_mb(x, M: int, what: str) -> list[torch.Tensor]:
        if x is None:
            raise ValueError(f"this rank needs {what} (a list of {M} microbatches or one tensor to split)")
        if isinstance(x, torch.Tensor):
            if x.shape[0] % M:
                raise ValueError(f"{what} batch of {x.shape[0]} rows does not split into {M} equal microbatches")
            return list(x.chunk(M))
        x = list(x)
        if len(x) != M:
            raise ValueError(f"{what} has {len(x)} microbatches; the schedule has {M}")
        return x


__all__ = ["PipelineExecutor", "NonFiniteLossError", "ScheduleRuntimeError", "PeerError", "StepStats", "reference_step"]
