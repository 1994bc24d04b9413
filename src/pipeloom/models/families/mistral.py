"""``mistral``: as llama without biases (``num_key_value_heads`` defaults to 8)."""
from __future__ import annotations

from ..registry import Family, register
from .common import llama_like


def read(r, label):
    return llama_like(r, label, ffn=r.int("intermediate_size"))


FAMILY = register(Family(
    model_type="mistral", read=read,
    summary="as llama without biases (``num_key_value_heads`` defaults to 8)",
    defaults=dict(num_key_value_heads=8, max_position_embeddings=4096 * 32, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, head_dim=None)))
