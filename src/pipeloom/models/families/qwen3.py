"""``qwen3``: q/k RMSNorm per head, explicit ``head_dim`` (default 128), ``attention_bias`` (q/k/v/o)."""
from __future__ import annotations

from ..registry import Family, register
from .common import llama_like


def read(r, label):
    attn_bias = r.bool("attention_bias")
    return llama_like(r, label, ffn=r.int("intermediate_size"), qkv_bias=attn_bias, proj_bias=attn_bias,
                      qk_norm=True)


FAMILY = register(Family(
    model_type="qwen3", read=read,
    summary="q/k RMSNorm per head, explicit ``head_dim`` (default 128), ``attention_bias`` (q/k/v/o)",
    defaults=dict(num_key_value_heads=32, max_position_embeddings=32768, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, attention_bias=False, head_dim=128)))
