"""Split backward: defer the weight gradients of a module's linears from B to W (needs torch).

The ONE mechanism behind a schedule's B/W split, used by the executor
(:mod:`pipeloom.runtime.executor`) and by the memory tracer's schedule replay
(:func:`pipeloom.memory.traced.measure_schedule`), so the tracer measures what the runtime runs.

For a GEMM ``y = x W^T + b`` (an :class:`torch.nn.Linear`)::

    F   y = F.linear(x, W, b) as usual (autograd's own node, no Python autograd.Function);
        a forward hook stashes an entry [linear, x, None] and a tensor hook on y fills in dy
        when the backward reaches it
    B   the backward is asked only for the chunk input and the parameters that are NOT deferred
        (``inputs=``), so the engine prunes dW = dy^T x and db; dx flows on, dy lands in the stash
    W   dW += dy^T x, db += sum(dy) for every stashed entry (:func:`weight_grads`); stash freed

Nothing is patched: :class:`SplitGrad` registers forward hooks on the linear *instances* of one
module (never on the class ``nn.Linear``) and removes them on :meth:`SplitGrad.close` (or at the
end of a ``with`` block). The hooks stash only while a :meth:`SplitGrad.deferring` block is open,
so a module under a :class:`SplitGrad` runs its ordinary forward everywhere else.

A linear whose parameter is also owned by a non-linear sub-module (a head tied to the embedding)
is not deferred: that parameter must get its whole gradient in B.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import nn

Stash = list
"""What one deferred forward leaves for W: a list of entries ``[linear, x, dy]`` (dy None until B)."""


def deferrable_linears(module: nn.Module) -> list[nn.Linear]:
    """The :class:`nn.Linear` sub-modules whose parameters no other (non-Linear) sub-module also owns."""
    other = {id(p) for sub in module.modules() if not isinstance(sub, nn.Linear)
             for p in sub.parameters(recurse=False)}
    return [sub for sub in module.modules() if isinstance(sub, nn.Linear)
            and not any(id(p) in other for p in sub.parameters(recurse=False))]


class SplitGrad:
    """Deferred weight gradients for the linears of one module instance.

    Usage::

        with SplitGrad(chunk) as sg:
            stash = []
            with sg.deferring(stash):
                y = chunk(x)                       # F: linears stash (x, and later dy)
            torch.autograd.backward(y, dy, inputs=[x, *sg.kept(params)])   # B
            weight_grads(stash, lambda p: p.grad)  # W

    Args:
        module: the module whose deferrable linears (:func:`deferrable_linears`) get the hooks.
    """

    def __init__(self, module: nn.Module) -> None:
        self.linears = deferrable_linears(module)
        self.stash: Stash | None = None
        #: ids of the parameters whose gradients W computes (B leaves them out)
        self.deferred = {id(p) for sub in self.linears for p in sub.parameters(recurse=False)}
        self._handles = [sub.register_forward_hook(self._hook) for sub in self.linears]

    def _hook(self, mod: nn.Module, args: tuple, y) -> None:
        stash = self.stash
        if stash is not None and isinstance(y, torch.Tensor) and y.requires_grad:
            # x detached: W needs its data only. The input itself would keep its autograd history
            # (nodes up to the chunk input) alive from B until W, with tensors some of those nodes
            # hold: on a last stage 0.75 MiB more at the peak than the estimate in
            # bench/memory_accuracy.py (llama-small zbh1 pp4, fp32)
            entry = [mod, args[0].detach(), None]
            stash.append(entry)
            y.register_hook(lambda g, e=entry: e.__setitem__(2, g))

    @contextmanager
    def deferring(self, stash: Stash) -> Iterator[Stash]:
        """Within the block, forwards of the linears append their entries to ``stash``."""
        self.stash = stash
        try:
            yield stash
        finally:
            self.stash = None

    def kept(self, params) -> list:
        """The parameters of ``params`` that B differentiates (those not deferred to W)."""
        return [p for p in params if id(p) not in self.deferred]

    def close(self) -> None:
        """Remove the hooks: the module is as it was before."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self.stash = None

    def __enter__(self) -> "SplitGrad":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


@torch.no_grad()
def weight_grads(stash: Stash, grad_of: Callable[[nn.Parameter], torch.Tensor | None]) -> None:
    """W: add ``dy^T x`` (and ``sum(dy)`` for a bias) of every entry into ``grad_of(param)``, then
    empty the stash. Products are computed in the accumulator's dtype (fp32 master grads for bf16
    parameters: upcast operands, never rounded to bf16 in between). Entries whose output never
    reached the loss (dy None) add nothing; a parameter whose ``grad_of`` is None is skipped."""
    for mod, x, dy in stash:
        if dy is None:
            continue
        w = grad_of(mod.weight) if mod.weight.requires_grad else None
        b = grad_of(mod.bias) if mod.bias is not None and mod.bias.requires_grad else None
        if w is None and b is None:
            continue
        acc = (w if w is not None else b).dtype
        dy2 = dy.reshape(-1, dy.shape[-1]).to(acc)
        if w is not None:
            w.addmm_(dy2.t(), x.reshape(-1, x.shape[-1]).to(acc))
        if b is not None:
            b.add_(dy2.sum(0))
    stash.clear()


__all__ = ["SplitGrad", "Stash", "deferrable_linears", "weight_grads"]
