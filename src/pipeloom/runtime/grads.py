"""A rank's gradients for one step: one flat fp32 buffer and the reducer that syncs it (needs torch).

:class:`GradBuffer` holds every parameter's gradient of the step as a view of one flat fp32
tensor (bf16 parameters get fp32 "master" grads; fp32 parameters lend their ``.grad`` to the
views during the step so that autograd accumulates straight into the buffer).

A :class:`GradReducer` makes the buffer's data-parallel replicas agree. The executor calls it at
fixed points of every step::

    start(buffer)      before the first job (the buffer is zeroed, nothing accumulated yet)
    chunk_done(k)      right after the LAST W or BW of chunk k on this rank: chunk k's gradients
                       are complete (except those of a parameter another chunk shares)
    finish()           after the last job, before the gradients are installed as ``.grad``
                       (and so before the optimizer step): every reduction must be complete

:class:`AllReduceAfterAccumulation` (the default, ``reducer="allreduce"``) does nothing until
``finish`` and then all-reduces the whole buffer once over the data-parallel group and divides
by its size (reduce after accumulation: one collective per step). Per-chunk overlapped
all-reduce and ZeRO-1 plug in here as other reducers.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch
import torch.distributed as dist
from torch import nn


class GradBuffer:
    """One zeroed flat fp32 tensor and a view of it per parameter (in ``params`` order).

    Args:
        params: the rank's trainable parameters, each once (a parameter two chunks share too).
        chunks: chunk id -> that chunk's parameters (for reducers that work per chunk).
        device: where the buffer lives.
    """

    def __init__(self, params: Sequence[nn.Parameter], chunks: dict[int, Sequence[nn.Parameter]],
                 device: torch.device) -> None:
        self.params = list(params)
        self.chunks = {k: list(ps) for k, ps in chunks.items()}
        self.device = device
        self._new()

    def _new(self) -> None:
        self.flat = torch.zeros(sum(p.numel() for p in self.params), dtype=torch.float32, device=self.device)
        self.given = False  # True once views of it were installed as .grad (then it is the user's)
        self.views: dict[nn.Parameter, torch.Tensor] = {}
        off = 0
        for p in self.params:
            self.views[p] = self.flat[off:off + p.numel()].view(p.shape)
            off += p.numel()

    def __getitem__(self, p: nn.Parameter) -> torch.Tensor:
        return self.views[p]

    def reset(self) -> None:
        """Zero for a new step (a new tensor if the last one was handed out as ``.grad``)."""
        if self.given:
            self._new()
        else:
            self.flat.zero_()

    def lend(self) -> list:
        """Point every parameter's ``.grad`` at its view, so autograd accumulates into the buffer;
        return the grads the parameters had before (for :meth:`restore`)."""
        before = [p.grad for p in self.params]
        for p in self.params:
            p.grad = self.views[p]
        return before

    def restore(self, before: list) -> None:
        """Give the parameters back the grads :meth:`lend` returned."""
        for p, g in zip(self.params, before):
            p.grad = g

    @torch.no_grad()
    def install(self, master: dict[nn.Parameter, nn.Parameter]) -> None:
        """Leave the step's gradients in ``.grad`` of each parameter (or of its fp32 master copy).
        A parameter without a grad gets the view itself (no copy; the next step then accumulates
        into a new buffer, so grads handed out are never overwritten); an existing grad is added to."""
        for p in self.params:
            target = master.get(p, p)
            g = self.views[p]
            if target.grad is None:
                if target.dtype == g.dtype:
                    target.grad = g
                    self.given = True
                else:
                    target.grad = g.to(target.dtype, copy=True)
            else:
                target.grad.add_(g.to(target.grad.dtype))


@runtime_checkable
class GradReducer(Protocol):
    """Makes the data-parallel replicas of a :class:`GradBuffer` agree (see the module docstring)."""

    def start(self, buffer: GradBuffer) -> None:
        """A step begins; ``buffer`` is zeroed and will accumulate this step's gradients."""

    def chunk_done(self, chunk: int) -> None:
        """Chunk ``chunk``'s last W/BW of the step on this rank has run."""

    def finish(self) -> None:
        """Every job has run; return only when the buffer holds the reduced gradients."""


class AllReduceAfterAccumulation:
    """Today's reducer: one all-reduce (mean) of the whole buffer over ``group`` at ``finish``.

    Args:
        group: the data-parallel process group of this pipeline stage (None or size 1: no-op).
    """

    def __init__(self, group=None) -> None:
        self.group = group
        self.size = dist.get_world_size(group) if group is not None else 1
        self.buffer: GradBuffer | None = None

    def start(self, buffer: GradBuffer) -> None:
        self.buffer = buffer

    def chunk_done(self, chunk: int) -> None:
        pass

    def finish(self) -> None:
        if self.size > 1 and self.buffer is not None:
            dist.all_reduce(self.buffer.flat, group=self.group)
            self.buffer.flat.div_(self.size)


#: reducer names the executor's ``reducer=`` option takes
REDUCERS = {"allreduce": AllReduceAfterAccumulation}


def make_reducer(reducer: str | GradReducer, group=None) -> GradReducer:
    """The reducer named ``reducer`` (one of :data:`REDUCERS`) for ``group``, or ``reducer`` itself."""
    if isinstance(reducer, str):
        cls = REDUCERS.get(reducer)
        if cls is None:
            raise ValueError(f"unknown gradient reducer {reducer!r}; choose one of: {', '.join(REDUCERS)}")
        return cls(group)
    if not isinstance(reducer, GradReducer):
        raise TypeError(f"reducer must be a name ({', '.join(REDUCERS)}) or have start/chunk_done/finish, "
                        f"got {type(reducer).__name__}")
    return reducer


__all__ = ["AllReduceAfterAccumulation", "GradBuffer", "GradReducer", "REDUCERS", "make_reducer"]
