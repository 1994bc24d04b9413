"""``llama``: RMSNorm, SwiGLU, rotary; ``attention_bias`` (q/k/v/o), ``mlp_bias``, optional ``head_dim``."""
from __future__ import annotations

from ..registry import Family, register
from .common import llama_like


def read(r, label):
    attn_bias = r.bool("attention_bias")
    return llama_like(r, label, ffn=r.int("intermediate_size"), qkv_bias=attn_bias, proj_bias=attn_bias,
                      mlp_bias=r.bool("mlp_bias"))


FAMILY = register(Family(
    model_type="llama", read=read,
    summary="RMSNorm, SwiGLU, rotary; ``attention_bias`` (q/k/v/o), ``mlp_bias``, optional ``head_dim``",
    defaults=dict(num_key_value_heads=None, max_position_embeddings=2048, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, attention_bias=False, mlp_bias=False, head_dim=None)))
