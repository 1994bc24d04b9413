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
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn

from ..models.tp import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, check_tp, tp_kv_layout

__all__ = ["TP_MODEL_TYPES", "check_hf_tp", "shard_hf_chunk_"]

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


def _load(mod: nn.Module, w: torch.Tensor) -> nn.Module:
    mod.weight.data = w.detach().clone().contiguous()
    return mod


@torch.no_grad()
def shard_hf_chunk_(chunk: nn.Module, group) -> nn.Module:
    """This TP rank's shards of ``chunk`` (an HFChunk), in place; returns ``chunk``."""
    cfg = chunk.config
    rank, t = dist.get_rank(group), dist.get_world_size(group)
    check_hf_tp(cfg, t)
    shape = _shape(cfg)
    hidden, hd = cfg.hidden_size, getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    hl, fl, vl = shape.heads // t, shape.ffn // t, shape.vocab // t
    kv0, kvl, rep = tp_kv_layout(shape, t, rank)
    for i, layer in zip(chunk.layer_ids, chunk._parts["layers"]):
        a, m = layer.self_attn, layer.mlp
        what = f"layer {i} "
        a.q_proj = _load(ColumnParallelLinear(hidden, hl * hd, group, what=what + "q_proj"),
                         a.q_proj.weight[rank * hl * hd:(rank + 1) * hl * hd])
        for name in ("k_proj", "v_proj"):
            new = _load(ColumnParallelLinear(hidden, kvl * hd, group, rows_per_shard=rep, what=what + name),
                        getattr(a, name).weight[kv0 * hd:(kv0 + kvl) * hd])
            if rep > 1:  # each rank's query heads add their part to a replicated head's gradient
                new.weight.tp_partial_ranks = rep
            setattr(a, name, new)
        a.o_proj = _load(RowParallelLinear(hl * hd, hidden, group), a.o_proj.weight[:, rank * hl * hd:(rank + 1) * hl * hd])
        a.num_key_value_groups = hl // kvl
        m.gate_proj = _load(ColumnParallelLinear(hidden, fl, group, what=what + "gate_proj"),
                            m.gate_proj.weight[rank * fl:(rank + 1) * fl])
        m.up_proj = _load(ColumnParallelLinear(hidden, fl, group, what=what + "up_proj"),
                          m.up_proj.weight[rank * fl:(rank + 1) * fl])
        m.down_proj = _load(RowParallelLinear(fl, hidden, group), m.down_proj.weight[:, rank * fl:(rank + 1) * fl])
    paths = {id(mod): name for name, mod in chunk.named_modules()}
    for role, make in (("embed", lambda old: VocabParallelEmbedding(shape.vocab, hidden, group)),
                       ("head", lambda old: ColumnParallelLinear(hidden, vl, group, what="lm_head"))):
        old = chunk._parts[role]
        if old is None:
            continue
        new = _load(make(old), old.weight[rank * vl:(rank + 1) * vl])
        parent, _, leaf = paths[id(old)].rpartition(".")
        setattr(chunk.get_submodule(parent) if parent else chunk, leaf, new)
        chunk._parts[role] = new
    for p in chunk.parameters():
        if not hasattr(p, "tp_shard"):
            p.tp_shard = None  # replicated (norms)
    chunk.tp_group = group
    return chunk
