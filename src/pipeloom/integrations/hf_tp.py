"""Tensor parallelism for transformers chunks (``pipeloom run --model PATH --tp N``; needs torch).

:func:`shard_hf_chunk_` replaces, in place, the GEMMs of a :class:`pipeloom.integrations.hf.HFChunk` of a
Llama-shaped model (``llama``, ``mistral``: separate q/k/v/o and gate/up/down projections without biases,
untied embedding and head) by this rank's shards, with the layers of :mod:`pipeloom.models.tp` (Megatron's
split, the same as the built-in Llama's)::

    self_attn.q_proj, k_proj, v_proj    column-parallel (query heads / key-value heads under Megatron's GQA rule)
    self_attn.o_proj                    row-parallel (all-reduce of the output)
    mlp.gate_proj, up_proj              column-parallel
    mlp.down_proj                       row-parallel
    embed_tokens                        vocab-parallel; lm_head column-parallel over the vocabulary (local logits)

The attention's ``num_key_value_groups`` becomes the local query heads per local key/value head (so that
transformers' ``repeat_kv`` pairs them as before). Parameter names stay the model's, each holding its shard
(``tp_shard`` as in :mod:`pipeloom.models.tp`), so ``--verify`` gathers them and compares with the unsplit
model. Not here: sequence parallelism, biases, tied embeddings, the other families (each refused in one line).

:func:`build_tp_chunks` is what ``run --model PATH --tp N`` builds (random weights from the seed): the model's
modules on ``meta``, cut into this rank's chunks, sharded by :func:`shard_spec`, and only the shards materialized
with the values of the whole seeded build (:mod:`pipeloom.integrations.hf_meta`: one full parameter at a time).
With ``--weights`` the shards are read alone from the safetensors files.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..models.tp import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, check_tp, tp_kv_layout

__all__ = ["TP_MODEL_TYPES", "build_tp_chunks", "check_hf_tp", "shard_hf_chunk_", "shard_spec"]

#: the transformers families whose chunks :func:`shard_hf_chunk_` shards
TP_MODEL_TYPES = ("llama", "mistral")


def _shape(cfg) -> SimpleNamespace:
    return SimpleNamespace(name=cfg.model_type, heads=cfg.num_attention_heads,
                           kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
                           ffn=cfg.intermediate_size, vocab=cfg.vocab_size)


def check_hf_tp(cfg, tp: int) -> None:
    """One-line ValueError unless a ``tp``-way split of this transformers config is supported and divides it."""
    if cfg.model_type not in TP_MODEL_TYPES:
        raise ValueError(f"--tp {tp} with --model: model_type {cfg.model_type!r} is not sharded yet; tensor "
                         f"parallelism shards {', '.join(TP_MODEL_TYPES)}")
    if getattr(cfg, "tie_word_embeddings", False):
        raise ValueError(f"--tp {tp} with --model: tied embedding and head (tie_word_embeddings) are not sharded yet")
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        raise ValueError(f"--tp {tp} with --model: projections with biases are not sharded yet")
    check_tp(_shape(cfg), tp)


def shard_spec(chunk: nn.Module, rank: int, t: int) -> dict[str, tuple[int, int, int]]:
    """``{parameter name: (dim, start, length)}``: the slice of each sharded full weight of ``chunk`` (an HFChunk,
    names as its ``named_parameters()``) that TP rank ``rank`` of ``t`` holds; replicated parameters (norms) are
    absent. Column-parallel weights are cut along dim 0 (q by query heads, k/v by key/value heads under Megatron's
    GQA rule, gate/up by the FFN, the embedding and the head by the vocabulary), row-parallel ones along dim 1."""
    cfg = chunk.config
    shape = _shape(cfg)
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    hl, fl, vl = shape.heads // t, shape.ffn // t, shape.vocab // t
    kv0, kvl, _ = tp_kv_layout(shape, t, rank)
    paths = {id(mod): name for name, mod in chunk.named_modules()}
    out: dict[str, tuple[int, int, int]] = {}

    def put(mod: nn.Module, dim: int, start: int, n: int) -> None:
        out[f"{paths[id(mod)]}.weight"] = (dim, start, n)

    for layer in chunk._parts["layers"]:
        a, m = layer.self_attn, layer.mlp
        put(a.q_proj, 0, rank * hl * hd, hl * hd)
        put(a.k_proj, 0, kv0 * hd, kvl * hd)
        put(a.v_proj, 0, kv0 * hd, kvl * hd)
        put(a.o_proj, 1, rank * hl * hd, hl * hd)
        put(m.gate_proj, 0, rank * fl, fl)
        put(m.up_proj, 0, rank * fl, fl)
        put(m.down_proj, 1, rank * fl, fl)
    for role in ("embed", "head"):
        if chunk._parts[role] is not None:
            put(chunk._parts[role], 0, rank * vl, vl)
    return out


def _put(mod: nn.Module, w: torch.Tensor) -> nn.Module:
    """``mod`` (built on meta) holding ``w`` as its weight, with the attributes its weight was given."""
    old = mod.weight
    new = nn.Parameter(w, requires_grad=old.requires_grad)
    new.__dict__.update(old.__dict__)  # tp_shard, tp_partial_ranks
    mod.weight = new
    return mod


@torch.no_grad()
def shard_hf_chunk_(chunk: nn.Module, group, values: Mapping[str, torch.Tensor] | None = None) -> nn.Module:
    """This TP rank's shards of ``chunk`` (an HFChunk), in place; returns ``chunk``.

    Without ``values`` the shards are cut from the chunk's own (full) weights; with ``values`` (parameter name ->
    this rank's shard, as :func:`build_tp_chunks` makes them) the chunk may be on ``meta`` and its sharded weights
    are taken from there (its other tensors are left as they are)."""
    cfg = chunk.config
    rank, t = dist.get_rank(group), dist.get_world_size(group)
    check_hf_tp(cfg, t)
    spec = shard_spec(chunk, rank, t)
    shape = _shape(cfg)
    hidden = cfg.hidden_size
    paths = {id(mod): name for name, mod in chunk.named_modules()}
    kvl, rep = tp_kv_layout(shape, t, rank)[1:]

    def shard(old: nn.Module) -> torch.Tensor:
        name = f"{paths[id(old)]}.weight"
        if values is not None:
            return values[name]
        dim, start, n = spec[name]
        return old.weight.detach().narrow(dim, start, n).clone(memory_format=torch.contiguous_format)

    def swap(parent: nn.Module, leaf: str, make) -> nn.Module:
        old = getattr(parent, leaf)
        with torch.device("meta"):  # allocates nothing, draws nothing: the weight comes from shard()
            new = make()
        setattr(parent, leaf, _put(new, shard(old)))
        return new

    for i, layer in zip(chunk.layer_ids, chunk._parts["layers"]):
        a, m = layer.self_attn, layer.mlp
        what = f"layer {i} "
        hl_hd = spec[f"{paths[id(a.q_proj)]}.weight"][2]  # local query heads x head_dim
        kv_hd = spec[f"{paths[id(a.k_proj)]}.weight"][2]  # local key/value heads x head_dim
        fl = spec[f"{paths[id(m.gate_proj)]}.weight"][2]
        swap(a, "q_proj", lambda: ColumnParallelLinear(hidden, hl_hd, group, what=what + "q_proj"))
        for name in ("k_proj", "v_proj"):
            new = swap(a, name, lambda name=name: ColumnParallelLinear(hidden, kv_hd, group, rows_per_shard=rep,
                                                                       what=what + name))
            if rep > 1:  # each rank's query heads add their part to a replicated head's gradient
                new.weight.tp_partial_ranks = rep
        swap(a, "o_proj", lambda: RowParallelLinear(hl_hd, hidden, group))
        a.num_key_value_groups = shape.heads // t // kvl
        swap(m, "gate_proj", lambda: ColumnParallelLinear(hidden, fl, group, what=what + "gate_proj"))
        swap(m, "up_proj", lambda: ColumnParallelLinear(hidden, fl, group, what=what + "up_proj"))
        swap(m, "down_proj", lambda: RowParallelLinear(fl, hidden, group))
    for role, make in (("embed", lambda: VocabParallelEmbedding(shape.vocab, hidden, group)),
                       ("head", lambda: ColumnParallelLinear(hidden, shape.vocab // t, group, what="lm_head"))):
        old = chunk._parts[role]
        if old is None:
            continue
        parent, _, leaf = paths[id(old)].rpartition(".")
        chunk._parts[role] = swap(chunk.get_submodule(parent) if parent else chunk, leaf, make)
    for p in chunk.parameters():
        if not hasattr(p, "tp_shard"):
            p.tp_shard = None  # replicated (norms)
    chunk.tp_group = group
    return chunk


def build_tp_chunks(model: nn.Module, chunks: Sequence[nn.Module], seed: int, group,
                    weights: str | None = None) -> list[nn.Module]:
    """This TP rank's shards of ``chunks`` (HFChunks of ``model``, a
    :func:`~pipeloom.integrations.hf_meta.meta_model`), with the values
    :func:`pipeloom.integrations.hf.build_model` gives them (bitwise), without building the model: only this
    rank's shards (and its chunks' replicated norms and rotary buffers) are materialized. Random weights from
    ``seed``: one full parameter at a time (:func:`~pipeloom.integrations.hf_meta.seeded_init`; the peak is the
    shards kept plus the largest full parameter); ``weights`` (a directory of safetensors files): each slice read
    alone (:func:`~pipeloom.integrations.hf_meta.load_slices`). Returns ``chunks``, sharded in place."""
    from .hf_meta import init_buffers, load_slices, materialize_, meta_tensors, seeded_init

    rank, t = dist.get_rank(group), dist.get_world_size(group)
    check_hf_tp(model.config, t)
    cuts: dict[str, tuple[int, int, int] | None] = {}
    buffers: set[str] = set()
    for ch in chunks:
        spec = shard_spec(ch, rank, t)
        cuts.update((name, spec.get(name)) for name, _ in ch.named_parameters())
        buffers.update(name for name, _ in ch.named_buffers())
    if weights is None:
        keep = {n: (lambda w, c=c: w.narrow(*c)) if c is not None else (lambda w: w)
                for n, c in (*cuts.items(), *((b, None) for b in buffers))}
        values = seeded_init(model, seed, keep)
    else:
        values = {**load_slices(weights, cuts), **init_buffers(model, buffers)}
    for ch in chunks:
        materialize_(shard_hf_chunk_(ch, group, values=values), values)
        left = meta_tensors(ch)
        if left:
            raise RuntimeError(f"--model --tp: {', '.join(left[:4])} not materialized")
    return chunks
