"""Parameters and FLOPs of every part of a :class:`~pipeloom.models.config.ModelConfig` (no torch).

One place counts what a transformer layer, the input embedding and the output head hold, for the
analytic memory model (:mod:`pipeloom.memory.analytic`), the layer cost model
(:mod:`pipeloom.partition.layer_costs`) and anyone else who needs a per-layer figure.

Parameters (``tp`` = tensor-parallel degree, Megatron's split: column-parallel Q/K/V, MLP up/gate
and experts, row-parallel output projections; norms, the router and row-parallel biases are
replicated)::

    attention   h*q + 2*h*kv + q*h            q = heads*head_dim, kv = kv_heads*head_dim
                + (q + 2*kv) with qkv_bias, + h with proj_bias, + 2*head_dim with qk_norm
    dense MLP   m*h*f  (m = 3 SwiGLU: gate, up, down; m = 2 GeLU: fc1, fc2) + (m-1)*f + h with mlp_bias
    MoE MLP     experts * (m*h*f_e [+ bias]) + router h*experts
                + shared_experts * (m*h*f_s [+ bias]) + h for a shared-expert gate
    norms       2 per layer, h weights each (RMSNorm) or h weights + h biases (LayerNorm)

All experts' weights are held (counted in :func:`layer_params`); a token only goes through the
top-k routed experts (and the shared ones), which is what the FLOPs count.

FLOPs per layer for ``tokens`` tokens of sequences of length ``s`` (one multiply-add = 2 FLOPs;
GEMMs only, as Narayanan et al. 2021 count them)::

    F = 2*tokens*P_active + 4*tokens*s*q            GEMMs + attention core (Q K^T and P V)
    B = 2*tokens*P_active + 8*tokens*s*q            input gradients (dX = dY W) + the core's backward
    W = 2*tokens*P_active                           weight gradients (dW = dY^T X)

where ``P_active`` counts the weight-GEMM parameters one token goes through: the attention
projections, the router, ``experts_per_token`` routed experts and the shared experts (all of the
dense MLP). The attention core has no weights, so its whole backward is in B, as in pipeloom's
runtime, which splits a layer's backward into B (input gradients) and W (weight gradients). The same
runtime defers only ``nn.Linear`` and ``Conv1D`` weight gradients (:mod:`pipeloom.autograd.splitgrad`);
transformers (5.x) holds routed experts as 3-D parameters run by grouped GEMMs and the router as a raw
parameter used with ``F.linear``, so their weight gradients (``2*tokens*P_undeferred``,
:func:`undeferred_params`) move from W to B: the costs and the memory model follow the split the runtime
performs. Shared experts and their gate are ``nn.Linear``: in W. The
``s x s`` score matrix is counted in full (no causal halving) and flash attention's recompute in
the backward is not counted, like the ``24*b*s*h^2*(1 + s/(6h))`` of Narayanan et al.
"""
from __future__ import annotations

from .config import ModelConfig
from .registry import get as _family


# ------------------------------------------------------------------------------------- parameters
def _norm(model: ModelConfig, width: int) -> int:
    return width * (2 if model.norm == "layernorm" else 1)


def attention_params(model: ModelConfig, tp: int = 1) -> int:
    """Q/K/V and output projections (+ their biases, + per-head q/k norms) on one TP rank."""
    h, q, kv = model.hidden, model.q_dim, model.kv_dim
    n = (h * q + 2 * h * kv) // tp + q * h // tp
    if model.qkv_bias:
        n += (q + 2 * kv) // tp
    if model.proj_bias:
        n += h
    if model.qk_norm:
        n += 2 * model.head_dim
    return n


def _mlp(model: ModelConfig, ffn: int, tp: int) -> int:
    m, h = model.mlp_matrices, model.hidden
    n = m * h * ffn // tp
    if model.mlp_bias:
        n += (m - 1) * ffn // tp + h
    return n


def mlp_params(model: ModelConfig, tp: int = 1) -> int:
    """The MLP block of one layer on one TP rank: the dense MLP, or every expert + router + shared experts."""
    if not model.moe:
        return _mlp(model, model.ffn, tp)
    n = model.experts * _mlp(model, model.expert_ffn, tp) + model.hidden * model.experts
    n += model.shared_experts * _mlp(model, model.shared_expert_ffn, tp)
    if model.shared_expert_gate:
        n += model.hidden
    return n


def layer_params(model: ModelConfig, tp: int = 1) -> int:
    """Parameters of one transformer layer on one TP rank (norm weights replicated); a family that counts
    its own layer (:attr:`pipeloom.models.registry.Family.layer_params`, by the model's ``arch``) answers."""
    fam = _family(model.arch) if model.arch else None
    if fam is not None and fam.layer_params is not None:
        return fam.layer_params(model, tp)
    return attention_params(model, tp) + mlp_params(model, tp) + 2 * _norm(model, model.hidden)


def embedding_params(model: ModelConfig, tp: int = 1) -> int:
    """Input embedding (vocab-parallel) + learned positions, held with the first chunk."""
    return model.vocab * model.hidden // tp + (model.seq * model.hidden if model.learned_positions else 0)


def head_params(model: ModelConfig, tp: int = 1, *, with_tied_copy: bool = True) -> int:
    """Final norm + output head, held with the last chunk. A tied head is the embedding matrix;
    Megatron keeps a copy of it on the last stage when that is another device (``with_tied_copy``)."""
    head = model.vocab * model.hidden // tp
    if model.tied_embeddings and not with_tied_copy:
        head = 0
    return _norm(model, model.hidden) + head


def layer_groups(model: ModelConfig) -> tuple[tuple[int, ModelConfig], ...]:
    """``(count, layer model)`` runs of the model's layers, in order: one run of ``model.layers`` times
    ``model`` unless the model's family says its layers differ
    (:attr:`pipeloom.models.registry.Family.layer_groups`: DeepSeek's first dense layers, then MoE)."""
    fam = _family(model.arch) if model.arch else None
    if fam is not None and fam.layer_groups is not None:
        groups = tuple((int(n), m) for n, m in fam.layer_groups(model) if n)
        if sum(n for n, _ in groups) != model.layers:
            raise ValueError(f"family {model.arch!r}: layer groups {[n for n, _ in groups]} do not sum to the "
                             f"model's {model.layers} layers")
        return groups
    return ((model.layers, model),)


def layers_params(model: ModelConfig, first: int, count: int, tp: int = 1) -> int:
    """Parameters of the ``count`` layers from layer ``first`` on one TP rank, each counted as its own kind
    (:func:`layer_groups`): what a pipeline chunk holding those layers holds of them. Equals
    ``count * layer_params(model, tp)`` when all layers are alike."""
    if first < 0 or count < 0 or first + count > model.layers:
        raise ValueError(f"layers {first}..{first + count - 1} are not within the model's {model.layers} layers")
    n, start = 0, 0
    for k, m in layer_groups(model):
        lo, hi = max(start, first), min(start + k, first + count)
        if hi > lo:
            n += (hi - lo) * layer_params(m, tp)
        start += k
    return n


def total_params(model: ModelConfig) -> int:
    """Unique parameters of the whole model (tied matrices counted once): what
    ``sum(p.numel() for p in model.parameters())`` gives for the same architecture in transformers."""
    return (sum(n * layer_params(m) for n, m in layer_groups(model)) + embedding_params(model)
            + head_params(model, with_tied_copy=False))


def _idle_expert_params(model: ModelConfig) -> int:
    """Parameters of the routed experts a token does not go through, in one layer (0 for a dense layer)."""
    if not model.moe:
        return 0
    return (model.experts - model.experts_per_token) * _mlp(model, model.expert_ffn, 1)


def active_params(model: ModelConfig) -> int:
    """Parameters one token goes through, the "active" size published for MoE models (Mixtral-8x7B: 12.9B,
    Qwen3-30B-A3B: 3.3B): the whole model with only ``experts_per_token`` routed experts per layer
    (plus the router and shared experts); embedding and head counted in full. Equals
    :func:`total_params` for a dense model."""
    return total_params(model) - sum(n * _idle_expert_params(m) for n, m in layer_groups(model))


def active_layer_params(model: ModelConfig) -> int:
    """Weight-GEMM parameters one token goes through in one layer (no biases or norms): the attention
    projections, and the dense MLP or the router + top-k routed experts + shared experts (+ their gate)."""
    h, m = model.hidden, model.mlp_matrices
    attn = h * model.q_dim + 2 * h * model.kv_dim + model.q_dim * h
    if not model.moe:
        return attn + m * h * model.ffn
    mlp = (h * model.experts + model.experts_per_token * m * h * model.expert_ffn
           + model.shared_experts * m * h * model.shared_expert_ffn)
    if model.shared_expert_gate:
        mlp += h
    return attn + mlp


# ------------------------------------------------------------------------------------- FLOPs
def _check_tokens(tokens) -> None:
    if isinstance(tokens, bool) or not isinstance(tokens, (int, float)) or tokens < 0:
        raise ValueError(f"tokens must be a number >= 0, got {tokens!r}")


def layer_flops(model: ModelConfig, tokens: int | float, *, seq: int | None = None) -> tuple[float, float, float]:
    """(F, B, W) FLOPs of one transformer layer for ``tokens`` tokens of sequences of length ``seq``
    (default: the model's ``seq``); formulas in the module docstring. B = input-gradient GEMMs and the
    attention core's backward, W = weight-gradient GEMMs. A family that counts its own layer
    (:attr:`pipeloom.models.registry.Family.layer_flops`, by the model's ``arch``) answers."""
    _check_tokens(tokens)
    s = model.seq if seq is None else seq
    fam = _family(model.arch) if model.arch else None
    if fam is not None and fam.layer_flops is not None:
        return tuple(float(x) for x in fam.layer_flops(model, tokens, s))
    gemm = 2.0 * tokens * active_layer_params(model)
    core = 4.0 * tokens * s * model.q_dim
    in_b = 2.0 * tokens * undeferred_params(model)  # their weight gradients: in B (see the module docstring)
    return gemm + core, gemm + 2.0 * core + in_b, gemm - in_b


def undeferred_params(model: ModelConfig) -> int:
    """Weight-GEMM parameters one token goes through whose weight gradients pipeloom's runtime makes in B:
    the router and the ``experts_per_token`` routed experts (raw parameters in transformers, not
    ``nn.Linear``); 0 for a dense model."""
    if not model.moe:
        return 0
    return model.hidden * model.experts + model.experts_per_token * model.mlp_matrices * model.hidden * model.expert_ffn


def head_flops(model: ModelConfig, tokens: int | float) -> tuple[float, float, float]:
    """(F, B, W) FLOPs of the vocabulary projection (one ``h x V`` GEMM each); the final norm and the
    loss are element-wise and not counted."""
    _check_tokens(tokens)
    g = 2.0 * tokens * model.hidden * model.vocab
    return g, g, g


def embedding_flops(model: ModelConfig, tokens: int | float) -> tuple[float, float, float]:
    """(F, B, W) FLOPs of the input embedding: a lookup, no GEMM (0, 0, 0)."""
    _check_tokens(tokens)
    return 0.0, 0.0, 0.0


__all__ = ["active_layer_params", "active_params", "layer_groups", "layers_params", "undeferred_params", "attention_params", "embedding_flops", "embedding_params", "head_flops",
           "head_params", "layer_flops", "layer_params", "mlp_params", "total_params"]
