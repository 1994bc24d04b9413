"""How a model is trained, as the memory model reads it: :class:`TrainConfig` (shapes, precision, parallelism,
recompute, sharding) and its checks (no torch). The layer model that uses it is :mod:`pipeloom.memory.layers`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..models.config import ModelConfig
from .sharding import ZERO_LEVELS, zero_help

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


class MemoryConfigError(ValueError):
    """Bad training configuration, or a model and training that do not fit together (the message says
    what is wrong and what is allowed). A bad model alone raises
    :class:`pipeloom.models.config.ModelConfigError`; both are ``ValueError``."""


# ------------------------------------------------------------------------------------- configs
@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """How the model is trained: shapes, precision, parallelism, recompute."""

    seq: int | None = None
    """sequence length; None = the model's published context length"""
    micro_batch: int = 1
    """sequences per microbatch b"""
    dtype: str = "bf16"
    """parameter/activation dtype: fp32, bf16 (fp32 main grads) or fp16 (fp32 master grads)"""
    tp: int = 1
    """tensor-parallel degree t (Megatron column/row split)"""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norm/dropout activations split over t too"""
    recompute: str = "none"
    """'none', 'selective' (attention core, Korthikanti et al.) or 'full' (keep layer inputs only)"""
    attention: str = "flash"
    """'flash' (no s x s matrix saved) or 'math' (softmax probabilities saved, Korthikanti's 5as/h term)"""
    impl: str = "fused"
    """'fused' (Megatron kernels: fused norm, fused SwiGLU, native GQA), 'eager' (unfused PyTorch
    ops as in pipeloom.models.llama: fp32 RMSNorm, silu*up, repeat_interleave K/V) or 'hf'
    (transformers' modules: eager norms and MLP as 'eager', K/V not expanded with flash (SDPA's
    native GQA), rotary cos/sin computed once per chunk and saved in the activation dtype)"""
    dp: int = 1
    """data-parallel degree (only matters with zero >= 1)"""
    zero: int = 0
    """what is sharded over dp (:data:`ZERO_LEVELS`): 0 nothing, 1 optimizer states (ZeRO-1 / distributed
    optimizer), 2 also gradients (ZeRO-2), 3 also parameters (ZeRO-3 / FSDP full sharding)"""
    free_stage_io: bool = True
    """True (Megatron's ``deallocate_pipeline_outputs``, Llama 3's early freeing): a chunk's output is freed once
    sent (only its autograd node stays) and its received input is held only as the first layer's saved input;
    False: every chunk but the last also holds its output, per microbatch, until its backward"""
    keep_gathered_input: bool = False
    """with sequence parallelism: True (``pipeloom run --keep-gathered-input``) keeps the all-gathered input of
    each column-parallel GEMM group (QKV, fc1) from F to its weight gradient, full width; False (Megatron's and
    pipeloom's TP runtime's default, :mod:`pipeloom.models.tp_comm`): the sequence shard is saved and
    all-gathered again before the weight gradients"""
    # MoE, long context, FP8: pipeloom.memory.moe says what they change, pipeloom.models.moe the layout rules
    ep: int = 1
    """expert-parallel degree: experts / ep routed experts per rank, carved out of dp * cp"""
    capacity_factor: float | None = None
    """expert capacity over the mean load (GShard/Switch: buffers padded to it); None = dropless"""
    moe_imbalance: float = 1.0
    """dropless: the busiest rank's expert load over the mean (the stated imbalance assumption)"""
    cp: int = 1
    """context-parallel degree (ring attention): each rank holds seq / cp tokens of every sequence"""
    recompute_norms: bool = False
    """recompute RMSNorm outputs and MLA's up-projections in B (DeepSeek-V3 sec. 3.2.3)"""
    fp8: bool = False
    """FP8 GEMMs: inputs cached in FP8 for the weight gradient, an FP8 copy of the weights"""

    def __post_init__(self) -> None:
        for f in ("micro_batch", "tp", "dp"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise MemoryConfigError(f"{f} must be an integer >= 1, got {v!r}")
        if self.seq is not None and (not isinstance(self.seq, int) or self.seq < 1):
            raise MemoryConfigError(f"seq must be an integer >= 1, got {self.seq!r}")
        if self.dtype not in DTYPE_BYTES:
            raise MemoryConfigError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.recompute not in ("none", "selective", "full"):
            raise MemoryConfigError(f"recompute must be none, selective or full, got {self.recompute!r}")
        if self.attention not in ("flash", "math"):
            raise MemoryConfigError(f"attention must be 'flash' or 'math', got {self.attention!r}")
        if self.impl not in ("fused", "eager", "hf"):
            raise MemoryConfigError(f"impl must be 'fused', 'eager' or 'hf', got {self.impl!r}")
        if self.zero not in ZERO_LEVELS or isinstance(self.zero, bool):
            raise MemoryConfigError(f"zero must be one of {zero_help()}; got {self.zero!r}")
        if self.sequence_parallel and self.tp == 1:
            object.__setattr__(self, "sequence_parallel", False)  # nothing to split
        from .moe import train_error

        if train_error(self):  # ep, cp, capacity factor, imbalance, fp8 (memory/moe.py)
            raise MemoryConfigError(train_error(self))

    @property
    def elem(self) -> int:
        return DTYPE_BYTES[self.dtype]


def check_tp(model: ModelConfig, train: TrainConfig) -> None:
    """Every TP-split dimension must divide by t (Megatron's rule)."""
    t = train.tp
    bad = [(n, v) for n, v in (("heads", model.heads), ("kv_heads", model.kv_heads), *_ffn_dims(model),
                               ("hidden", model.hidden)) if v % t]
    if bad:
        n, v = bad[0]
        raise MemoryConfigError(f"{n}={v} of {model.name} is not divisible by tp={t}; choose tp dividing "
                                f"heads, kv_heads, ffn and hidden (e.g. tp in {_divisors(model)})")
    if train.sequence_parallel and (train.seq or model.seq) % t:
        raise MemoryConfigError(f"sequence parallel needs seq={train.seq or model.seq} divisible by tp={t}")


def _ffn_dims(model: ModelConfig) -> list[tuple[str, int]]:
    """The MLP widths that tensor parallelism splits: ffn (dense) or the expert (and shared-expert) widths."""
    if not model.moe:
        return [("ffn", model.ffn)]
    return [("expert_ffn", model.expert_ffn)] + ([("shared_expert_ffn", model.shared_expert_ffn)]
                                                 if model.shared_experts else [])


def _divisors(model: ModelConfig) -> list[int]:
    g = math.gcd(math.gcd(model.heads, model.kv_heads), math.gcd(model.hidden, *[v for _, v in _ffn_dims(model)]))
    return [d for d in range(1, min(g, 64) + 1) if g % d == 0]
