"""Tensor parallelism for the built-in Llama on local shards (Megatron-LM style, needs torch).

Shoeybi et al. 2019, "Megatron-LM", section 3: a block's two GEMM pairs are split so that each
pair needs one all-reduce in the forward and one in the backward::

    column-parallel  Y_i = X A_i        A split by output rows; X replicated on every TP rank
    row-parallel     Z   = sum_i Y_i B_i  B split by input columns; the sum is the all-reduce

The collectives are two explicit autograd functions, Megatron's ``f`` and ``g``:

    f  copy_to_tp       forward identity,    backward all-reduce  (before a column-parallel GEMM)
    g  reduce_from_tp   forward all-reduce,  backward identity    (after a row-parallel GEMM)

Every parameter is a plain local tensor (an ``nn.Parameter`` holding this rank's shard), so the
gradient buffers, ZeRO-1, the DP reducers and the split backward (:mod:`pipeloom.autograd.splitgrad`,
which hooks ``nn.Linear`` instances) see ordinary modules. :class:`ColumnParallelLinear` and
:class:`RowParallelLinear` ARE ``nn.Linear``: the forward hook of the split backward sees the GEMM's
input after ``f`` (the same values: ``f`` is the identity forward) and its output after ``g`` (whose
gradient equals the GEMM output's: ``g`` is the identity backward), so W's ``dy^T x`` is the shard's
weight gradient.

Sharding of one decoder (``t`` = TP size, ``r`` = TP rank):

* attention: ``wq`` column-parallel by heads (``heads % t == 0``, ``heads/t`` per rank); ``wk``/``wv``
  by key/value heads under Megatron's GQA rule: ``kv_heads % t == 0`` gives ``kv_heads/t`` per rank,
  ``t % kv_heads == 0`` (fewer key/value heads than ranks) replicates each one on ``t/kv_heads`` ranks
  (rank ``r`` holds head ``r // (t/kv_heads)``, the one its query heads use); ``wo`` row-parallel.
* SwiGLU: ``w1``, ``w3`` column-parallel, ``w2`` row-parallel (``ffn % t == 0``).
* vocabulary: the embedding is vocab-parallel (rows ``[r V/t, (r+1) V/t)``, a token outside the
  shard looks up zeros, ``g`` sums); the head is column-parallel over the vocabulary and returns
  LOCAL logits ``(batch, seq, V/t)``; :func:`vocab_parallel_cross_entropy` takes the loss from them
  (Megatron's ``_VocabParallelCrossEntropy``: all-reduce max, all-reduce target logit, all-reduce
  sum of exponentials), so the full logits are never gathered.
* norms: replicated; their input and output gradient are the same on every TP rank, so are their
  weight gradients.

Replicated key/value heads are the one place a gradient is partial: each rank's query heads add
their share. :func:`reduce_replicated_grads` sums those over the ranks holding the same head, once
per step after the last backward (one all-reduce over the TP group).

Each parameter carries ``tp_shard = (dim, ranks_per_shard)`` (None when replicated): the full
tensor is the concatenation along ``dim`` of the shards of ranks ``0, k, 2k, ...`` with
``k = ranks_per_shard`` (:func:`gather_full`).

Sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models"; ``sequence_parallel=True``): between the GEMM pairs the hidden states hold this rank's
``seq/t`` tokens (also between pipeline stages: P2P sends the shard). The norms run on the shard and
all-gather along the sequence (:class:`SPGatherNorm`; backward reduce-scatter), the row-parallel
outputs and the embedding's lookups are reduce-scattered (backward all-gather) instead of
all-reduced; the replicated norm weights then have partial gradients (each rank's tokens), summed
by the same once-per-step :func:`reduce_replicated_grads`. The collectives stay outside the
``nn.Linear`` so the split backward's W sees the GEMM's own input and output gradient.

Not here yet: TP communication overlap, the Hugging Face families.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .llama import (Block, LlamaChunk, RMSNorm, apply_rope, build_chunk_modules, build_reference,  # noqa: F401
                    causal_attention, check_llama)

__all__ = [
    "check_tp",
    "tp_kv_layout",
    "copy_to_tp",
    "reduce_from_tp",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "TPAttention",
    "TPFeedForward",
    "vocab_parallel_cross_entropy",
    "vocab_parallel_loss",
    "shard_chunk_",
    "build_tp_chunk_modules",
    "reduce_replicated_grads",
    "gather_full",
    "gather_seq",
    "reduce_scatter_seq",
    "SPGatherNorm",
    "replica_diff",
]


# --------------------------------------------------------------------------------- checks
def check_tp(cfg: ModelConfig, tp: int) -> None:
    """Refuse, in one line (ValueError), a TP size the model cannot be split into.

    Allowed: ``heads % tp == 0``, ``kv_heads % tp == 0`` or ``tp % kv_heads == 0`` (Megatron's GQA
    rule: key/value heads replicated when fewer than ranks), ``ffn % tp == 0``, ``vocab % tp == 0``.
    """
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"tensor-parallel size must be an integer >= 1, got {tp!r}")
    if cfg.heads % tp:
        raise ValueError(f"tp={tp} does not divide heads={cfg.heads} of model {cfg.name!r}; "
                         f"tp must divide the number of attention heads")
    if cfg.kv_heads % tp and tp % cfg.kv_heads:
        raise ValueError(f"tp={tp} and kv_heads={cfg.kv_heads} of model {cfg.name!r}: one must divide the other "
                         f"(key/value heads are split when kv_heads % tp == 0, replicated when tp % kv_heads == 0)")
    if cfg.ffn % tp:
        raise ValueError(f"tp={tp} does not divide ffn={cfg.ffn} of model {cfg.name!r}; "
                         f"tp must divide the feed-forward size")
    if cfg.vocab % tp:
        raise ValueError(f"tp={tp} does not divide vocab={cfg.vocab} of model {cfg.name!r}; "
                         f"tp must divide the vocabulary size (pad the vocabulary)")


def tp_kv_layout(cfg: ModelConfig, tp: int, rank: int) -> tuple[int, int, int]:
    """``(first key/value head, key/value heads on this rank, ranks per key/value head)``."""
    if cfg.kv_heads >= tp:
        n = cfg.kv_heads // tp
        return rank * n, n, 1
    rep = tp // cfg.kv_heads
    return rank // rep, 1, rep


def _group_info(group) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


# --------------------------------------------------------------------------------- f and g
class _CopyToTP(torch.autograd.Function):
    """Megatron's ``f``: identity forward, all-reduce of the input gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        y = x.contiguous().clone()
        dist.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx, g):
        return g, None


def copy_to_tp(x: torch.Tensor, group=None) -> torch.Tensor:
    """``f``: ``x`` unchanged; its gradient is summed over the TP group."""
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group=None) -> torch.Tensor:
    """``g``: ``x`` summed over the TP group; its gradient passes unchanged."""
    return _ReduceFromTP.apply(x, group)


# torch 2.13 renamed the single-tensor collectives (the old names warn); older torch has only the old ones
_all_gather_1 = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_1 = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _seq_first(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1).contiguous()  # (batch, seq, ...) -> (seq, batch, ...): shards are contiguous


class _GatherSeq(torch.autograd.Function):
    """Sequence parallel's ``g-bar``: all-gather along the sequence forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        _, t = _group_info(group)
        xs = _seq_first(x)
        out = xs.new_empty((xs.shape[0] * t, *xs.shape[1:]))
        _all_gather_1(out, xs, group=group)
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter_seq(g, ctx.group), None


def _reduce_scatter_seq(x: torch.Tensor, group) -> torch.Tensor:
    _, t = _group_info(group)
    xs = _seq_first(x)
    if xs.shape[0] % t:
        raise ValueError(f"sequence parallel: sequence length {xs.shape[0]} is not a multiple of tp={t}")
    out = xs.new_empty((xs.shape[0] // t, *xs.shape[1:]))
    _reduce_scatter_1(out, xs, group=group)
    return out.transpose(0, 1).contiguous()  # a chunk's output: P2P sends contiguous tensors


class _ReduceScatterSeq(torch.autograd.Function):
    """Sequence parallel's ``g``: reduce-scatter along the sequence forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_seq(x, group)

    @staticmethod
    def backward(ctx, g):
        _, t = _group_info(ctx.group)
        gs = _seq_first(g)
        out = gs.new_empty((gs.shape[0] * t, *gs.shape[1:]))
        _all_gather_1(out, gs, group=ctx.group)
        return out.transpose(0, 1).contiguous(), None


def gather_seq(x: torch.Tensor, group=None) -> torch.Tensor:
    """(batch, seq/t, ...) -> (batch, seq, ...): the TP ranks' sequence shards in rank order."""
    return _GatherSeq.apply(x, group)


def reduce_scatter_seq(x: torch.Tensor, group=None) -> torch.Tensor:
    """(batch, seq, ...) partial sums -> this rank's (batch, seq/t, ...) shard of their sum."""
    return _ReduceScatterSeq.apply(x, group)


# --------------------------------------------------------------------------------- layers
class ColumnParallelLinear(nn.Linear):
    """``y_local = f(x) W_local^T``: ``W_local`` = this rank's rows of the full weight (out/t, in).

    ``copy_input=False`` when the caller applied ``f`` once for several GEMMs sharing an input
    (q, k, v; w1, w3), so their input gradients are summed by one all-reduce.
    """

    def __init__(self, in_features: int, out_local: int, group=None, *, copy_input: bool = True,
                 rows_per_shard: int = 1) -> None:
        super().__init__(in_features, out_local, bias=False)
        self.group, self.copy_input = group, copy_input
        self.weight.tp_shard = (0, rows_per_shard)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.copy_input:
            x = copy_to_tp(x, self.group)
        return F.linear(x, self.weight)


class RowParallelLinear(nn.Linear):
    """``y = g(x_local W_local^T)``: ``W_local`` = this rank's columns of the full weight (out, in/t).

    ``reduce_output=False`` returns the partial sum (the caller reduce-scatters it: sequence parallel;
    outside the GEMM, so that the split backward's W pairs ``x`` with the GEMM's own output gradient).
    """

    def __init__(self, in_local: int, out_features: int, group=None, *, reduce_output: bool = True) -> None:
        super().__init__(in_local, out_features, bias=False)
        self.group, self.reduce_output = group, reduce_output
        self.weight.tp_shard = (1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        return reduce_from_tp(y, self.group) if self.reduce_output else y


class VocabParallelEmbedding(nn.Module):
    """Rows ``[start, start + V/t)`` of the embedding; tokens outside look up zeros; ``g`` sums."""

    def __init__(self, vocab: int, dim: int, group=None, *, sequence_parallel: bool = False) -> None:
        super().__init__()
        rank, t = _group_info(group)
        self.group, self.vocab_local, self.sequence_parallel = group, vocab // t, sequence_parallel
        self.start = rank * self.vocab_local
        self.weight = nn.Parameter(torch.empty(self.vocab_local, dim))
        self.weight.tp_shard = (0, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.vocab_local)
        out = F.embedding(local.masked_fill(outside, 0), self.weight).masked_fill(outside[..., None], 0.0)
        if self.sequence_parallel:  # this rank's tokens of the summed lookups
            return reduce_scatter_seq(out, self.group)
        return reduce_from_tp(out, self.group)


class SPGatherNorm(RMSNorm):
    """Sequence parallel: RMSNorm on this rank's tokens, then all-gather along the sequence (the
    ``f`` of the column-parallel GEMMs that follow: its backward reduce-scatters the input gradient).

    The weight is replicated; its gradient is this rank's tokens' part (``tp_partial_ranks`` = t):
    :func:`reduce_replicated_grads` sums it over the TP group once per step."""

    def __init__(self, dim: int, eps: float, group=None) -> None:
        super().__init__(dim, eps)
        self.group = group
        self.weight.tp_partial_ranks = _group_info(group)[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gather_seq(super().forward(x), self.group)


class TPAttention(nn.Module):
    """Causal GQA attention on this rank's query heads (and the key/value heads they use)."""

    def __init__(self, cfg: ModelConfig, group=None, *, sequence_parallel: bool = False) -> None:
        super().__init__()
        rank, t = _group_info(group)
        self.group, self.hd, self.sp = group, cfg.head_dim, sequence_parallel
        self.n_heads = cfg.heads // t
        _, self.n_kv, rep = tp_kv_layout(cfg, t, rank)
        self.wq = ColumnParallelLinear(cfg.hidden, self.n_heads * cfg.head_dim, group, copy_input=False)
        self.wk = ColumnParallelLinear(cfg.hidden, self.n_kv * cfg.head_dim, group, copy_input=False,
                                       rows_per_shard=rep)
        self.wv = ColumnParallelLinear(cfg.hidden, self.n_kv * cfg.head_dim, group, copy_input=False,
                                       rows_per_shard=rep)
        if rep > 1:  # each rank's query heads add their part to a replicated head's gradient
            self.wk.weight.tp_partial_ranks = self.wv.weight.tp_partial_ranks = rep
        self.wo = RowParallelLinear(self.n_heads * cfg.head_dim, cfg.hidden, group, reduce_output=not sequence_parallel)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # sequence parallel: x is already gathered (SPGatherNorm); the local heads as the unsharded attention
        if not self.sp:
            x = copy_to_tp(x, self.group)
        y = self.wo(causal_attention(self, x, cos, sin))
        return reduce_scatter_seq(y, self.group) if self.sp else y


class TPFeedForward(nn.Module):
    """SwiGLU with ``w1``, ``w3`` column-parallel and ``w2`` row-parallel: ``g(w2(silu(w1 f(x)) * w3 f(x)))``."""

    def __init__(self, cfg: ModelConfig, group=None, *, sequence_parallel: bool = False) -> None:
        super().__init__()
        _, t = _group_info(group)
        self.group, self.sp = group, sequence_parallel
        self.w1 = ColumnParallelLinear(cfg.hidden, cfg.ffn // t, group, copy_input=False)
        self.w3 = ColumnParallelLinear(cfg.hidden, cfg.ffn // t, group, copy_input=False)
        self.w2 = RowParallelLinear(cfg.ffn // t, cfg.hidden, group, reduce_output=not sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.sp:  # sequence parallel: x is already gathered (SPGatherNorm)
            x = copy_to_tp(x, self.group)
        y = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return reduce_scatter_seq(y, self.group) if self.sp else y


# --------------------------------------------------------------------------------- loss
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
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        z = z - m.unsqueeze(-1)
        local = targets - start
        outside = (local < 0) | (local >= v_local)
        local = local.masked_fill(outside, 0)
        picked = z.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        dist.all_reduce(picked, group=group)
        e = z.exp()
        total = e.sum(dim=-1)
        dist.all_reduce(total, group=group)
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


# --------------------------------------------------------------------------------- building
def _rows(w: torch.Tensor, start: int, n: int) -> torch.Tensor:
    return w[start:start + n].clone()


@torch.no_grad()
def shard_chunk_(chunk: LlamaChunk, group=None, *, sequence_parallel: bool = False) -> LlamaChunk:
    """Replace, in place, the layers of a full :class:`LlamaChunk` by this TP rank's shards of them.

    Parameter names stay those of the full chunk (``layers.3.attn.wq.weight``...), each holding its
    shard (see the module docstring for which). ``sequence_parallel``: the chunk's input (unless it
    holds the embedding) and output (unless it holds the head) are this rank's ``seq/t`` tokens.
    Returns ``chunk``.
    """
    cfg = chunk.cfg
    rank, t = _group_info(group)
    check_tp(cfg, t)
    hd = cfg.head_dim
    hl, fl, vl = cfg.heads // t, cfg.ffn // t, cfg.vocab // t
    kv0, kvl, _ = tp_kv_layout(cfg, t, rank)
    dtype = next(chunk.parameters()).dtype
    device = next(chunk.parameters()).device

    def load(mod: nn.Module, w: torch.Tensor) -> None:
        mod.weight.data = w.to(device=device, dtype=dtype).contiguous()

    def sp_norm(norm: RMSNorm) -> SPGatherNorm:
        out = SPGatherNorm(norm.weight.shape[0], norm.eps, group)
        load(out, norm.weight.detach().clone())
        return out

    sp = bool(sequence_parallel)
    for blk in chunk.layers.values():
        a, f = blk.attn, blk.ffn
        ta = TPAttention(cfg, group, sequence_parallel=sp)
        load(ta.wq, _rows(a.wq.weight, rank * hl * hd, hl * hd))
        load(ta.wk, _rows(a.wk.weight, kv0 * hd, kvl * hd))
        load(ta.wv, _rows(a.wv.weight, kv0 * hd, kvl * hd))
        load(ta.wo, a.wo.weight[:, rank * hl * hd:(rank + 1) * hl * hd].clone())
        tf = TPFeedForward(cfg, group, sequence_parallel=sp)
        load(tf.w1, _rows(f.w1.weight, rank * fl, fl))
        load(tf.w3, _rows(f.w3.weight, rank * fl, fl))
        load(tf.w2, f.w2.weight[:, rank * fl:(rank + 1) * fl].clone())
        blk.attn, blk.ffn = ta, tf
        if sp:
            blk.attn_norm, blk.ffn_norm = sp_norm(blk.attn_norm), sp_norm(blk.ffn_norm)
    if chunk.embed is not None:
        emb = VocabParallelEmbedding(cfg.vocab, cfg.hidden, group, sequence_parallel=sp)
        load(emb, _rows(chunk.embed.weight, rank * vl, vl))
        chunk.embed = emb
    if chunk.head is not None:
        head = ColumnParallelLinear(cfg.hidden, vl, group, copy_input=not sp)  # sp: the norm gathers
        load(head, _rows(chunk.head.weight, rank * vl, vl))
        chunk.head = head
        if sp:
            chunk.norm = sp_norm(chunk.norm)
    for name, p in chunk.named_parameters():
        if not hasattr(p, "tp_shard"):
            p.tp_shard = None  # replicated (norms)
    chunk.tp_group = group
    chunk.seq_shards = t if sp else 1
    return chunk


def build_tp_chunk_modules(cfg: ModelConfig, layers_per_chunk: Sequence[Sequence[int]], seed: int = 0, *,
                           group=None, chunks: Iterable[int] | None = None, device=None,
                           dtype: torch.dtype | None = None, sequence_parallel: bool = False) -> list[LlamaChunk]:
    """:func:`pipeloom.models.llama.build_chunk_modules`, each chunk sharded for this rank of ``group``.

    The shards are slices of exactly the weights the unsharded build makes (the full chunk is built,
    then sliced), so a TP run can be compared with :func:`pipeloom.models.llama.build_reference`.
    ``check_tp`` runs first, before anything is built.
    """
    check_tp(cfg, dist.get_world_size(group))
    mods = build_chunk_modules(cfg, layers_per_chunk, seed, chunks=chunks, device=device, dtype=dtype)
    return [shard_chunk_(m, group, sequence_parallel=sequence_parallel) for m in mods]


# --------------------------------------------------------------------------------- gradients
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
    dist.all_reduce(buf, group=group)
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

