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
``seq/t`` tokens (also between pipeline stages: P2P sends the shard). The norms run on the shard
(:class:`SPNorm`) and the column-parallel group after each all-gathers along the sequence (backward:
reduce-scatter of the input gradient), the row-parallel outputs and the embedding's lookups are
reduce-scattered (backward all-gather) instead of all-reduced; the replicated norm weights then have
partial gradients (each rank's tokens), summed by the same once-per-step :func:`reduce_replicated_grads`.
The collectives stay outside the GEMMs' weight gradients, so the split backward's W sees each GEMM's
own (gathered) input and output gradient.

The collectives go through :mod:`pipeloom.models.tp_comm`, which also holds the column-parallel GEMM
groups' autograd function (its input gradient's collective overlapped with weight-gradient work:
``pipeloom run --tp-overlap``) and the emulated link; the gradient helpers are in :mod:`pipeloom.models.tp_grads`.

The transformers Llama-shaped families are sharded the same way by :mod:`pipeloom.integrations.hf_tp`.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from types import SimpleNamespace

from .llama import (Block, LlamaChunk, RMSNorm, apply_rope, build_chunk_modules, build_reference,  # noqa: F401
                    causal_attention, check_llama)
from .tp_comm import _all_gather_1, _reduce_scatter_1, _seq_first, column_parallel  # noqa: F401
from .tp_comm import run as _run
from .tp_grads import gather_full, reduce_replicated_grads, replica_diff  # noqa: F401  (their home before)
from .tp_loss import vocab_parallel_cross_entropy, vocab_parallel_loss  # noqa: F401  (their home before)

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
    "SPNorm",
    "column_parallel",
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
        _run("all_reduce", g, None, ctx.group, what="all-reduce of an input gradient")
        return g, None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        y = x.contiguous().clone()
        _run("all_reduce", y, None, group, what="all-reduce of a row-parallel output")
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


class _GatherSeq(torch.autograd.Function):
    """Sequence parallel's ``g-bar``: all-gather along the sequence forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        _, t = _group_info(group)
        xs = _seq_first(x)
        out = xs.new_empty((xs.shape[0] * t, *xs.shape[1:]))
        _run("all_gather", out, xs, group, what="all-gather of a sequence-parallel input")
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
    _run("reduce_scatter", out, xs, group, what="reduce-scatter of a sequence-parallel output")
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
        _run("all_gather", out, gs, ctx.group, what="all-gather of a sequence-parallel output gradient")
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

    Called alone it is a group of one (:func:`pipeloom.models.tp_comm.column_parallel`; with
    ``sequence_parallel`` its input is this rank's sequence shard, all-gathered); a layer whose GEMMs share
    an input (q, k, v; w1, w3) runs them as one group, so their input gradients are summed and reduced by
    one collective. ``defers_itself``: the group function stashes this GEMM's weight-gradient work for
    the split backward (its forward hooks leave it alone).
    """

    defers_itself = True

    def __init__(self, in_features: int, out_local: int, group=None, *, sequence_parallel: bool = False,
                 rows_per_shard: int = 1, what: str = "column-parallel") -> None:
        super().__init__(in_features, out_local, bias=False)
        self.group, self.sequence_parallel, self.what = group, sequence_parallel, what
        self.weight.tp_shard = (0, rows_per_shard)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return column_parallel(x, (self,), self.group, sequence_parallel=self.sequence_parallel, what=self.what)[0]


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


class SPNorm(RMSNorm):
    """Sequence parallel: RMSNorm on this rank's tokens; the column-parallel GEMMs that follow all-gather its
    output along the sequence (and reduce-scatter their input gradient).

    The weight is replicated; its gradient is this rank's tokens' part (``tp_partial_ranks`` = t):
    :func:`reduce_replicated_grads` sums it over the TP group once per step."""

    def __init__(self, dim: int, eps: float, group=None) -> None:
        super().__init__(dim, eps)
        self.group = group
        self.weight.tp_partial_ranks = _group_info(group)[1]


SPGatherNorm = SPNorm  # its name when it gathered itself


class TPAttention(nn.Module):
    """Causal GQA attention on this rank's query heads (and the key/value heads they use)."""

    def __init__(self, cfg: ModelConfig, group=None, *, sequence_parallel: bool = False, layer: int | None = None) -> None:
        super().__init__()
        rank, t = _group_info(group)
        self.group, self.hd, self.sp = group, cfg.head_dim, sequence_parallel
        self.what = f"layer {layer} attention q/k/v" if layer is not None else "attention q/k/v"
        self.n_heads = cfg.heads // t
        _, self.n_kv, rep = tp_kv_layout(cfg, t, rank)
        self.wq = ColumnParallelLinear(cfg.hidden, self.n_heads * cfg.head_dim, group)
        self.wk = ColumnParallelLinear(cfg.hidden, self.n_kv * cfg.head_dim, group, rows_per_shard=rep)
        self.wv = ColumnParallelLinear(cfg.hidden, self.n_kv * cfg.head_dim, group, rows_per_shard=rep)
        if rep > 1:  # each rank's query heads add their part to a replicated head's gradient
            self.wk.weight.tp_partial_ranks = self.wv.weight.tp_partial_ranks = rep
        self.wo = RowParallelLinear(self.n_heads * cfg.head_dim, cfg.hidden, group, reduce_output=not sequence_parallel)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # q, k, v: one column-parallel group (sequence parallel: x is this rank's tokens, gathered there);
        # then the local heads as the unsharded attention
        q, k, v = column_parallel(x, (self.wq, self.wk, self.wv), self.group, sequence_parallel=self.sp, what=self.what)
        proj = SimpleNamespace(wq=lambda _: q, wk=lambda _: k, wv=lambda _: v, n_heads=self.n_heads, n_kv=self.n_kv,
                               hd=self.hd)
        y = self.wo(causal_attention(proj, q, cos, sin))
        return reduce_scatter_seq(y, self.group) if self.sp else y


class TPFeedForward(nn.Module):
    """SwiGLU with ``w1``, ``w3`` column-parallel and ``w2`` row-parallel: ``g(w2(silu(w1 f(x)) * w3 f(x)))``."""

    def __init__(self, cfg: ModelConfig, group=None, *, sequence_parallel: bool = False, layer: int | None = None) -> None:
        super().__init__()
        _, t = _group_info(group)
        self.group, self.sp = group, sequence_parallel
        self.what = f"layer {layer} feed-forward w1/w3" if layer is not None else "feed-forward w1/w3"
        self.w1 = ColumnParallelLinear(cfg.hidden, cfg.ffn // t, group)
        self.w3 = ColumnParallelLinear(cfg.hidden, cfg.ffn // t, group)
        self.w2 = RowParallelLinear(cfg.ffn // t, cfg.hidden, group, reduce_output=not sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = column_parallel(x, (self.w1, self.w3), self.group, sequence_parallel=self.sp, what=self.what)
        y = self.w2(F.silu(a) * b)
        return reduce_scatter_seq(y, self.group) if self.sp else y


# --------------------------------------------------------------------------------- building
def _rows(w: torch.Tensor, start: int, n: int) -> torch.Tensor:
    return w[start:start + n].clone()


@torch.no_grad()
def shard_chunk_(chunk: LlamaChunk, group=None, *, sequence_parallel: bool = False,
                 blocks: Sequence[str] | None = None, ends: bool = True) -> LlamaChunk:
    """Replace, in place, the layers of a full :class:`LlamaChunk` by this TP rank's shards of them.

    Parameter names stay those of the full chunk (``layers.3.attn.wq.weight``...), each holding its
    shard (see the module docstring for which). ``sequence_parallel``: the chunk's input (unless it
    holds the embedding) and output (unless it holds the head) are this rank's ``seq/t`` tokens.
    ``blocks``: only these layers (keys of ``chunk.layers``; default all); ``ends``: also the embedding,
    head and final norm, and mark the chunk sharded (do it once, last). Returns ``chunk``.
    """
    cfg = chunk.cfg
    rank, t = _group_info(group)
    check_tp(cfg, t)
    hd = cfg.head_dim
    hl, fl, vl = cfg.heads // t, cfg.ffn // t, cfg.vocab // t
    kv0, kvl, _ = tp_kv_layout(cfg, t, rank)
    first = next(chunk.parameters(), None)
    dtype = first.dtype if first is not None else torch.float32
    device = first.device if first is not None else torch.device("cpu")

    def load(mod: nn.Module, w: torch.Tensor) -> None:
        mod.weight.data = w.to(device=device, dtype=dtype).contiguous()

    def sp_norm(norm: RMSNorm) -> SPNorm:
        out = SPNorm(norm.weight.shape[0], norm.eps, group)
        load(out, norm.weight.detach().clone())
        return out

    sp = bool(sequence_parallel)
    for layer, blk in chunk.layers.items():
        if blocks is not None and layer not in blocks:
            continue
        a, f = blk.attn, blk.ffn
        ta = TPAttention(cfg, group, sequence_parallel=sp, layer=int(layer))
        load(ta.wq, _rows(a.wq.weight, rank * hl * hd, hl * hd))
        load(ta.wk, _rows(a.wk.weight, kv0 * hd, kvl * hd))
        load(ta.wv, _rows(a.wv.weight, kv0 * hd, kvl * hd))
        load(ta.wo, a.wo.weight[:, rank * hl * hd:(rank + 1) * hl * hd].clone())
        tf = TPFeedForward(cfg, group, sequence_parallel=sp, layer=int(layer))
        load(tf.w1, _rows(f.w1.weight, rank * fl, fl))
        load(tf.w3, _rows(f.w3.weight, rank * fl, fl))
        load(tf.w2, f.w2.weight[:, rank * fl:(rank + 1) * fl].clone())
        blk.attn, blk.ffn = ta, tf
        if sp:
            blk.attn_norm, blk.ffn_norm = sp_norm(blk.attn_norm), sp_norm(blk.ffn_norm)
    if not ends:
        return chunk
    if chunk.embed is not None:
        emb = VocabParallelEmbedding(cfg.vocab, cfg.hidden, group, sequence_parallel=sp)
        load(emb, _rows(chunk.embed.weight, rank * vl, vl))
        chunk.embed = emb
    if chunk.head is not None:
        head = ColumnParallelLinear(cfg.hidden, vl, group, sequence_parallel=sp, what="head")
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

    The shards are slices of exactly the weights the unsharded build makes (each full tensor is drawn from
    its own seeded generator, then sliced), so a TP run can be compared with
    :func:`pipeloom.models.llama.build_reference`. The full chunk is never held: its layers are made,
    initialised and sliced one at a time (the peak is the full embedding, head and one full layer).
    ``check_tp`` runs first, before anything is built.
    """
    from .llama import _TAG_EMBED, _TAG_HEAD, _TAG_LAYER0, _check_split, _generator, _init_

    check_tp(cfg, dist.get_world_size(group))
    split = _check_split(cfg, layers_per_chunk)
    n = len(split)
    which = list(range(n)) if chunks is None else [int(c) for c in chunks]
    for c in which:
        if not 0 <= c < n:
            raise ValueError(f"chunk {c} out of range: layers_per_chunk has {n} chunks")
    out = []
    for c in which:
        with torch.device("cpu"):
            m = LlamaChunk(cfg, [], first=c == 0, last=c == n - 1)  # no layers yet: they come one at a time
        if m.embed is not None:
            _init_(m.embed, _generator(seed, _TAG_EMBED), cfg)
        if m.head is not None:
            gen = _generator(seed, _TAG_HEAD)
            _init_(m.head, gen, cfg)
            _init_(m.norm, gen, cfg)
        m.layer_ids = list(split[c])
        for i in split[c]:
            with torch.device("cpu"):
                blk = Block(cfg)
            _init_(blk, _generator(seed, _TAG_LAYER0 + i), cfg)
            m.layers[str(i)] = blk
            shard_chunk_(m, group, sequence_parallel=sequence_parallel, blocks=[str(i)], ends=False)
        shard_chunk_(m, group, sequence_parallel=sequence_parallel, blocks=[])
        if dtype is not None:  # as build_chunk_modules: cast after the fp32 init (slicing commutes with rounding)
            m = m.to(dtype=dtype)
            m.rope_cos, m.rope_sin = m.rope_cos.float(), m.rope_sin.float()
        out.append(m.to(device) if device is not None else m)
    return out


