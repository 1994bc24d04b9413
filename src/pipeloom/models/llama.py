"""A small Llama-style decoder in pure torch, built chunk by chunk for pipeline parallelism.

The model is described by a :class:`pipeloom.models.config.ModelConfig` (the one description the
memory model and the partitioner read too); :func:`LlamaConfig` makes one from the usual Llama
argument names (``dim``, ``n_layers``, ...), with the ``llama-tiny`` example as defaults.

Architecture (Touvron et al. 2023, "LLaMA"): token embedding, ``layers`` pre-norm blocks
``x = x + Attn(RMSNorm(x)); x = x + SwiGLU(RMSNorm(x))``, final RMSNorm and a vocabulary head.

* RMSNorm (Zhang & Sennrich 2019): ``y = x / sqrt(mean(x^2) + eps) * g``.
* Rotary position embedding (Su et al. 2021), half-rotation form: for each head vector split into
  halves ``(x1, x2)``, ``rope(x) = (x1*cos - x2*sin, x1*sin + x2*cos)`` with angle
  ``t * theta^(-2i/head_dim)`` at position ``t``.
* Grouped-query attention (Ainslie et al. 2023): ``n_kv_heads`` key/value heads shared by
  ``n_heads / n_kv_heads`` query heads each; causal softmax attention.
* SwiGLU feed-forward (Shazeer 2020): ``w2(silu(w1 x) * w3 x)``; default hidden size
  ``8*dim/3`` rounded up to a multiple of 16, as in LLaMA.

Pipeline split: :func:`build_chunk_modules` makes one :class:`LlamaChunk` per pipeline chunk.
Chunk 0 also holds the embedding (its input is the token ids), the last chunk also holds the
final norm and the head (its output is the logits). Parameter names are the same in a chunk and
in the single-process reference (``layers.<global layer index>...``), so gradients can be
compared by name.

Deterministic init: every sub-module (embedding, layer ``i``, final norm/head) is initialised
from its own ``torch.Generator`` seeded by ``(seed, which sub-module)``, independent of the
global RNG and of how layers are grouped into chunks. Every rank therefore builds exactly the
weights of its chunks, and the reference built by :func:`build_reference` holds the same values.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig, ModelConfigError
from .slicing import even_layer_split

__all__ = [
    "LlamaConfig",
    "check_llama",
    "RMSNorm",
    "Attention",
    "FeedForward",
    "Block",
    "LlamaChunk",
    "build_chunk_modules",
    "build_reference",
    "even_layer_split",
    "synthetic_batch",
    "loss_fn",
]


def LlamaConfig(*, vocab_size: int = 256, dim: int = 64, n_layers: int = 8, n_heads: int = 4, n_kv_heads: int = 2,
                ffn_dim: int | None = None, max_seq_len: int = 32, norm_eps: float = 1e-5, rope_theta: float = 10000.0,
                init_std: float = 0.02, name: str = "llama") -> ModelConfig:
    """A Llama-shaped :class:`~pipeloom.models.config.ModelConfig` from the usual Llama argument names.

    The defaults are the ``llama-tiny`` example (about 0.4 M parameters). The result uses the one
    set of field names: ``vocab``, ``hidden``, ``layers``, ``heads``, ``kv_heads``, ``ffn``, ``seq``.
    ``ffn_dim`` None = ``8*dim/3`` rounded up to a multiple of 16.
    """
    for arg, v in (("vocab_size", vocab_size), ("dim", dim), ("n_layers", n_layers), ("n_heads", n_heads),
                   ("n_kv_heads", n_kv_heads), ("max_seq_len", max_seq_len)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ModelConfigError(f"LlamaConfig.{arg} must be an integer >= 1, got {v!r}")
    if dim % n_heads:
        raise ModelConfigError(f"LlamaConfig.dim={dim} must be divisible by n_heads={n_heads}")
    if n_heads % n_kv_heads:
        raise ModelConfigError(f"LlamaConfig.n_kv_heads={n_kv_heads} must divide n_heads={n_heads}")
    cfg = ModelConfig(name=name, vocab=vocab_size, hidden=dim, layers=n_layers, heads=n_heads, kv_heads=n_kv_heads,
                      ffn=ffn_dim, seq=max_seq_len, norm_eps=norm_eps, rope_theta=rope_theta, init_std=init_std)
    check_llama(cfg)
    return cfg


def check_llama(cfg: ModelConfig) -> None:
    """Refuse, in one line, a model this torch Llama cannot build (it has SwiGLU, RMSNorm, rotary
    positions, untied embeddings, no biases and no dropout; rotary needs an even head size)."""
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"expected a pipeloom.models.config.ModelConfig, got {type(cfg).__name__}")
    if cfg.head_dim % 2:
        raise ModelConfigError(f"head_dim = hidden/heads = {cfg.head_dim} must be even for rotary embeddings")
    other = [f"{f}={getattr(cfg, f)!r}" for f, llama in (("mlp", "swiglu"), ("norm", "rmsnorm"), ("bias", False),
                                                         ("tied_embeddings", False), ("learned_positions", False),
                                                         ("dropout", 0.0)) if getattr(cfg, f) != llama]
    if other:
        raise ModelConfigError(f"model {cfg.name!r} has {', '.join(other)}; the torch Llama builds only SwiGLU, "
                               "RMSNorm, rotary, untied, bias-free models without dropout")


# --------------------------------------------------------------------------------- blocks
class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x^2, -1) + eps) * weight`` (computed in fp32, cast back)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.to(x.dtype) * self.weight


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape (max_seq_len, head_dim/2); angle = t * theta^(-2i/head_dim)."""
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = torch.arange(max_seq_len, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (batch, seq, heads, head_dim) by the half-rotation rule; cos/sin are (seq, head_dim/2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c = cos[None, :, None, :].to(x.dtype)
    s = sin[None, :, None, :].to(x.dtype)
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)


def causal_attention(m: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Causal self-attention of ``m``'s projections ``wq``, ``wk``, ``wv`` (``m.n_heads`` query heads and ``m.n_kv``
    key/value heads of width ``m.hd``, GQA by repetition) with rotary embeddings, before the output projection:
    ``(b, s, n_heads * hd)``. The tensor-parallel attention (:mod:`pipeloom.models.tp`) runs the same on its
    local heads."""
    b, s, _ = x.shape
    q = apply_rope(m.wq(x).view(b, s, m.n_heads, m.hd), cos, sin).transpose(1, 2)
    k = apply_rope(m.wk(x).view(b, s, m.n_kv, m.hd), cos, sin).transpose(1, 2)
    v = m.wv(x).view(b, s, m.n_kv, m.hd).transpose(1, 2)
    if m.n_kv != m.n_heads:
        rep = m.n_heads // m.n_kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return o.transpose(1, 2).reshape(b, s, m.n_heads * m.hd)


class Attention(nn.Module):
    """Causal multi-head attention with rotary embeddings and grouped-query key/value heads."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.hidden, cfg.heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.heads * cfg.head_dim, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.wo(causal_attention(self, x, cos, sin))


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.w3 = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.w2 = nn.Linear(cfg.ffn, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm decoder block: ``x + attn(norm(x))`` then ``x + ffn(norm(x))``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.ffn = FeedForward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class LlamaChunk(nn.Module):
    """A contiguous slice of the decoder: optional embedding, some blocks, optional norm + head.

    ``forward(x)``: ``x`` is token ids (batch, seq) when the chunk has the embedding, else the
    hidden states (batch, seq, dim); returns logits (batch, seq, vocab) when the chunk has the
    head, else hidden states. A chunk with every layer, the embedding and the head is the full model.
    """

    def __init__(self, cfg: ModelConfig, layers: Sequence[int], *, first: bool, last: bool) -> None:
        super().__init__()
        check_llama(cfg)
        self.cfg = cfg
        self.layer_ids = list(layers)
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden) if first else None
        # keyed by the GLOBAL layer index, so parameter names match the full model
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in self.layer_ids})
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps) if last else None
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False) if last else None
        cos, sin = rope_tables(cfg.head_dim, cfg.seq, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.seq_shards = 1  # > 1 only for sequence-parallel chunks (pipeloom.models.tp.shard_chunk_)

    @property
    def is_first(self) -> bool:
        return self.embed is not None

    @property
    def is_last(self) -> bool:
        return self.head is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # sequence parallel (pipeloom.models.tp): hidden states between blocks and chunks hold 1/seq_shards of
        # the tokens; the rotary tables cover the whole sequence the attention sees
        s = x.shape[1] if self.embed is not None else x.shape[1] * self.seq_shards
        if self.embed is not None:
            x = self.embed(x)
        if s > self.rope_cos.shape[0]:
            raise ValueError(f"sequence length {s} exceeds max_seq_len={self.rope_cos.shape[0]}")
        cos, sin = self.rope_cos[:s], self.rope_sin[:s]
        for blk in self.layers.values():
            x = blk(x, cos, sin)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


# --------------------------------------------------------------------------------- init
_TAG_EMBED, _TAG_HEAD, _TAG_LAYER0 = 1, 2, 16


def _generator(seed: int, tag: int) -> torch.Generator:
    # a fixed, order-independent stream per (seed, sub-module)
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + tag) % (2**63 - 1))


@torch.no_grad()
def _init_(module: nn.Module, gen: torch.Generator, cfg: ModelConfig) -> None:
    """Normal(0, init_std) for matrices (wo, w2 scaled by 1/sqrt(2*n_layers), GPT-2 style), ones for norms."""
    for name, p in module.named_parameters():  # registration order: deterministic
        if p.ndim == 1:
            p.fill_(1.0)
            continue
        std = cfg.init_std
        if name.endswith(("wo.weight", "w2.weight")):
            std = std / math.sqrt(2 * cfg.layers)
        val = torch.randn(p.shape, generator=gen, dtype=torch.float32) * std
        p.copy_(val.to(p.dtype))


def _make_chunk(cfg: ModelConfig, layers: Sequence[int], first: bool, last: bool, seed: int,
                device, dtype) -> LlamaChunk:
    with torch.device("cpu"):
        m = LlamaChunk(cfg, layers, first=first, last=last)
    if m.embed is not None:
        _init_(m.embed, _generator(seed, _TAG_EMBED), cfg)
    for i in m.layer_ids:
        _init_(m.layers[str(i)], _generator(seed, _TAG_LAYER0 + i), cfg)
    if m.head is not None:
        gen = _generator(seed, _TAG_HEAD)
        _init_(m.head, gen, cfg)
        _init_(m.norm, gen, cfg)
    if dtype is not None:
        m = m.to(dtype=dtype)
        # rotary tables stay fp32; apply_rope casts them per call
        m.rope_cos, m.rope_sin = m.rope_cos.float(), m.rope_sin.float()
    if device is not None:
        m = m.to(device)
    return m


def _check_split(cfg: ModelConfig, layers_per_chunk: Sequence[Sequence[int]]) -> list[list[int]]:
    split = [list(map(int, c)) for c in layers_per_chunk]
    if not split:
        raise ValueError("layers_per_chunk is empty; give one list of layer indices per chunk")
    flat = [i for c in split for i in c]
    if flat != list(range(cfg.layers)):
        raise ValueError(
            f"layers_per_chunk must list every layer 0..{cfg.layers - 1} once, in order, split into "
            f"contiguous chunks (e.g. {even_layer_split(cfg.layers, min(len(split), cfg.layers))}); "
            f"got {split}")
    for k, c in enumerate(split):
        if not c:
            raise ValueError(f"chunk {k} has no layers; every chunk needs at least one "
                             f"(n_layers={cfg.layers}, chunks={len(split)})")
    return split


def build_chunk_modules(cfg: ModelConfig, layers_per_chunk: Sequence[Sequence[int]], seed: int = 0, *,
                        chunks: Iterable[int] | None = None, device=None,
                        dtype: torch.dtype | None = None) -> list[LlamaChunk]:
    """One :class:`LlamaChunk` per pipeline chunk.

    ``layers_per_chunk[k]`` lists the global layer indices of chunk ``k`` (contiguous, in order,
    covering every layer once; see :func:`even_layer_split`). ``chunks`` restricts the result to
    those chunk indices (in the order given), so a rank builds only what it holds; weights are
    identical whichever subset is built. ``dtype`` casts after the fp32 init (so bf16 weights are
    the rounded fp32 ones).
    """
    split = _check_split(cfg, layers_per_chunk)
    n = len(split)
    which = list(range(n)) if chunks is None else [int(c) for c in chunks]
    for c in which:
        if not 0 <= c < n:
            raise ValueError(f"chunk {c} out of range: layers_per_chunk has {n} chunks")
    return [_make_chunk(cfg, split[c], c == 0, c == n - 1, seed, device, dtype) for c in which]


def build_reference(cfg: ModelConfig, seed: int = 0, *, device=None, dtype: torch.dtype | None = None) -> LlamaChunk:
    """The full model in one module (same weights and parameter names as the chunks)."""
    return _make_chunk(cfg, list(range(cfg.layers)), True, True, seed, device, dtype)


# --------------------------------------------------------------------------------- data, loss
def synthetic_batch(cfg: ModelConfig, batch: int, seq: int | None = None, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable synthetic language-modelling batch: ``(tokens, targets)``, both (batch, seq) int64.

    Each row is an arithmetic progression ``x_t = (a + b*t) mod vocab`` with a random start ``a``
    and a random step ``b`` in [1, 8); targets are the tokens shifted by one, so a model can learn
    to infer the step in context. Deterministic in ``seed``.
    """
    seq = cfg.seq if seq is None else seq
    if batch < 1 or seq < 1:
        raise ValueError(f"batch and seq must be >= 1, got batch={batch}, seq={seq}")
    if seq > cfg.seq:
        raise ValueError(f"seq={seq} exceeds the model's max_seq_len={cfg.seq}")
    g = torch.Generator().manual_seed(int(seed))
    a = torch.randint(0, cfg.vocab, (batch, 1), generator=g)
    b = torch.randint(1, 8, (batch, 1), generator=g)
    x = (a + b * torch.arange(seq + 1)[None, :]) % cfg.vocab
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross entropy (computed in fp32)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
