"""The gradients and parameters of tensor-parallel shards (:mod:`pipeloom.models.tp`; needs torch): the
once-per-step sum of partial gradients of replicated parameters, gathering the full tensors from the
shards, and the check that replicated copies agree."""
from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn

from .tp_comm import run as _run

__all__ = ["reduce_replicated_grads", "gather_full", "replica_diff"]


def _group_info(group) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


@torch.no_grad()
def reduce_replicated_grads(params: Iterable[nn.Parameter], group=None, grad_of=None) -> int:
    """Sum the partial gradients of replicated parameters over the TP ranks that share them.

    ``p.tp_partial_ranks = k``: ranks ``r`` with the same ``r // k`` hold the same tensor and each has
    part of its gradient: a replicated key/value head (k = t/kv_heads: the ranks whose query heads use
    it) or, with sequence parallelism, a norm weight (k = t: each rank's tokens). Call once per step,
    after the last backward (and W) and before the optimizer or any DP reduction. One all-reduce over
    the TP group of a buffer with ``t/k`` slots per parameter, each rank filling its slot. Returns the
    number of parameters reduced (0: nothing to do, no collective). ``grad_of(p)``: where ``p``'s gradient
    is (default ``p.grad``; the fp32 master gradient of a bf16 parameter in the runtime).
    """
    rank, t = _group_info(group)
    grad_of = grad_of or (lambda p: p.grad)
    todo = [(p, grad_of(p)) for p in params if getattr(p, "tp_partial_ranks", 1) > 1]
    todo = [(p, g) for p, g in todo if g is not None]
    if not todo:
        return 0
    where, off = [], 0
    for p, g in todo:
        k = p.tp_partial_ranks
        where.append(off + (rank // k) * g.numel())
        off += (t // k) * g.numel()
    buf = torch.zeros(off, dtype=todo[0][1].dtype, device=todo[0][1].device)
    for (_, g), at in zip(todo, where):
        buf[at:at + g.numel()] = g.reshape(-1)
    _run("all_reduce", buf, None, group, what="all-reduce of the replicated parameters' partial gradients")
    for (_, g), at in zip(todo, where):
        g.copy_(buf[at:at + g.numel()].view_as(g))
    return len(todo)


@torch.no_grad()
def gather_full(module: nn.Module, group=None, *, grads: bool = False, value_of=None) -> dict[str, torch.Tensor]:
    """The unsharded parameters (or their gradients, ``grads=True``) by name, on every rank.

    ``value_of(p)``: the tensor to gather for parameter ``p`` instead (e.g. its fp32 master copy or that
    copy's gradient). A parameter without a gradient gives None. Collective: every rank of ``group`` calls it.
    """
    _, t = _group_info(group)
    out: dict[str, torch.Tensor | None] = {}
    for name, p in module.named_parameters():
        val = value_of(p) if value_of is not None else p.grad if grads else p.data
        val = None if val is None else val.detach()
        have = torch.tensor([0.0 if val is None else 1.0])
        dist.all_reduce(have, op=dist.ReduceOp.MIN, group=group)
        if have.item() == 0.0:
            out[name] = None
            continue
        spec = getattr(p, "tp_shard", None)
        if spec is None:
            out[name] = val.detach().clone()
            continue
        dim, k = spec
        parts = [torch.empty_like(val) for _ in range(t)]
        dist.all_gather(parts, val.contiguous(), group=group)
        out[name] = torch.cat(parts[::k], dim=dim)
    return out


@torch.no_grad()
def replica_diff(module: nn.Module, group=None) -> float:
    """Largest difference between the copies of a replicated parameter on the TP ranks that should hold the
    same values (norm weights on every rank; a replicated key/value head on the ranks sharing it); 0.0 when
    every copy agrees bitwise. Collective: every rank of ``group`` calls it."""
    _, t = _group_info(group)
    worst = 0.0
    for _, p in module.named_parameters():
        spec = getattr(p, "tp_shard", None)
        k = t if spec is None else spec[1]
        if k == 1:
            continue  # a true shard: nothing to agree with
        parts = [torch.empty_like(p.data) for _ in range(t)]
        dist.all_gather(parts, p.data.contiguous(), group=group)
        for r in range(t):
            worst = max(worst, (parts[r] - parts[r - r % k]).abs().max().item())
    return worst

