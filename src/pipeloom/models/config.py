"""THE description of a decoder-only transformer, for every part of pipeloom (no torch).

One :class:`ModelConfig` is read by the analytic memory model (:mod:`pipeloom.memory.analytic`),
by the layer cost model (:func:`pipeloom.partition.layer_costs.default_layer_costs`) and by the
torch Llama (:mod:`pipeloom.models.llama`, which builds its modules from it). Published shapes
are in :mod:`pipeloom.models.presets`.

Field names are those the ``pipeloom memory`` command and its JSON output use: ``hidden``,
``layers``, ``heads``, ``kv_heads``, ``ffn``, ``vocab``, ``seq``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


class ModelConfigError(ValueError):
    """A model description that cannot exist (the message says what is wrong and what is allowed)."""


def default_ffn(hidden: int, mlp: str) -> int:
    """The MLP width when none is given: SwiGLU ``8h/3`` rounded up to a multiple of 16 (as in
    LLaMA, Touvron et al. 2023), GeLU ``4h`` (GPT, Brown et al. 2020)."""
    return 16 * math.ceil(8 * hidden / 3 / 16) if mlp == "swiglu" else 4 * hidden


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """Shape of a decoder-only transformer (published hyper-parameters for the presets)."""

    name: str = "custom"
    """label shown in reports"""
    hidden: int
    """model (residual stream) width h"""
    layers: int
    """number of transformer layers L"""
    heads: int
    """attention (query) heads a; ``hidden`` must be divisible by it"""
    kv_heads: int | None = None
    """key/value heads (grouped-query attention); None = heads (multi-head attention)"""
    ffn: int | None = None
    """MLP inner width (11008 for Llama-2 7B; 4h for GPT-3); None = :func:`default_ffn`"""
    vocab: int
    """vocabulary size V"""
    seq: int = 2048
    """training sequence length (the published context length; the longest the rotary tables cover)"""
    mlp: str = "swiglu"
    """'swiglu' (gate and up GEMMs, Llama) or 'gelu' (GPT)"""
    norm: str = "rmsnorm"
    """'rmsnorm' or 'layernorm'"""
    bias: bool = False
    """biases on the linear layers (GPT-3: yes, Llama: no)"""
    tied_embeddings: bool = False
    """the output head shares the input embedding matrix (GPT-3: yes)"""
    learned_positions: bool = False
    """learned absolute position embeddings of ``seq`` rows (GPT-3); False = rotary (no params)"""
    dropout: float = 0.0
    """hidden/attention dropout probability used in training (adds 1-byte masks when > 0)"""
    norm_eps: float = 1e-5
    """normalisation epsilon"""
    rope_theta: float = 10000.0
    """rotary base"""
    init_std: float = 0.02
    """std of the normal init of every matrix (the torch model scales output projections by 1/sqrt(2L))"""

    def __post_init__(self) -> None:
        for f in ("hidden", "layers", "heads", "vocab", "seq"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ModelConfigError(f"model {f} must be an integer >= 1, got {v!r}")
        kv = self.heads if self.kv_heads is None else self.kv_heads
        if not isinstance(kv, int) or isinstance(kv, bool) or kv < 1 or self.heads % kv:
            raise ModelConfigError(f"kv_heads must be an integer >= 1 dividing heads={self.heads}, got {kv!r}")
        object.__setattr__(self, "kv_heads", kv)
        if self.hidden % self.heads:
            raise ModelConfigError(f"hidden={self.hidden} must be divisible by heads={self.heads}")
        if self.mlp not in ("swiglu", "gelu"):
            raise ModelConfigError(f"mlp must be 'swiglu' or 'gelu', got {self.mlp!r}")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise ModelConfigError(f"norm must be 'rmsnorm' or 'layernorm', got {self.norm!r}")
        if self.ffn is None:
            object.__setattr__(self, "ffn", default_ffn(self.hidden, self.mlp))
        elif not isinstance(self.ffn, int) or isinstance(self.ffn, bool) or self.ffn < 1:
            raise ModelConfigError(f"model ffn must be an integer >= 1 or None, got {self.ffn!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ModelConfigError(f"dropout must lie in [0, 1), got {self.dropout}")

    @property
    def head_dim(self) -> int:
        """Width of one attention head: ``hidden / heads``."""
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (or value) projection: ``kv_heads * head_dim``."""
        return self.kv_heads * self.head_dim


__all__ = ["ModelConfig", "ModelConfigError", "default_ffn"]
