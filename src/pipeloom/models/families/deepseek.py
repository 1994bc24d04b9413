"""``deepseek_v3`` and ``deepseek_v2``: multi-head latent attention (MLA) with low-rank queries and keys/values,
the first ``first_k_dense_replace`` layers dense, then MoE layers (routed experts + shared experts), and for
V3 the multi-token prediction (MTP) modules.

Sources: DeepSeek-V2 (arXiv 2405.04434) sec. 2.1, eq. 9-19 (MLA); DeepSeek-V3 (arXiv 2412.19437) sec. 2.1
(DeepSeekMoE), 2.2 (MTP, fig. 3) and 4.2 (hyper-parameters); the counts follow transformers' (5.x)
``modeling_deepseek_v3.py`` / ``modeling_deepseek_v2.py`` module by module, and ``MtpLayer`` of its
``modeling_layers.py`` for the MTP modules.

One layer (``h`` hidden, ``H`` heads, ``r_q`` = ``q_lora_rank``, ``r_kv`` = ``kv_lora_rank``, ``d_n``/``d_r`` =
``qk_nope_head_dim``/``qk_rope_head_dim``, ``d_v`` = ``v_head_dim``, ``d_q = d_n + d_r``)::

    attention  q_a_proj h*r_q + q_a_layernorm r_q + q_b_proj r_q*H*d_q      (r_q null: q_proj h*H*d_q)
               + kv_a_proj_with_mqa h*(r_kv + d_r) + kv_a_layernorm r_kv + kv_b_proj r_kv*H*(d_n + d_v)
               + o_proj H*d_v*h                 (+ r_q, r_kv + d_r and h biases with attention_bias)
    dense MLP  3*h*intermediate_size             (the first first_k_dense_replace layers)
    MoE MLP    n_routed_experts * 3*h*moe_intermediate_size + router h*n_routed_experts
               + one shared MLP of width moe_intermediate_size * n_shared_experts
    norms      2*h

Tensor parallelism splits MLA as Megatron-Core's ``MLASelfAttention`` does: the down projections
(``q_a_proj``, ``kv_a_proj_with_mqa``) and the low-rank norms replicated, ``q_b_proj`` and ``kv_b_proj``
column-parallel over the heads, ``o_proj`` row-parallel.

FLOPs (one multiply-add = 2, as :mod:`pipeloom.models.flops`): ``2*tokens`` per weight-GEMM parameter a token
goes through (all the MLA projections above: training runs the naive, non-absorbed form that expands the
latent into per-head keys and values), plus the attention core ``2*tokens*s*H*d_q`` (``Q K^T``) and
``2*tokens*s*H*d_v`` (``P V``), twice that in B. MoE layers: router + top-k routed experts + shared experts;
the router's and routed experts' weight gradients are made in B (3-D parameters in transformers, as for the
other MoE families).

An MTP module (V3 report, sec. 2.2) is one more MoE layer plus ``eh_proj`` (``2h x h``) and three RMSNorms
(``enorm``, ``hnorm`` and the output norm, transformers' ``post_norm``, the checkpoint's ``shared_head.norm``);
it shares the embedding and the output head with the main model. transformers' ``DeepseekV3ForCausalLM``
does not build it (its ``MtpModel`` does, for speculative decoding), so :func:`pipeloom.models.flops.total_params`
leaves it out, like the 671B the report publishes; :func:`mtp_params` counts it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config import ModelConfig, ModelConfigError
from ..registry import Family, register
from .common import rope_theta


@dataclass(frozen=True, kw_only=True, slots=True)
class MLAConfig(ModelConfig):
    """A :class:`ModelConfig` with DeepSeek's MLA widths, dense first layers and MTP modules.

    The inherited fields describe the MoE layer (``experts`` ..., ``ffn`` = the dense layers' width);
    ``head_size`` is ``qk_nope_head_dim + qk_rope_head_dim`` (the query/key head) so that the shared
    per-head widths read by the activation model are the widest of MLA's."""

    q_lora_rank: int | None = None
    """rank of the query down-projection; None = a full ``q_proj`` (DeepSeek-V2-Lite)"""
    kv_lora_rank: int = 512
    """rank of the compressed key/value latent (the KV cache of one token)"""
    qk_nope_head_dim: int = 128
    """per-head query/key width without rotary"""
    qk_rope_head_dim: int = 64
    """per-head query width with rotary; the key's rotary part is one vector shared by all heads"""
    v_head_dim: int = 128
    """per-head value width"""
    attention_bias: bool = False
    """biases on ``q_a_proj``, ``kv_a_proj_with_mqa`` and ``o_proj``"""
    dense_layers: int = 0
    """the first ``first_k_dense_replace`` layers have a dense MLP of width ``ffn``, the others are MoE"""
    mtp_layers: int = 0
    """multi-token prediction modules (``num_nextn_predict_layers``): not in transformers' causal LM"""

    def __post_init__(self) -> None:
        ModelConfig.__post_init__(self)
        for f in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ModelConfigError(f"model {f} must be an integer >= 1, got {v!r}")
        if self.q_lora_rank is not None and (not isinstance(self.q_lora_rank, int) or self.q_lora_rank < 1):
            raise ModelConfigError(f"model q_lora_rank must be an integer >= 1 or None, got {self.q_lora_rank!r}")
        for f in ("dense_layers", "mtp_layers"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ModelConfigError(f"model {f} must be an integer >= 0, got {v!r}")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


# ------------------------------------------------------------------------------------- counts
def mla_gemm_params(model: MLAConfig, tp: int = 1) -> int:
    """Weights of the MLA projections on one TP rank (no biases, no norms)."""
    h, H, r_kv = model.hidden, model.heads, model.kv_lora_rank
    n = h * (r_kv + model.qk_rope_head_dim) + r_kv * H * (model.qk_nope_head_dim + model.v_head_dim) // tp
    if model.q_lora_rank is None:
        n += h * H * model.qk_head_dim // tp
    else:
        n += h * model.q_lora_rank + model.q_lora_rank * H * model.qk_head_dim // tp
    return n + H * model.v_head_dim * h // tp


def mla_params(model: MLAConfig, tp: int = 1) -> int:
    """The MLA block on one TP rank: projections, the low-rank norms and the biases."""
    n = mla_gemm_params(model, tp) + model.kv_lora_rank + (model.q_lora_rank or 0)
    if model.attention_bias:
        n += (model.q_lora_rank or 0) + model.kv_lora_rank + model.qk_rope_head_dim + model.hidden
    return n


def _swiglu(model: ModelConfig, width: int, tp: int, bias: bool) -> int:
    return 3 * model.hidden * width // tp + ((2 * width // tp + model.hidden) if bias else 0)


def mlp_params(model: MLAConfig, tp: int = 1) -> int:
    """The MLP of one layer on one TP rank: dense (``ffn``), or routed experts + router + the shared MLP."""
    if not model.moe:
        return _swiglu(model, model.ffn, tp, model.mlp_bias)
    return (model.experts * _swiglu(model, model.expert_ffn, tp, False) + model.hidden * model.experts
            + model.shared_experts * _swiglu(model, model.shared_expert_ffn, tp, model.mlp_bias))


def layer_params(model: MLAConfig, tp: int = 1) -> int:
    """One layer on one TP rank (its MLP dense or MoE by ``model.experts``)."""
    return mla_params(model, tp) + mlp_params(model, tp) + 2 * model.hidden


def active_layer_params(model: MLAConfig) -> int:
    """Weight-GEMM parameters one token goes through in one layer."""
    h = model.hidden
    mlp = 3 * h * model.ffn if not model.moe else (
        h * model.experts + model.experts_per_token * 3 * h * model.expert_ffn
        + model.shared_experts * 3 * h * model.shared_expert_ffn)
    return mla_gemm_params(model) + mlp


def layer_flops(model: MLAConfig, tokens: float, seq: int) -> tuple[float, float, float]:
    """(F, B, W) of one layer (module docstring): GEMMs + the core ``2*tokens*s*H*(d_q + d_v)``."""
    gemm = 2.0 * tokens * active_layer_params(model)
    core = 2.0 * tokens * seq * model.heads * (model.qk_head_dim + model.v_head_dim)
    in_b = 0.0
    if model.moe:  # router + routed experts: 3-D / raw parameters in transformers, weight grads made in B
        in_b = 2.0 * tokens * (model.hidden * model.experts
                               + model.experts_per_token * 3 * model.hidden * model.expert_ffn)
    return gemm + core, gemm + 2.0 * core + in_b, gemm - in_b


def dense_layer(model: MLAConfig) -> MLAConfig:
    """The same model with a dense MLP of width ``ffn`` (one of the first ``dense_layers`` layers)."""
    return dataclasses.replace(model, experts=0, experts_per_token=0, shared_experts=0)


def layer_groups(model: MLAConfig):
    k = min(model.dense_layers, model.layers)
    if not model.moe:
        return ((model.layers, model),)
    return ((k, dense_layer(model)), (model.layers - k, model))


def mtp_params(model: MLAConfig) -> int:
    """Parameters of the model's ``mtp_layers`` multi-token prediction modules (embedding and head shared
    with the main model, not counted): per module one MoE layer (a dense one if the model has no experts),
    ``eh_proj`` ``2h x h`` and three RMSNorms of ``h``."""
    h = model.hidden
    return model.mtp_layers * (layer_params(model) + 2 * h * h + 3 * h)


def mtp_active_params(model: MLAConfig) -> int:
    """What one token goes through in the MTP modules: :func:`mtp_params` with only the top-k routed experts."""
    idle = (model.experts - model.experts_per_token) * 3 * model.hidden * model.expert_ffn if model.moe else 0
    return mtp_params(model) - model.mtp_layers * idle


def mla_bytes_per_token(model: MLAConfig, e: int = 2) -> float:
    """Bytes one token of MLA saves for the backward after the input norm (16-bit, flash attention, one TP
    rank): the norm output ``h``, the query latent ``r_q`` into its RMSNorm (+ fp32 rstd) and out of it, the
    same for the KV latent ``r_kv``, q and k (``H*d_q`` each), v (``H*d_v``), the fp32 log-sum-exp ``4H`` and
    the attention output ``H*d_v``; :func:`pipeloom.memory.moe.mla_items` lists the same tensors."""
    H, dq, dv = model.heads, model.qk_head_dim, model.v_head_dim
    n = e * model.hidden + (2 * e * model.q_lora_rank + 4 if model.q_lora_rank else 0)
    return n + 2 * e * model.kv_lora_rank + 4 + 2 * e * H * dq + 2 * e * H * dv + 4 * H


# ------------------------------------------------------------------------------------- reader
def _read(r, label):
    if r.bool("mlp_bias", False):
        raise ModelConfigError(f"{r.where}: field 'mlp_bias' is true; pipeloom models {r.arch} without MLP biases")
    heads = r.int("num_attention_heads")
    layers = r.int("num_hidden_layers")
    E = r.raw("n_routed_experts")
    k = r.raw("num_experts_per_tok")
    dense = r.raw("first_k_dense_replace")
    if dense is None:
        dense = 0
    if isinstance(dense, bool) or not isinstance(dense, int) or dense < 0:
        raise ModelConfigError(f"{r.where}: field 'first_k_dense_replace' must be an integer >= 0, got {dense!r}")
    moe = E not in (None, 0) and dense < layers
    if moe:
        E, k = r.int("n_routed_experts"), r.int("num_experts_per_tok")
        shared = r.raw("n_shared_experts")
        if shared is not None and (isinstance(shared, bool) or not isinstance(shared, int) or shared < 0):
            raise ModelConfigError(f"{r.where}: field 'n_shared_experts' must be an integer >= 0, got {shared!r}")
        if not shared:
            # transformers builds a shared MLP of width moe_intermediate_size * n_shared_experts regardless
            raise ModelConfigError(f"{r.where}: field 'n_shared_experts' is {shared!r}; pipeloom models {r.arch} "
                                   f"with at least one shared expert (as every published config has)")
        moe_ffn = r.int("moe_intermediate_size")
        experts = dict(experts=E, experts_per_token=k, expert_ffn=moe_ffn, shared_experts=1,
                       shared_expert_ffn=moe_ffn * shared)
    else:
        experts = {}
    return MLAConfig(
        name=label, arch=r.arch, hidden=r.int("hidden_size"), layers=layers, heads=heads, kv_heads=heads,
        vocab=r.int("vocab_size"), seq=r.int("max_position_embeddings"), norm_eps=r.float("rms_norm_eps"),
        rope_theta=rope_theta(r), init_std=r.float("initializer_range", 0.02),
        dropout=r.float("attention_dropout", 0.0), tied_embeddings=r.bool("tie_word_embeddings"), mlp="swiglu",
        norm="rmsnorm", ffn=r.int("intermediate_size"), head_size=r.int("qk_nope_head_dim") + r.int("qk_rope_head_dim"),
        q_lora_rank=r.int("q_lora_rank", none_ok=True), kv_lora_rank=r.int("kv_lora_rank"),
        qk_nope_head_dim=r.int("qk_nope_head_dim"), qk_rope_head_dim=r.int("qk_rope_head_dim"),
        v_head_dim=r.int("v_head_dim"), attention_bias=r.bool("attention_bias"), dense_layers=dense,
        **experts)


def read_v3(r, label):
    n = r.raw("num_nextn_predict_layers", None)
    if n is None:
        n = r.raw("num_mtp_layers", 0)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ModelConfigError(f"{r.where}: field 'num_nextn_predict_layers' must be an integer >= 0, got {n!r}")
    return dataclasses.replace(_read(r, label), mtp_layers=n)


def read_v2(r, label):
    return _read(r, label)


_DEFAULTS = dict(rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                 qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, kv_lora_rank=512, q_lora_rank=1536)

FAMILY_V3 = register(Family(
    model_type="deepseek_v3", read=read_v3, layer_params=layer_params, layer_flops=layer_flops,
    layer_groups=layer_groups, torch=None,
    summary="MLA (``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``/``qk_rope_head_dim``, ``v_head_dim``); "
            "the first ``first_k_dense_replace`` layers dense, then ``n_routed_experts`` experts of "
            "``moe_intermediate_size``, top ``num_experts_per_tok``, ``n_shared_experts`` shared; MTP modules "
            "(``num_nextn_predict_layers``) counted apart",
    defaults=dict(_DEFAULTS, vocab_size=129280, hidden_size=7168, intermediate_size=18432,
                  moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128, n_shared_experts=1,
                  n_routed_experts=256, num_experts_per_tok=8, first_k_dense_replace=3,
                  max_position_embeddings=4096)))

FAMILY_V2 = register(Family(
    model_type="deepseek_v2", read=read_v2, layer_params=layer_params, layer_flops=layer_flops,
    layer_groups=layer_groups, torch=None,
    summary="as deepseek_v3 (MLA, first ``first_k_dense_replace`` layers dense, routed + shared experts), "
            "no MTP; ``q_lora_rank`` null = a full query projection (V2-Lite)",
    defaults=dict(_DEFAULTS, vocab_size=102400, hidden_size=4096, intermediate_size=11008,
                  moe_intermediate_size=1407, num_hidden_layers=32, num_attention_heads=32, n_shared_experts=2,
                  n_routed_experts=64, num_experts_per_tok=None, first_k_dense_replace=0,
                  max_position_embeddings=2048)))
