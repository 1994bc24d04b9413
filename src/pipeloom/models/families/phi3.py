"""``phi3``: the Llama layout with fused projections (``qkv_proj``: ``h -> (heads + 2*kv_heads)*head_dim``,
``gate_up_proj``: ``h -> 2*intermediate_size``), no biases; the same parameters and FLOPs as the separate
GEMMs. Sources: Phi-3 technical report (arXiv 2404.14219) sec. 2; transformers' (5.x) ``modeling_phi3.py``.
``resid_pdrop`` (dropout after attention and after the MLP) is read as the dropout probability."""
from __future__ import annotations

from ..registry import Family, register
from .common import llama_like


def read(r, label):
    return llama_like(r, label, ffn=r.int("intermediate_size"),
                      dropout=max(r.float("resid_pdrop"), r.float("attention_dropout", 0.0)))


FAMILY = register(Family(
    model_type="phi3", read=read,
    summary="llama layout with fused ``qkv_proj`` and ``gate_up_proj``, no biases, ``resid_pdrop`` dropout",
    defaults=dict(num_key_value_heads=None, max_position_embeddings=4096, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, resid_pdrop=0.0)))
