"""THE description of a decoder-only transformer, for every part of pipeloom (no torch).

One :class:`ModelConfig` is read by the analytic memory model (:mod:`pipeloom.memory.analytic`),
by the layer cost model (:func:`pipeloom.partition.layer_costs.default_layer_costs`) and by the
torch Llama (:mod:`pipeloom.models.llama`, which builds its modules from it). Published shapes
are in :mod:`pipeloom.models.presets`.

Field names are those the ``pipeloom memory`` command and its JSON output use: ``hidden``,
``layers``, ``heads``, ``kv_heads``, ``ffn``, ``vocab``, ``seq``. The architecture fields beyond
Llama and GPT-3 (explicit ``head_size``, ``qkv_bias``, ``qk_norm``, mixture-of-experts ``experts``
...) are what :func:`pipeloom.models.hf_config.from_hf_config` fills from a Hugging Face
``config.json``; parameter counts and FLOPs of every part are in :mod:`pipeloom.models.flops`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


class ModelConfigError(ValueError):
    """A model description that cannot exist (the message says what is wrong and what is allowed)."""


def default_ffn(hidden: int, mlp: str) -> int:
    """The MLP width when none is given: SwiGLU ``8h/3`` rounded up to a multiple of 16 (as in
    LLaMA, Touvron et al. 2023), GeLU ``4h`` (GPT, Brown et al. 2020)."""
    return 16 * math.ceil(8 * hidden / 3 / 16) if mlp == "swiglu" else 4 * hidden


#: the integer dimensions of a model, each at most :data:`pipeloom.core.limits.MAX_MODEL_DIM`
_DIMS = ("hidden", "layers", "heads", "kv_heads", "vocab", "seq", "ffn", "head_size", "experts", "experts_per_token",
         "shared_experts", "expert_ffn", "shared_expert_ffn")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """Shape of a decoder-only transformer (published hyper-parameters for the presets)."""

    name: str = "custom"
    """label shown in reports"""
    arch: str = field(default="", compare=False)
    """the Hugging Face ``model_type`` it was read from, whose :class:`~pipeloom.models.registry.Family` may count
    its layer itself; "" (presets, hand-made configs) = the shared formulas of :mod:`pipeloom.models.flops`"""
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
    """biases on every linear layer of a transformer layer (GPT-3: yes, Llama: no); True sets
    ``qkv_bias``, ``proj_bias`` and ``mlp_bias``"""
    qkv_bias: bool = False
    """biases on the query/key/value projections only (Qwen2)"""
    proj_bias: bool = False
    """bias on the attention output projection"""
    mlp_bias: bool = False
    """biases on the MLP (and expert) projections"""
    head_size: int | None = None
    """explicit width of one attention head (Qwen3: 128 whatever ``hidden``); None = hidden / heads.
    The query projection is ``heads * head_dim`` wide, which then need not equal ``hidden``"""
    qk_norm: bool = False
    """RMSNorm over each head's query and key (Qwen3): two weight vectors of ``head_dim``"""
    experts: int = 0
    """routed experts per MoE layer; 0 = dense MLP (every layer is MoE when > 0)"""
    experts_per_token: int = 0
    """top-k: experts each token is routed to (>= 1 when ``experts`` > 0)"""
    expert_ffn: int | None = None
    """inner width of one routed expert's MLP; None = ``ffn``"""
    shared_experts: int = 0
    """experts every token goes through besides the routed ones (Qwen2-MoE: 1)"""
    shared_expert_ffn: int | None = None
    """inner width of one shared expert; None = ``ffn``"""
    shared_expert_gate: bool = False
    """a ``hidden -> 1`` sigmoid gate on the shared experts' output (Qwen2-MoE)"""
    gelu_saved: int = 1
    """with ``mlp='gelu'`` and transformers' modules (memory ``impl='hf'``): the ffn-wide tensors the GeLU keeps
    for backward: 1 for a fused GeLU (``gelu``, ``gelu_pytorch_tanh``), 4 for GPT-2's ``gelu_new``, which
    transformers writes out in PyTorch ops (x, x^3's input, the tanh argument and the tanh, as traced)"""
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
        if self.head_size is None:
            if self.hidden % self.heads:
                raise ModelConfigError(f"hidden={self.hidden} must be divisible by heads={self.heads} "
                                       f"(or give head_size explicitly)")
        elif not _is_pos_int(self.head_size):
            raise ModelConfigError(f"head_size must be an integer >= 1 or None, got {self.head_size!r}")
        if self.bias:
            for f in ("qkv_bias", "proj_bias", "mlp_bias"):
                object.__setattr__(self, f, True)
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
        for f in ("experts", "experts_per_token", "shared_experts"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ModelConfigError(f"model {f} must be an integer >= 0, got {v!r}")
        if self.experts:
            if not 1 <= self.experts_per_token <= self.experts:
                raise ModelConfigError(f"experts_per_token (top-k) must lie in [1, experts={self.experts}], "
                                       f"got {self.experts_per_token}")
        elif self.experts_per_token or self.shared_experts or self.shared_expert_gate:
            raise ModelConfigError("experts_per_token, shared_experts and shared_expert_gate need experts >= 1 "
                                   "(a mixture-of-experts model); experts = 0 is a dense MLP")
        for f in ("expert_ffn", "shared_expert_ffn"):
            v = getattr(self, f)
            if v is None:
                object.__setattr__(self, f, self.ffn)
            elif not _is_pos_int(v):
                raise ModelConfigError(f"model {f} must be an integer >= 1 or None, got {v!r}")
        from ..core.limits import MAX_MODEL_DIM

        for f in _DIMS:  # (above the cap, parameter and byte counts overflow a float: OverflowError)
            v = getattr(self, f)
            if isinstance(v, int) and v > MAX_MODEL_DIM:
                raise ModelConfigError(f"model {f} = {v:.3g} is above the cap of {MAX_MODEL_DIM:,} for any model "
                                       f"dimension (caps: docs/robustness.md)")

    @property
    def head_dim(self) -> int:
        """Width of one attention head: ``head_size`` if given, else ``hidden / heads``."""
        return self.head_size if self.head_size is not None else self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of the query projection (and of the attention output): ``heads * head_dim``."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key (or value) projection: ``kv_heads * head_dim``."""
        return self.kv_heads * self.head_dim

    @property
    def moe(self) -> bool:
        """True for a mixture-of-experts model (``experts`` > 0)."""
        return self.experts > 0

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of one MLP (or expert): 3 for SwiGLU (gate, up, down), 2 for GeLU."""
        return 3 if self.mlp == "swiglu" else 2


def _is_pos_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


__all__ = ["ModelConfig", "ModelConfigError", "default_ffn"]
