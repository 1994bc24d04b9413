"""Split backward: defer the weight gradients of a module's GEMMs from B to W (needs torch).

The ONE mechanism behind a schedule's B/W split, used by the executor
(:mod:`pipeloom.runtime.executor`) and by the memory tracer's schedule replay
(:func:`pipeloom.memory.traced.measure_schedule`), so the tracer measures what the runtime runs. It lives
below both (``pipeloom.autograd``): it knows modules and autograd, not schedules, ranks or processes.

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

GPT-2's ``Conv1D`` (transformers' ``y = x W + b`` with ``W`` stored (in, out); recognised by its
class name and ``nx``/``nf`` attributes, so nothing here imports transformers) is deferred the same way:
W adds ``x^T dy``. Other weights (fused expert tensors used through slices, convolutions, norms,
embeddings) get their gradients in B; :func:`deferred_share` measures, per chunk, which share of the
weight-gradient FLOPs W really takes over.

A linear whose parameter is also owned by a non-linear sub-module (a head tied to the embedding)
is not deferred: that parameter must get its whole gradient in B.

A linear that runs its GEMM in an autograd function of its own (``defers_itself = True``: the
tensor-parallel column-parallel groups of :mod:`pipeloom.models.tp_comm`, which own their input
gradient's collective) gets no hook: while a :meth:`SplitGrad.deferring` block is open its
``split_stash`` attribute is the stash, and the function appends the same ``[linear, x, dy]`` entries.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import nn

Stash = list
"""What one deferred forward leaves for W: a list of entries ``[linear, x, dy]`` (dy None until B)."""


def is_conv1d(module: nn.Module) -> bool:
    """transformers' ``Conv1D`` (GPT-2): ``y = addmm(b, x, W)`` with ``W`` of shape (nx, nf)."""
    w = getattr(module, "weight", None)
    return (type(module).__name__ == "Conv1D" and isinstance(w, torch.Tensor)
            and tuple(w.shape) == (getattr(module, "nx", None), getattr(module, "nf", None)))


def _gemm(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or is_conv1d(module)


def deferrable_linears(module: nn.Module) -> list[nn.Module]:
    """The :class:`nn.Linear` (and ``Conv1D``) sub-modules whose parameters no other sub-module also owns."""
    other = {id(p) for sub in module.modules() if not _gemm(sub) for p in sub.parameters(recurse=False)}
    return [sub for sub in module.modules() if _gemm(sub)
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
        if stash is not None and not getattr(mod, "defers_itself", False) and isinstance(y, torch.Tensor) and y.requires_grad:
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
        own = [sub for sub in self.linears if getattr(sub, "defers_itself", False)]
        for sub in own:
            sub.split_stash = stash
        try:
            yield stash
        finally:
            self.stash = None
            for sub in own:
                sub.split_stash = None

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
        # DTensor modules (torch's parallelize_module): the products on the local shards, into the local
        # shards of the gradients (a Shard(0)/Shard(1) weight's local dW = dy_local^T x_local)
        w, b, x, dy = (_local(t) for t in (w, b, x, dy))
        if w is None and b is None:
            continue
        acc = (w if w is not None else b).dtype
        dy2 = dy.reshape(-1, dy.shape[-1]).to(acc)
        if w is not None:
            x2 = x.reshape(-1, x.shape[-1]).to(acc)
            if isinstance(mod, nn.Linear):
                w.addmm_(dy2.t(), x2)   # W (out, in)
            else:
                w.addmm_(x2.t(), dy2)   # Conv1D: W (in, out)
        if b is not None:
            b.add_(dy2.sum(0))
    stash.clear()


def _local(t):
    """A DTensor's local tensor (in no-grad mode the very storage, so in-place adds reach it); else ``t``."""
    return t.to_local() if t is not None and hasattr(t, "device_mesh") and hasattr(t, "to_local") else t


def _grouped_mm_flops(a_shape, b_shape, *args, **kwargs) -> int:
    """``aten._grouped_mm`` (fused MoE experts), which torch's counter has no formula for: 2 * M * K * N
    summed over the groups; a group splits M (2-D a, 3-D b), N (3-D a, 2-D b) or K (both 2-D)."""
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    if len(a_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[-1]
    if len(b_shape) == 2:
        return 2 * a_shape[1] * a_shape[2] * b_shape[1]
    return 2 * a_shape[0] * a_shape[1] * a_shape[2] * b_shape[-1]


def _backward_flops(module: nn.Module, x: torch.Tensor, wrt: list) -> int:
    """FLOPs torch's counter sees in the backward of ``sum(module(x))`` asked for the grads of ``wrt`` only."""
    from torch.utils.flop_counter import FlopCounterMode

    wrt = [t for t in wrt if t.requires_grad]
    if not wrt:
        return 0
    y = module(x)
    extra = {torch.ops.aten._grouped_mm: _grouped_mm_flops} if hasattr(torch.ops.aten, "_grouped_mm") else {}
    with FlopCounterMode(display=False, custom_mapping=extra) as fc:
        torch.autograd.grad(y.float().sum(), wrt, allow_unused=True)
    return int(fc.get_total_flops())


def deferred_share(module: nn.Module, x: torch.Tensor) -> dict:
    """How much of ``module``'s weight-gradient work a B/W split moves to W, measured on input ``x``.

    Three backwards of one forward each, counted by ``torch.utils.flop_counter.FlopCounterMode``
    (matrix products): all grads (as BW), the activation grads alone (the input and the parameters
    whose grads are no matrix product: embeddings and 1-D ones, which make the backward run down to
    the first layer also in a chunk whose input is token ids), and what B asks for (the input and the
    parameters :class:`SplitGrad` does not defer). Weight-gradient FLOPs = all - activation-only;
    deferred = all - B. Returns ``{"wgrad_flops", "deferred_flops", "share"}`` (share None when the
    module has no weight-gradient FLOPs); the hooks of a temporary :class:`SplitGrad` are removed."""
    params = [p for p in module.parameters() if p.requires_grad]
    xin = x.detach().requires_grad_(x.is_floating_point())
    inp = [xin] if xin.requires_grad else []
    with SplitGrad(module) as sg:
        kept = sg.kept(params)
    emb = {id(p) for m in module.modules() if isinstance(m, nn.Embedding) for p in m.parameters(recurse=False)}
    cheap = [p for p in params if p.ndim < 2 or id(p) in emb]
    full = _backward_flops(module, xin, inp + params)
    dx_only = _backward_flops(module, xin, inp + cheap)
    b_only = _backward_flops(module, xin, inp + kept)
    wgrad, deferred = max(full - dx_only, 0), max(full - b_only, 0)
    return {"wgrad_flops": wgrad, "deferred_flops": deferred, "share": deferred / wgrad if wgrad else None}


__all__ = ["SplitGrad", "Stash", "deferrable_linears", "deferred_share", "is_conv1d", "weight_grads"]
