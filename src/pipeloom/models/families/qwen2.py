"""``qwen2``: as llama with q/k/v biases (always)."""
from __future__ import annotations

from ..registry import Family, register
from .common import llama_like


def read(r, label):
    return llama_like(r, label, ffn=r.int("intermediate_size"), qkv_bias=True)


FAMILY = register(Family(
    model_type="qwen2", read=read, summary="as llama with q/k/v biases (always)",
    defaults=dict(num_key_value_heads=32, max_position_embeddings=32768, rms_norm_eps=1e-6,
                  tie_word_embeddings=False)))
