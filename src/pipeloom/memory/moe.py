"""The memory of expert parallelism, multi-head latent attention, light recompute and FP8 activations (no torch).

:mod:`pipeloom.memory.layers` lists every saved tensor of a layer; this module adds what a MoE model trained
with expert parallelism changes, as plain ``(name, bytes, w_input, core)`` tuples the layer model turns
into its items (so that this module never imports it):

* **routed expert activations** (Megatron's fused path, ``impl='fused'``: the routing weight applied inside
  the expert's SwiGLU, ``weighted_bias_swiglu_impl`` of Megatron-Core's ``experts.py``, "moving the probs
  multiplication from unpermutation to activation function of GroupedMLP" in its MoE README, v0.13, so no ``h``-wide
  expert output is kept; transformers' ``'hf'``/``'eager'`` modules weigh the output and keep it) scale with
  the load a rank's experts carry, ``load =`` the capacity factor or the dropless imbalance assumption
  (:func:`pipeloom.models.moe.load_factor`);
* **routing buffers** (transient, :func:`routing_buffer_bytes`, ep > 1): while a dispatch or combine all-to-all runs,
  its send and its receive buffer, ``2 * tokens * k * h * load`` values (the dispatch in FP8 with ``fp8``);
* **MLA** (DeepSeek-V2/V3, :func:`mla_items`): the low-rank latents, their RMSNorms, the up-projected
  per-head queries, keys and values and the attention output, instead of the generic Q/K/V items;
* **light recompute** (``recompute_norms``; DeepSeek-V3 report sec. 3.2.3 "Recomputation of RMSNorm and MLA
  Up-Projection", sec. 3.3.3 "we cache the inputs of the SwiGLU operator and recompute its output"): the
  outputs of every RMSNorm, of MLA's up-projections and of the routed experts' SwiGLU are recomputed in B
  instead of kept from F (:data:`LIGHT_RECOMPUTED`); B re-makes them, so they are still held from B to W
  (the ``H`` of a B/W split keeps them);
* **FP8** (``fp8``; DeepSeek-V3 sec. 3.3.3 "Low-Precision Storage", Transformer Engine's FP8 ``Linear``): the
  inputs of the weight GEMMs are cached in FP8 for the weight-gradient GEMM, 1 byte per value instead of
  the activation dtype's (:func:`fp8_bytes`); the FP8 copy of each weight, 1 byte per parameter, is kept
  beside the 16-bit one (:func:`fp8_weight_bytes`).

Static memory of expert parallelism (:func:`split_static`): a rank holds ``experts / ep`` routed experts of
each MoE layer (:func:`pipeloom.models.moe.expert_params`); with ZeRO-1 their optimizer states are sharded
over the expert-data-parallel group (``dp * cp / ep`` ranks), the dense ones over ``dp * cp``.
"""
from __future__ import annotations

import dataclasses

from ..models.config import ModelConfig
from ..models.moe import FP8_BYTES, ParallelLayoutError, check_ep, load_factor

#: the items light recompute does not keep from F: the outputs of the RMSNorms (inputs of the GEMMs after
#: them) and of MLA's up-projections (the per-head q, k, v)
LIGHT_RECOMPUTED = frozenset({"qkv.input", "fc1.input", "router.input", "mla.a_input", "mla.q_b.input",
                              "mla.kv_b.input", "attn.q", "attn.k", "attn.v", "experts.fc2.input"})
#: besides the weight GEMMs' inputs, what FP8 caches (name suffixes): the routed experts' GEMM and SwiGLU
#: inputs (DeepSeek-V3 sec. 3.3.3: "Inputs of the SwiGLU Operator in MoE ... stored in FP8")
FP8_CACHED = (".fc1.input", ".fc2.input", ".swiglu.gate_up")


def train_error(train) -> str | None:
    """What is wrong with the MoE / long-context / FP8 fields of a ``TrainConfig`` (None: nothing)."""
    for f in ("ep", "cp"):
        v = getattr(train, f)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            return f"{f} must be an integer >= 1, got {v!r}"
    try:
        load_factor(train.capacity_factor, train.moe_imbalance)
    except ParallelLayoutError as e:
        return str(e)
    if train.cp > 1 and train.attention == "math":
        return "context parallelism (cp > 1) runs ring attention, a flash-style kernel: use attention 'flash'"
    if train.fp8 and train.dtype == "fp32":
        return "fp8 GEMMs need a 16-bit dtype (bf16 or fp16) for the rest of the model"
    return None


def local_train(model: ModelConfig, train):
    """``train`` as one context-parallel rank sees it, after checking ``ep`` against the model
    (:func:`pipeloom.models.moe.check_ep`): ``seq / cp`` tokens of each sequence, split zig-zag (two chunks of
    ``seq / (2 cp)``, Megatron's causal load balance); ring attention keeps no ``s x s`` matrix, so every
    activation scales with the local tokens."""
    check_ep(model, ep=train.ep, dp=train.dp, cp=train.cp)
    if train.cp == 1:
        return train
    s = train.seq or model.seq
    if s % (2 * train.cp):
        raise ParallelLayoutError(f"context parallelism needs seq={s} divisible by 2*cp={2 * train.cp} (the "
                                  f"zig-zag split gives each rank two chunks of seq / (2*cp) tokens)")
    return dataclasses.replace(train, seq=s // train.cp, cp=1)


def is_mla(model: ModelConfig) -> bool:
    """True for DeepSeek's multi-head latent attention (a model with a ``kv_lora_rank``)."""
    return hasattr(model, "kv_lora_rank")


def train_load(train) -> float:
    """The load factor of ``train`` (capacity factor, else the dropless imbalance)."""
    return load_factor(getattr(train, "capacity_factor", None), getattr(train, "moe_imbalance", 1.0))


def fp8_bytes(nbytes: float, elem: int) -> float:
    """``nbytes`` of a tensor of ``elem``-byte values cached in FP8 instead."""
    return nbytes * FP8_BYTES / elem


def mla_items(model, train, tokens: float, rep: int) -> list[tuple[str, float, bool, bool]]:
    """MLA's saved tensors after its input norm, one microbatch on one TP rank (flash attention; heads split
    tp ways as Megatron-Core's ``MLASelfAttention``; the down projections replicated):

    ``mla.a_input`` the norm output (input of ``q_a_proj`` and ``kv_a_proj_with_mqa``), ``h``; the query
    latent ``r_q`` into its RMSNorm (input + fp32 rstd) and that norm's output into ``q_b_proj``; the KV latent
    ``r_kv`` likewise into ``kv_b_proj``; the per-head ``q`` and ``k`` (``H*(d_n + d_r)``) and ``v``
    (``H*d_v``) for the attention kernel, its fp32 log-sum-exp (``4*H``) and its output (``H*d_v``, the input
    of ``o_proj``). Without ``q_lora_rank`` the query comes from a full ``q_proj`` of ``mla.a_input``."""
    e, t, H = train.elem, train.tp, model.heads
    r_q, r_kv = model.q_lora_rank, model.kv_lora_rank
    dq, dv = model.qk_nope_head_dim + model.qk_rope_head_dim, model.v_head_dim
    out = [("mla.a_input", e * model.hidden * tokens / rep, True, False)]
    if r_q:
        out += [("mla.q_latent", e * r_q * tokens, False, False), ("mla.q_latent.rstd", 4 * tokens, False, False),
                ("mla.q_b.input", e * r_q * tokens, True, False)]
    out += [("mla.kv_latent", e * r_kv * tokens, False, False), ("mla.kv_latent.rstd", 4 * tokens, False, False),
            ("mla.kv_b.input", e * r_kv * tokens, True, False),
            ("attn.q", e * H * dq * tokens / t, False, False), ("attn.k", e * H * dq * tokens / t, False, False),
            ("attn.v", e * H * dv * tokens / t, False, False), ("attn.lse", 4 * H * tokens / t, False, True),
            ("proj.input", e * H * dv * tokens / t, True, False)]
    return out


def mla_w_grads(model, train, tokens: float) -> float:
    """Output gradients of MLA's weight GEMMs kept from B to W (bytes): ``q_a`` (``r_q``), ``q_b``
    (``H*d_q/t``), ``kv_a`` (``r_kv + d_r``), ``kv_b`` (``H*(d_n + d_v)/t``) and ``o_proj`` (``h``, full
    width: row parallel)."""
    e, t, H = train.elem, train.tp, model.heads
    dq = model.qk_nope_head_dim + model.qk_rope_head_dim
    per = ((model.q_lora_rank or 0) + model.kv_lora_rank + model.qk_rope_head_dim + model.hidden
           + H * dq / t + H * (model.qk_nope_head_dim + model.v_head_dim) / t)
    return e * per * tokens


def routing_buffer_bytes(model: ModelConfig, train, tokens: float) -> float:
    """Transient bytes of one all-to-all in flight (ep > 1): its send and receive buffers of ``tokens * k * h * load``
    values each (FP8 for the dispatch with ``fp8``, the activation dtype for the combine: the larger)."""
    if not model.moe or train.ep == 1:  # no all-to-all without expert parallelism
        return 0.0
    rep = train.tp if train.sequence_parallel else 1
    return 2.0 * train.elem * tokens / rep * model.experts_per_token * model.hidden * train_load(train)


def fp8_weight_bytes(params: int, train) -> int:
    """The FP8 copy of a device's weights kept beside the 16-bit ones (1 byte per parameter) with ``fp8``."""
    return params * FP8_BYTES if getattr(train, "fp8", False) else 0


def split_static(static_bytes, params: int, expert: int, train, expert_dp: int) -> tuple[int, int, int]:
    """(params, grads, optimizer) bytes of a device holding ``params`` parameters of which ``expert`` are
    routed-expert ones: the dense part under ``train``'s ZeRO over dp, the expert part over ``expert_dp``
    ranks (module docstring); ``static_bytes`` is the layer model's per-parameter rule. The FP8 weight copy
    goes with the weights."""
    dense = static_bytes(params - expert, train)
    if expert:
        ex = static_bytes(expert, dataclasses.replace(train, dp=max(1, expert_dp)))
        dense = tuple(a + b for a, b in zip(dense, ex))
    p, g, o = dense
    return p + fp8_weight_bytes(params, train), g, o


def mtp_chunk(model, train, layer_a: float, layer_h: float, head_items, head_w: float) -> tuple[int, int, float, float]:
    """What DeepSeek-V3's ``mtp_layers`` multi-token prediction modules add to the last chunk, which also holds
    the output head they share (report sec. 2.2, 3.2.3 "Shared Embedding and Output Head for Multi-Token
    Prediction"): (parameters, of which routed experts, F's activation bytes, bytes held from B to W).

    Per module: one MoE layer (experts / ep on this rank) + ``eh_proj`` (``2h x h``) + three RMSNorms; its F
    keeps one layer's activations, the ``eh_proj`` input (``2h`` per token) and a second pass through the
    shared head (its input and fp32 log-softmax): ``layer_a + e*2h*tokens + head``."""
    from ..models.flops import layer_params
    from ..models.moe import routed_expert_params

    n, t, ep, h = model.mtp_layers, train.tp, train.ep, model.hidden
    routed = routed_expert_params(model, t)                    # 0 for a dense model
    mine = routed // ep                                        # experts / ep of them on this rank
    p = n * (layer_params(model, t) - routed + mine + 2 * h * h // t + 3 * h)  # layer, eh_proj, 3 RMSNorms
    tokens = (train.seq or model.seq) * train.micro_batch
    head_a = sum(it.bytes for it in head_items)
    eh_in = train.elem * 2 * model.hidden * tokens / (t if train.sequence_parallel else 1)
    a = n * (layer_a + eh_in + head_a)
    held = n * (layer_h + eh_in + sum(it.bytes for it in head_items if it.w_input) + head_w)
    return p, n * mine, a, held


__all__ = ["FP8_CACHED", "LIGHT_RECOMPUTED", "fp8_bytes", "fp8_weight_bytes", "is_mla", "local_train", "mla_items",
           "mla_w_grads", "mtp_chunk", "routing_buffer_bytes", "split_static", "train_error", "train_load"]
