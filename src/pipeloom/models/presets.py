"""Published model shapes as :class:`~pipeloom.models.config.ModelConfig` presets (no torch).

``pipeloom memory --model NAME`` and :func:`preset` take these names.
"""
from __future__ import annotations

from .config import ModelConfig, ModelConfigError


def _llama(name, h, L, a, kv, f, V, s):
    return ModelConfig(name=name, hidden=h, layers=L, heads=a, kv_heads=kv, ffn=f, vocab=V, seq=s)


def _gpt3(name, h, L, a):
    # Brown et al. 2020, Table 2.1: n_ctx 2048, GPT-2 BPE vocabulary (50257), ffn = 4h,
    # learned positions, tied input/output embeddings; dropout 0.1 as in Megatron's GPT recipes.
    return ModelConfig(name=name, hidden=h, layers=L, heads=a, ffn=4 * h, vocab=50257, seq=2048, mlp="gelu",
                       norm="layernorm", bias=True, tied_embeddings=True, learned_positions=True, dropout=0.1)


PRESETS: dict[str, ModelConfig] = {
    # Touvron et al. 2023 (Llama 2) and the released config.json files
    "llama2-7b": _llama("llama2-7b", 4096, 32, 32, 32, 11008, 32000, 4096),
    "llama2-13b": _llama("llama2-13b", 5120, 40, 40, 40, 13824, 32000, 4096),
    "llama2-70b": _llama("llama2-70b", 8192, 80, 64, 8, 28672, 32000, 4096),
    # Llama 3 (Meta 2024) released config.json: GQA with 8 KV heads, 128256-token vocabulary
    "llama3-8b": _llama("llama3-8b", 4096, 32, 32, 8, 14336, 128256, 8192),
    "llama3-70b": _llama("llama3-70b", 8192, 80, 64, 8, 28672, 128256, 8192),
    # Llama 3 405B (Dubey et al. 2024, Table 3: 126 layers, width 16384, FFN 53248, 128 heads, 8 KV heads),
    # seq = its 8K pre-training sequence (sec. 3.4.1), not the 128K of long-context training
    "llama3-405b": _llama("llama3-405b", 16384, 126, 128, 8, 53248, 128256, 8192),
    # GPT-3 (Brown et al. 2020, Table 2.1). The table's head counts for 1.3B (24 heads of 128) and its
    # width for 13B (5140) are inconsistent with d_model = heads * d_head; we use 16 heads and 5120.
    "gpt3-125m": _gpt3("gpt3-125m", 768, 12, 12),
    "gpt3-350m": _gpt3("gpt3-350m", 1024, 24, 16),
    "gpt3-760m": _gpt3("gpt3-760m", 1536, 24, 16),
    "gpt3-1.3b": _gpt3("gpt3-1.3b", 2048, 24, 16),
    "gpt3-2.7b": _gpt3("gpt3-2.7b", 2560, 32, 32),
    "gpt3-6.7b": _gpt3("gpt3-6.7b", 4096, 32, 32),
    "gpt3-13b": _gpt3("gpt3-13b", 5120, 40, 40),
    "gpt3-175b": _gpt3("gpt3-175b", 12288, 96, 96),
    # the built-in tiny Llama of pipeloom.models.llama (about 0.4 M parameters; ffn = 8h/3 rounded to 16)
    "llama-tiny": _llama("llama-tiny", 64, 8, 4, 2, 176, 256, 32),
}


def preset(name: str) -> ModelConfig:
    """The preset called ``name`` (case-insensitive); a one-line error lists the known names."""
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise ModelConfigError(f"unknown model preset {name!r}; choose one of: {', '.join(PRESETS)}") from None


__all__ = ["PRESETS", "preset"]
