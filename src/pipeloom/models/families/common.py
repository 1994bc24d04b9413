"""What several families read the same way (no torch): the Llama-style decoder fields, the rotary base,
the MoE layer pattern pipeloom can model."""
from __future__ import annotations

from ..config import ModelConfig, ModelConfigError
from ..registry import ConfigReader


def rope_theta(r: ConfigReader) -> float:
    """The rotary base: ``rope_parameters.rope_theta`` (transformers 5), else ``rope_theta``, else 10000."""
    rp = r.cfg.get("rope_parameters")
    if isinstance(rp, dict) and isinstance(rp.get("rope_theta"), (int, float)):
        return float(rp["rope_theta"])
    return r.float("rope_theta", 10000.0)


def kv_heads(r: ConfigReader, heads: int) -> int:
    """``num_key_value_heads``; absent or null = ``heads`` (multi-head attention)."""
    kv = r.int("num_key_value_heads", none_ok=True)
    return heads if kv is None else kv


def llama_like(r: ConfigReader, label: str, **kw) -> ModelConfig:
    """A Llama-style decoder (RMSNorm, SwiGLU, rotary) from the usual field names; ``kw`` sets the rest
    (``ffn``, biases, q/k norms, experts ...). ``head_dim`` is read where the family knows it."""
    heads = r.int("num_attention_heads")
    base = dict(name=label, arch=r.arch, hidden=r.int("hidden_size"), layers=r.int("num_hidden_layers"),
                heads=heads, kv_heads=kv_heads(r, heads), vocab=r.int("vocab_size"),
                seq=r.int("max_position_embeddings"), norm_eps=r.float("rms_norm_eps"), rope_theta=rope_theta(r),
                init_std=r.float("initializer_range", 0.02), dropout=r.float("attention_dropout", 0.0),
                tied_embeddings=r.bool("tie_word_embeddings"), mlp="swiglu", norm="rmsnorm")
    if r.has("head_dim"):
        base["head_size"] = r.int("head_dim", none_ok=True)
    base.update(kw)
    return ModelConfig(**base)


def every_layer_moe(r: ConfigReader) -> None:
    """Refuse MoE models whose dense and sparse layers alternate: pipeloom's layers are identical."""
    step = r.int("decoder_sparse_step")
    only = r.raw("mlp_only_layers")
    if step != 1:
        raise ModelConfigError(f"{r.where}: field 'decoder_sparse_step' is {step}: dense and MoE layers alternate, "
                               f"which pipeloom does not model (it needs 1: every layer MoE)")
    if only:
        raise ModelConfigError(f"{r.where}: field 'mlp_only_layers' lists dense layers {only!r}, which pipeloom "
                               f"does not model (it needs [] : every layer MoE)")


__all__ = ["every_layer_moe", "kv_heads", "llama_like", "rope_theta"]
