"""``mixtral``: llama attention + ``num_local_experts`` SwiGLU experts of ``intermediate_size``, a router."""
from __future__ import annotations

from ..registry import Family, register
from .common import llama_like


def read(r, label):
    ffn = r.int("intermediate_size")
    return llama_like(r, label, ffn=ffn, experts=r.int("num_local_experts"),
                      experts_per_token=r.int("num_experts_per_tok"), expert_ffn=ffn)


FAMILY = register(Family(
    model_type="mixtral", read=read,
    summary="llama attention + ``num_local_experts`` SwiGLU experts of ``intermediate_size``, top "
            "``num_experts_per_tok``, a router",
    defaults=dict(num_key_value_heads=8, max_position_embeddings=4096 * 32, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, head_dim=None, num_local_experts=8, num_experts_per_tok=2)))
