"""Cross entropy from vocab-sharded logits (:mod:`pipeloom.models.tp`'s head returns them; needs torch)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from .tp_comm import run as _run

__all__ = ["vocab_parallel_cross_entropy", "vocab_parallel_loss"]


def _group_info(group) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


class _VocabParallelCE(torch.autograd.Function):
    """Per-token cross entropy from vocab-sharded logits (Megatron-LM ``_VocabParallelCrossEntropy``).

    ``loss = log(sum_v exp(z_v - m)) - (z_target - m)`` with ``m`` the global max; three all-reduces
    of (tokens,)-sized tensors: max, target logit (only its owner contributes), sum of exponentials.
    Backward: ``softmax - onehot(target)`` on the local shard, times the incoming gradient.
    """

    @staticmethod
    def forward(ctx, logits, targets, group):
        rank, _ = _group_info(group)
        v_local = logits.shape[-1]
        start = rank * v_local
        z = logits.float()
        m = z.max(dim=-1).values
        _run("all_reduce_max", m, None, group, what="all-reduce of the logits' maximum")
        z = z - m.unsqueeze(-1)
        local = targets - start
        outside = (local < 0) | (local >= v_local)
        local = local.masked_fill(outside, 0)
        picked = z.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        _run("all_reduce", picked, None, group, what="all-reduce of the target logits")
        e = z.exp()
        total = e.sum(dim=-1)
        _run("all_reduce", total, None, group, what="all-reduce of the sums of exponentials")
        loss = total.log() - picked
        e.div_(total.unsqueeze(-1))
        ctx.save_for_backward(e, local, outside)
        ctx.in_dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx, g):
        soft, local, outside = ctx.saved_tensors
        grad = soft.clone()
        grad.scatter_add_(-1, local.unsqueeze(-1), -(~outside).to(grad.dtype).unsqueeze(-1))
        grad.mul_(g.unsqueeze(-1))
        return grad.to(ctx.in_dtype), None, None


def vocab_parallel_cross_entropy(logits_local: torch.Tensor, targets: torch.Tensor, group=None) -> torch.Tensor:
    """Per-token cross entropy (fp32, shape of ``targets``) from this rank's vocabulary slice of the logits."""
    return _VocabParallelCE.apply(logits_local, targets, group)


def vocab_parallel_loss(logits_local: torch.Tensor, targets: torch.Tensor, group=None) -> torch.Tensor:
    """Mean token cross entropy, as :func:`pipeloom.models.llama.loss_fn` on the full logits."""
    return vocab_parallel_cross_entropy(logits_local, targets, group).mean()
