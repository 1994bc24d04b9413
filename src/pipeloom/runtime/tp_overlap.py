"""The executor's side of the tensor-parallel overlap (``pipeloom run --tp-overlap``; needs torch).

The column-parallel GEMM groups of a TP chunk (:mod:`pipeloom.models.tp_comm`) start their input
gradient's collective and wait for it themselves; :class:`TPOverlap` tells them, per B/BW job, what
to run while it is in flight (``tp_comm.STATE``):

    mode     BW job                a B whose own W is the next job   any other B (the split's B)
    off      blocking              blocking                          blocking
    async    fused: wgrad GEMMs    fused: wgrad GEMMs                blocking (nothing in B is independent)
    chunked  fused                 fused                             dgrad in K token pieces, piece i's
                                                                     collective under piece i+1's GEMMs
    fill     fused                 fused                             queued W work of an earlier microbatch

On a TP chunk every pair runs F with the weight gradients deferred (also a BW: its B differentiates the
chunk input and the non-deferred parameters, then the stash is computed at once), so every mode computes
every weight gradient with the one W arithmetic (:func:`pipeloom.autograd.splitgrad.weight_grads`), in the
same order per parameter: the modes give bitwise equal gradients.

Fill takes W work only where that keeps each parameter's accumulation order: from the earliest W job
after the current one, whose B has run, when it is not the current pair's and no BW of its chunk lies in
between; one GEMM at a time, while the collective is still in flight. The W job later does what is left.
How much fill takes depends on timing, so it takes only GEMMs whose input is local: with sequence parallelism
(and re-gather, the default) a column group's input must be gathered again, a collective every TP rank must
issue at the same point, so fill skips those groups (the row-parallel GEMMs remain) and leaves them to W.

W (and the weight gradients of a BW, and of a fused B) run through :meth:`TPOverlap.weight_grads`: the stash
in order, each sequence-parallel column group's input re-gathered first (:func:`pipeloom.models.tp_comm.regather_wgrad`),
double-buffered in every mode but ``off`` (where every TP collective is blocking).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from ..autograd.splitgrad import weight_grads
from ..core.ir import Job, Kind
from ..models import tp_comm

__all__ = ["TPOverlap", "tp_chunks"]


def tp_chunks(modules: dict) -> set[int]:
    """The chunks whose modules hold tensor-parallel column-parallel GEMMs (``defers_itself``)."""
    return {k for k, m in modules.items() if any(getattr(s, "defers_itself", False) for s in m.modules())}


class TPOverlap:
    """Per rank: the overlap mode, the B jobs it fuses with their W, and the fill queue.

    Args:
        jobs: this rank's job list.
        modules: chunk id -> module.
        mode: ``off | async | chunked:K | fill``.
    """

    def __init__(self, jobs: list[Job], modules: dict, mode: str = "off") -> None:
        self.mode, self.chunks = tp_comm.parse_overlap(mode)
        self.tp = tp_chunks(modules)
        #: BW pairs of TP chunks: F defers, the BW computes the stash at once
        self.defer_bw = {(j.mb, j.chunk) for j in jobs if j.kind is Kind.BW and j.chunk in self.tp}
        #: B jobs (index) whose own W is the next job on the rank
        self.fuse_b = {i for i, j in enumerate(jobs[:-1]) if j.kind is Kind.B and jobs[i + 1].kind is Kind.W
                       and (jobs[i + 1].mb, jobs[i + 1].chunk) == (j.mb, j.chunk)}
        self.w_jobs = [(i, (j.mb, j.chunk)) for i, j in enumerate(jobs) if j.kind is Kind.W]
        self.bw_at: dict[int, list[int]] = {}
        for i, j in enumerate(jobs):
            if j.kind is Kind.BW:
                self.bw_at.setdefault(j.chunk, []).append(i)

    def weight_grads(self, stash: list, grad_of: Callable) -> None:
        """W of one stash (and the rest of a BW's): :func:`~pipeloom.autograd.splitgrad.weight_grads`, with each
        sequence-parallel column group's input gathered again first (double-buffered unless the mode is off)."""
        if any(isinstance(e[1], tp_comm.Shard) for e in stash):
            tp_comm.regather_wgrad(stash, lambda es: weight_grads(es, grad_of), prefetch=self.mode != "off")
        else:
            weight_grads(stash, grad_of)

    @contextmanager
    def backward(self, i: int, job: Job, stashes: dict, outs: dict, grad_of: Callable) -> Iterator[None]:
        """Around the backward of job ``i`` (B or BW): what its column-parallel groups overlap."""
        st = tp_comm.STATE
        if job.chunk not in self.tp:
            yield
            return
        st.mode, st.chunks = self.mode, self.chunks
        st.fuse = job.kind is Kind.BW or (self.mode != "off" and i in self.fuse_b)
        st.wgrad = lambda entries: weight_grads(list(entries), grad_of)
        cur = (job.mb, job.chunk)
        st.fill = ((lambda done: self._fill(i, cur, stashes, outs, done, grad_of))
                   if self.mode == "fill" and not st.fuse else None)
        try:
            yield
        finally:
            st.mode, st.chunks, st.fuse, st.wgrad, st.fill = "off", 1, False, None, None

    def _fill(self, i: int, cur: tuple, stashes: dict, outs: dict, done: Callable[[], bool], grad_of) -> None:
        for j, mk in self.w_jobs:
            if j <= i:
                continue
            stash = stashes.get(mk)
            if mk == cur or stash is None or mk in outs:  # the current pair's, or its B has not run
                return
            if any(i < b < j for b in self.bw_at.get(mk[1], ())):  # a BW of that chunk adds first
                return
            for e in stash:
                if e[2] is None or isinstance(e[1], tp_comm.Shard):
                    continue  # done already, its output never reached the loss, or its input must be gathered
                if done():
                    return
                weight_grads([e], grad_of)
                e[1] = e[2] = None
                tp_comm.comm_stats().filled += 1
