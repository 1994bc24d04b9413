"""``qwen3_moe``: qwen3 attention + ``num_experts`` routed experts of ``moe_intermediate_size``, a router."""
from __future__ import annotations

from ..registry import Family, register
from .common import every_layer_moe, llama_like


def read(r, label):
    every_layer_moe(r)
    attn_bias = r.bool("attention_bias")
    moe_ffn = r.int("moe_intermediate_size")
    return llama_like(r, label, ffn=r.int("intermediate_size", moe_ffn), qkv_bias=attn_bias,
                      proj_bias=attn_bias, qk_norm=True, experts=r.int("num_experts"),
                      experts_per_token=r.int("num_experts_per_tok"), expert_ffn=moe_ffn)


FAMILY = register(Family(
    model_type="qwen3_moe", read=read,
    summary="qwen3 attention + ``num_experts`` experts of ``moe_intermediate_size``, a router, no shared expert",
    defaults=dict(num_key_value_heads=4, max_position_embeddings=32768, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, attention_bias=False, head_dim=None, num_experts=128,
                  num_experts_per_tok=8, moe_intermediate_size=768, decoder_sparse_step=1, mlp_only_layers=None)))
