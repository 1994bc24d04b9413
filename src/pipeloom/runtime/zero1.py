"""ZeRO-1 (a distributed optimizer) over :mod:`pipeloom.runtime.grads`' buffer and reduce-scatter (needs torch).

:class:`Zero1Optimizer` keeps the fp32 weights and the optimizer states of this rank's gradient shards only
(the shards :class:`~pipeloom.runtime.grads.ZeroReduceScatter` leaves on it), steps them, and all-gathers the
parameters afterwards.
"""
from __future__ import annotations

import torch
from torch import nn

from .grads import GradBuffer, ZeroReduceScatter, _collective, wait_named


class Zero1Optimizer:
    """ZeRO-1 optimizer (a distributed optimizer): fp32 weights and optimizer states for this rank's
    shards only.

    The gradient buffer's layout (chunk segments padded to a multiple of the dp size) is the layout
    of the parameters too, and ``reducer.shard(seg)`` is this rank's ``[lo, hi)`` of every segment.

    * **fp32 parameters** (``master`` empty): the parameters are moved into one flat fp32 tensor
      (``flat``) laid out like the buffer; each shard is a view of it. Kept per rank: the full fp32
      parameters (4 B/param, needed for the forward), the inner optimizer's states for the shards.
    * **bf16 parameters** (``master`` = the executor's bf16 parameter -> fp32 master copy): the bf16
      parameters are moved into one flat bf16 tensor (``pflat``) laid out like the buffer; the fp32
      master weights of **this rank's shards only** go into ``flat`` (the sum of the shard lengths),
      and ``master`` is emptied, so no rank keeps a full fp32 copy (the executor's ``sync_params``
      then has nothing to do: :meth:`step` writes the bf16 parameters itself). Kept per rank: bf16
      parameters 2 B/param, fp32 master shard 4/N B/param, the inner optimizer's states for the shard
      (AdamW: 8/N B/param), beside the executor's fp32 gradient buffer (4 B/param).

    :meth:`step`: the inner optimizer (``optimizer_cls``, e.g. :class:`torch.optim.AdamW`) steps one
    flat fp32 shard parameter per segment with the reduced gradient shard; with bf16 the shard is
    rounded into the bf16 parameters' shard; then every segment's parameters are all-gathered in
    place (every rank ends with the same full parameters). Call it after the executor's step, then
    :meth:`zero_grad`.

    Args:
        reducer: the run's :class:`ZeroReduceScatter` (its buffer and shards).
        buffer: the executor's :class:`GradBuffer` (``executor.grads``).
        master: bf16 parameter -> fp32 master copy (``executor.master``; empty with fp32 parameters).
            Emptied: the optimizer owns the (sharded) master weights from then on.
        timeout_s: longest wait for the parameter all-gather.
    """

    def __init__(self, reducer: ZeroReduceScatter, buffer: GradBuffer, master: dict, optimizer_cls=None,
                 timeout_s: float | None = None, **kwargs) -> None:
        self.reducer = reducer
        self.buffer = buffer
        if reducer.size > 1:
            buffer.align(reducer.size)
        buffer.keep = True
        self.timeout_s = timeout_s
        self.segments = list(buffer.segments)
        self.sharded_master = bool(master)
        size = self.segments[-1].end if self.segments else 0
        dev = buffer.params[0].device if buffer.params else buffer.device
        bounds = [reducer.shard(seg) for seg in self.segments]
        if self.sharded_master:
            dtypes = {p.dtype for p in buffer.params}
            if len(dtypes) != 1:
                raise ValueError(f"ZeRO-1 with master weights needs one parameter dtype, got {sorted(map(str, dtypes))}")
            # the full bf16 parameters, laid out like the buffer (the all-gather's output)
            self.pflat = self._move_into(torch.zeros(size, dtype=dtypes.pop(), device=dev))
            # fp32 master weights of this rank's shards only, copied piece by piece from the full copies
            local, a = [], 0  # per segment: [a, b) of this rank's shard in ``flat``
            for lo, hi in bounds:
                local.append((a, a + hi - lo))
                a += hi - lo
            self.flat = torch.zeros(a, dtype=torch.float32, device=dev)
            with torch.no_grad():
                for i, p, off in self._places():
                    (lo, hi), start = bounds[i], local[i][0]
                    s, e = max(off, lo), min(off + p.numel(), hi)
                    if s < e:
                        self.flat[start + s - lo:start + e - lo].copy_(master[p].detach().reshape(-1)[s - off:e - off])
            master.clear()  # the full fp32 copies go: this rank's master weights are its shards
        else:
            self.pflat = None
            self.flat = self._move_into(torch.zeros(size, dtype=torch.float32, device=dev))
            local = bounds
        self.shards = [nn.Parameter(self.flat[a:b]) for a, b in local]
        cls = optimizer_cls or torch.optim.AdamW
        self.optimizer = cls(self.shards, **kwargs)

    def _places(self):
        """``(segment index, parameter, its offset in the buffer layout)`` of every parameter."""
        for i, seg in enumerate(self.segments):
            off = seg.start
            for p in seg.params:
                yield i, p, off
                off += p.numel()

    def _move_into(self, flat: torch.Tensor) -> torch.Tensor:
        """Make every parameter's data a view of ``flat`` at its place in the buffer layout."""
        with torch.no_grad():
            for _, p, off in self._places():
                view = flat[off:off + p.numel()].view(p.shape)
                view.copy_(p.detach())
                p.data = view
        return flat

    def _all_gather(self, full: torch.Tensor, what: str) -> None:
        """Every segment of ``full`` (buffer layout) all-gathered in place from the dp ranks' shards, all
        started before any is waited for; ``what`` names the wait if a peer never arrives."""
        if self.reducer.size == 1:
            return
        gather = _collective("all_gather")
        works = []
        for seg in self.segments:
            lo, hi = self.reducer.shard(seg)
            self.reducer.arrivals.arrive()
            works.append((seg, gather(full[seg.start:seg.end], full[lo:hi], group=self.reducer.group,
                                      async_op=True)))
        for seg, w in works:
            wait_named(w, self.timeout_s, f"{what} of chunk {seg.chunk}", self.reducer.arrivals)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def state_bytes(self) -> int:
        """Bytes of the inner optimizer's per-element state tensors (e.g. Adam's two moments; the 0-d
        step counters are not counted)."""
        return sum(t.numel() * t.element_size() for st in self.optimizer.state.values() for t in st.values()
                   if torch.is_tensor(t) and t.dim() > 0)

    @torch.no_grad()
    def step(self) -> None:
        for sh, g in zip(self.shards, self.reducer.shard_grads()):
            sh.grad = g
        self.optimizer.step()
        full = self.flat
        if self.sharded_master:  # round the updated fp32 shard into the bf16 parameters' shard
            full = self.pflat
            for seg, sh in zip(self.segments, self.shards):
                lo, hi = self.reducer.shard(seg)
                self.pflat[lo:hi].copy_(sh)
        self._all_gather(full, f"step {self.reducer.steps - 1}: data-parallel all-gather of the parameters")

    @torch.no_grad()
    def full_master(self) -> dict[nn.Parameter, torch.Tensor]:
        """Parameter -> its fp32 value (for checks and checkpoints). fp32 parameters: the parameters
        themselves. bf16: the master shards all-gathered over the dp group into a NEW full fp32 tensor
        (a collective: every dp rank must call it; transient, not kept)."""
        if not self.sharded_master:
            return {p: p for p in self.buffer.params}
        size = self.segments[-1].end if self.segments else 0
        full = torch.zeros(size, dtype=torch.float32, device=self.flat.device)
        for seg, sh in zip(self.segments, self.shards):
            lo, hi = self.reducer.shard(seg)
            full[lo:hi].copy_(sh)
        self._all_gather(full, "all-gather of the fp32 master weights")
        return {p: full[off:off + p.numel()].view(p.shape) for _, p, off in self._places()}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for sh in self.shards:
            sh.grad = None


#: reducer names the executor's ``reducer=`` option takes


__all__ = ["Zero1Optimizer"]
