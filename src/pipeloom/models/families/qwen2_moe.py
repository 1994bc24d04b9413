"""``qwen2_moe``: qwen2 attention + routed experts + one shared expert with a sigmoid gate."""
from __future__ import annotations

from ..config import ModelConfigError
from ..registry import Family, register
from .common import every_layer_moe, llama_like


def read(r, label):
    every_layer_moe(r)
    moe_ffn = r.int("moe_intermediate_size")
    shared = r.raw("shared_expert_intermediate_size")
    if shared in (None, 0):
        raise ModelConfigError(f"{r.where}: field 'shared_expert_intermediate_size' must be an integer >= 1 "
                               f"(qwen2_moe always has a shared expert), got {shared!r}")
    return llama_like(r, label, ffn=r.int("intermediate_size", moe_ffn), qkv_bias=r.bool("qkv_bias"),
                      experts=r.int("num_experts"), experts_per_token=r.int("num_experts_per_tok"),
                      expert_ffn=moe_ffn, shared_experts=1,
                      shared_expert_ffn=r.int("shared_expert_intermediate_size"), shared_expert_gate=True)


FAMILY = register(Family(
    model_type="qwen2_moe", read=read,
    summary="qwen2 attention (``qkv_bias``) + routed experts + one shared expert of "
            "``shared_expert_intermediate_size`` with a sigmoid gate",
    defaults=dict(num_key_value_heads=16, max_position_embeddings=32768, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, qkv_bias=True, head_dim=None, num_experts=60,
                  num_experts_per_tok=4, moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                  decoder_sparse_step=1, mlp_only_layers=None)))
