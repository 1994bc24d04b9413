"""The per-job handlers of :class:`~pipeloom.runtime.executor.PipelineExecutor` (F, B/BW, W) and the hand-off of
their messages (what a job takes from its peer or a local chunk, what it gives on).

:class:`JobHandlers` is the executor's dispatch half: each handler runs one job of the rank's list on the
state the step driver (:mod:`.executor`) sets up (``_inp``, ``_out``, ``_stash``, ``_local``, ``_outbox``) and
raises :class:`ScheduleRuntimeError` naming the job and the rank when the list asks for something it cannot do.
The per-(microbatch, chunk) arithmetic of each kind is described in :mod:`.executor`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..core.ir import Job, Kind
from .commplan import Msg


class ScheduleRuntimeError(RuntimeError):
    """The executor met a job it cannot run (unknown kind, missing input, wrong rank)."""


class JobHandlers:
    """The handlers of the executor's dispatch table (``Kind -> handler``) and their message hand-off; mixed into
    :class:`~pipeloom.runtime.executor.PipelineExecutor`, which holds the modules, parameters and transport."""

    # ------------------------------------------------------------------ handlers
    def _run_f(self, job: Job) -> None:
        m, k = job.mb, job.chunk
        if k == 0:
            x = self._inputs[m].to(self.device, non_blocking=True)
            if self._in_meta.get(0) and x.shape != self._in_meta[0][0]:
                raise ValueError(f"microbatch {m} input has shape {tuple(x.shape)}, but the pipeline negotiated "
                                 f"{tuple(self._in_meta[0][0])} on its first step; all microbatches need one shape")
        else:
            x = self._take(Msg("act", m, k - 1), job).detach()
            if x.is_floating_point():
                x.requires_grad_(True)
        if (m, k) in self._defer:
            with self._splitgrad[k].deferring(self._stash.setdefault((m, k), [])):
                y = self.modules[k](x)
        else:
            y = self.modules[k](x)
        if k == self.nc - 1:
            loss = self.loss_fn(y, self._targets[m].to(self.device, non_blocking=True))
            self._losses[m] = loss.detach().float()
            y = loss / self.sched.microbatches
        else:
            meta = self._meta[k]
            if y.shape != meta[0] or y.dtype != meta[1]:
                raise ValueError(f"chunk {k} output for microbatch {m} is {tuple(y.shape)} {y.dtype}, but the "
                                 f"pipeline negotiated {tuple(meta[0])} {meta[1]}")
            self._give(Msg("act", m, k), y.detach(), job)
        self._inp[(m, k)] = x
        self._out[(m, k)] = y

    def _run_b(self, job: Job) -> None:
        """B (input grads + non-deferred parameter grads) and BW (everything) share this code:
        what differs is whether F ran with deferred linears (a BW of a tensor-parallel chunk also defers:
        its stash is computed right after the backward, see runtime/tp_overlap.py)."""
        m, k = job.mb, job.chunk
        if job.kind is Kind.B and (m, k) not in self._split:
            raise ScheduleRuntimeError(f"job {job} has no matching W on this rank")
        try:
            y = self._out.pop((m, k))
            x = self._inp.pop((m, k))
        except KeyError:
            raise ScheduleRuntimeError(f"rank {dist.get_rank()}: job {job} runs before F{m}.{k}") from None
        dy = None if k == self.nc - 1 else self._take(Msg("grad", m, k + 1), job)
        want_dx = k > 0 and x.requires_grad
        split = (m, k) in self._defer
        params = self._b_params[k] if split else self.params[k]
        wrt = ([x] if want_dx else []) + params
        with self.tp.backward(self._job_i, job, self._stash, self._out, self.grads.views.get):
            grads = self._backward(k, y, dy, x, wrt, params, split, want_dx)
        del y, dy
        if job.kind is Kind.BW and split:  # a deferring BW: its weight gradients now
            self.tp.weight_grads(self._stash.pop((m, k)), self.grads.views.get)
        if k > 0:
            dx = grads[0] if want_dx and grads[0] is not None else torch.zeros_like(x)
            self._give(Msg("grad", m, k), dx, job)

    def _backward(self, k: int, y, dy, x, wrt: list, params: list, split: bool, want_dx: bool) -> list:
        if split and not wrt and y.requires_grad:
            # nothing but deferred weights to differentiate: still run the backward so that the
            # stash hooks see every dy (the weight grads it computes here are dropped; W adds them)
            deferred = [p for p in self.params[k] if p.requires_grad]
            if deferred:
                torch.autograd.grad(y, deferred, grad_outputs=dy, allow_unused=True)
            return []
        if wrt and y.requires_grad and self._direct:
            # parameter grads accumulate into their .grad (views of the step buffer) by autograd.
            # BW: every leaf of the chunk's graph wants its grad, so no ``inputs=`` (naming them
            # costs the engine a graph walk, ~0.3 ms a call at the benchmark's size); B names the
            # chunk input and the non-deferred parameters, so the linears' weight products are pruned
            if split:
                torch.autograd.backward(y, grad_tensors=dy, inputs=wrt)
            else:
                torch.autograd.backward(y, grad_tensors=dy)
            grads = [x.grad] if want_dx else []
            x.grad = None
            return grads
        if wrt and y.requires_grad:
            grads = torch.autograd.grad(y, wrt, grad_outputs=dy, allow_unused=True)
            for p, g in zip(params, grads[1 if want_dx else 0:]):
                if g is not None:
                    self.grads[p].add_(g)
            return list(grads)
        return [None] * len(wrt)

    @torch.no_grad()
    def _run_w(self, job: Job) -> None:
        m, k = job.mb, job.chunk
        stash = self._stash.pop((m, k), None)
        if stash is None:
            raise ScheduleRuntimeError(f"rank {dist.get_rank()}: job {job} has nothing to do: F{m}.{k} ran "
                                       "without deferral or B has not run")
        self.tp.weight_grads(stash, self.grads.views.get)  # TP: re-gathers sequence-parallel inputs first

    # ------------------------------------------------------------------ messages
    def _receive(self, job: Job) -> None:
        n = self._needs[job]
        if n is not None and n[1] != self.me:
            self._local[n[0]] = self.p2p.recv(n[0], str(job))

    def _give(self, msg: Msg, t: torch.Tensor, job: Job) -> None:
        dst = self._makes[job][1]
        if dst == self.me:
            self._local[msg] = t
        else:
            self._outbox.append((msg, t))

    def _take(self, msg: Msg, job: Job) -> torch.Tensor:
        t = self._local.pop(msg, None)  # a local hand-off, or received by _receive before the job
        if t is None:
            raise ScheduleRuntimeError(f"rank {dist.get_rank()}: job {job} needs {msg}, not produced yet")
        return t

    def _shape_of(self, msg: Msg) -> tuple[torch.Size, torch.dtype]:
        # act(m,k) arrives as the input of chunk k+1; grad(m,k) is the grad of chunk k-1's output
        return self._in_meta[msg.chunk + 1] if msg.kind == "act" else self._meta[msg.chunk - 1]
