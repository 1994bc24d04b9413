"""``gemma`` and ``gemma2``: Llama-style decoders with an explicit ``head_dim`` (256), a gated GeLU MLP (GeGLU:
gate, up, down, as SwiGLU), embeddings tied by default; Gemma 2 adds a norm after attention and one after the
MLP (four RMSNorms per layer) and soft-caps the attention scores and the logits.

Sources: Gemma (arXiv 2403.08295) sec. 2, table 1; Gemma 2 (arXiv 2408.00118) sec. 2, tables 1-2 ("pre-norm
and post-norm", logit soft-capping, local sliding-window and global attention alternating); the counts follow
transformers' (5.x) ``modeling_gemma.py`` and ``modeling_gemma2.py``.

In transformers 5 the ``sqrt(hidden)`` scaling of the embedding lives in the embedding module
(``GemmaScaledWordEmbedding``), which chunk 0 holds, so the chunks need no embedding hook; Gemma 2's
``final_logit_softcapping`` is in the causal LM's ``forward``: the logits hook applies it. RMSNorm's
``(1 + weight)`` has the same parameters and saved tensors as Llama's. FLOPs count the attention core over
the whole sequence in every layer, Gemma 2's sliding-window layers included (as for Mistral).
"""
from __future__ import annotations

from ..config import ModelConfigError
from ..registry import Family, TorchChunks, register
from .. import flops
from .common import llama_like


def _gelu_gated(r) -> None:
    for key in ("hidden_activation", "hidden_act"):
        act = r.cfg.get(key)
        if act is not None and (not isinstance(act, str) or "gelu" not in act):
            raise ModelConfigError(f"{r.where}: field {key!r} {act!r} is not a GeLU; pipeloom models {r.arch} with a "
                                   f"gated GeLU MLP")


def read(r, label):
    _gelu_gated(r)
    attn_bias = r.bool("attention_bias")
    return llama_like(r, label, ffn=r.int("intermediate_size"), qkv_bias=attn_bias, proj_bias=attn_bias)


def layer_params_gemma2(model, tp):
    """Gemma 2's layer: the shared count with four RMSNorms of ``hidden`` instead of two."""
    return flops.attention_params(model, tp) + flops.mlp_params(model, tp) + 4 * model.hidden


def _softcap(logits, cfg):
    cap = getattr(cfg, "final_logit_softcapping", None)
    if cap is None:
        return logits
    return (logits / cap).tanh() * cap


_DEFAULTS = dict(num_key_value_heads=16, head_dim=256, max_position_embeddings=8192, rms_norm_eps=1e-6,
                 tie_word_embeddings=True, attention_bias=False)

FAMILY = register(Family(
    model_type="gemma", read=read,
    summary="llama layout with explicit ``head_dim`` (default 256), gated GeLU MLP, ``attention_bias`` (q/k/v/o), "
            "tied embeddings by default, embedding scaled by sqrt(hidden)",
    defaults=_DEFAULTS))

FAMILY_2 = register(Family(
    model_type="gemma2", read=read, layer_params=layer_params_gemma2, torch=TorchChunks(logits=_softcap),
    summary="as gemma with four RMSNorms per layer (pre and post attention and MLP), attention and final logit "
            "soft-capping, sliding-window layers (not priced apart)",
    defaults=dict(_DEFAULTS, num_key_value_heads=4)))
