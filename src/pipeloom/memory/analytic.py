"""Analytic memory model of a decoder-only transformer under pipeline parallelism (no torch).

Everything is counted in bytes on one device (one tensor-parallel rank of one pipeline stage).

Static memory per parameter (Megatron-LM's mixed-precision accounting, docs/distrib_optimizer.md;
``d`` = data-parallel degree when the optimizer is sharded (ZeRO-1 / distributed optimizer),
else 1)::

    dtype   params  grads                      optimizer (fp32 master params + Adam m + v)   total
    fp32    4       4                          8 / d   (no master copy)                        16
    bf16    2       4  (fp32 main grads)       12 / d                                          18
    fp16    2       2 + 4/d (fp32 master grads)12 / d                                          20

(ZeRO, Rajbhandari et al. 2020, counts 16 bytes/param for fp16 Adam because it keeps no separate
fp32 master gradient; Megatron keeps one: 20.)

Activations per transformer layer and microbatch (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", eq. 1-2, 16-bit, ``s`` sequence, ``b`` micro-batch,
``h`` hidden, ``a`` heads, ``t`` tensor-parallel degree)::

    no parallelism          s*b*h*(34 + 5*a*s/h)
    TP, no seq. parallel    s*b*h*(10 + 24/t + 5*a*s/(h*t))
    TP + sequence parallel  s*b*h*(34/t + 5*a*s/(h*t))
    + selective recompute   s*b*h*34/t          (attention core s^2 terms recomputed)
    full recompute          2*s*b*h (/t with SP) (layer input only)

The 34 = attention block 11 (QKV input 2, Q and K 4, V 2, output-projection input 2, dropout
mask 1) + MLP 19 (fc1 input 2, GeLU input 8, fc2 input 8, mask 1) + two LayerNorm inputs 4; the
5*a*s/h = softmax output 2 + its dropout mask 1 + dropout output 2 (per s^2 entry). We do not use
the closed form: :func:`layer_activations` lists every saved tensor with its size, which gives
exactly the formula above for a GPT-3 layer (``impl='fused'``, ``attention='math'``, dropout on,
GeLU MLP with ffn = 4h) and adapts to other layers:

* GQA: K and V have ``kv_heads * head_dim`` columns instead of ``h`` (flash attention); the
  ``math`` path and ``impl='eager'`` (``repeat_interleave`` before attention, as in
  :mod:`pipeloom.models.llama`) save the expanded ``h``-wide K and V.
* SwiGLU (Llama): the MLP input goes through two GEMMs (gate, up) of width ``ffn``; eager
  PyTorch saves gate, silu(gate), up and their product (4 * ffn per token); a fused SwiGLU
  kernel (Megatron ``impl='fused'``) saves [gate, up] and the product (3 * ffn).
* No dropout (Llama): the three dropout masks and the dropout output disappear.
* Flash attention saves Q, K, V, the output and the fp32 log-sum-exp (``4*a`` bytes per token)
  instead of the ``s x s`` softmax: no ``5*a*s/h`` term.
* RMSNorm saves its input and an fp32 ``rstd`` per token; the unfused ``impl='eager'`` RMSNorm
  of :mod:`pipeloom.models.llama` computes in fp32 and saves an fp32 copy of the input plus the
  normalised value.

B/W split (zero-bubble schedules, Qi et al. 2024): the weight gradient of a GEMM ``y = x W^T`` is
``dW = dy^T x``, so W needs the GEMM input ``x`` (saved by F) and the output gradient ``dy``
(made by B) of every weight GEMM. After B a microbatch still holds
``H = sum(GEMM inputs) + sum(GEMM output grads)``; this is the ``W: 32*s*b*h`` of Qi et al.'s
Table 1 for a GPT layer (inputs 2+2+2+8 = 14, output grads 6+2+8+2 = 18). In the schedule's
memory model (:class:`pipeloom.core.costs.MemModel`): ``a = A`` (what F allocates), ``b = A - H``
(what B frees), ``a - b = H`` (what W frees). Norm and embedding weight grads are done in B, as
in the official zero-bubble implementation (only GEMM weight grads are deferred).

Peak activations of a device come from the schedule itself: the order-based memory trace of
:func:`pipeloom.sim.simulate.memory_profile` with that MemModel, scaled by the unit
``U = sum_c A_c / pp`` (one full-stage microbatch activation), plus a transient working set
(one layer's activation grads during its backward; on the last stage the logits and their fp32
gradient), see :func:`transient_bytes`.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Sequence

from ..models.config import ModelConfig
from ..models.flops import active_params, embedding_params, head_params, layer_params, total_params  # noqa: F401
from ..models.hf_config import resolve_model
from ..models.presets import PRESETS, preset  # noqa: F401  (re-exported: `pipeloom memory --model`)
from ..models.slicing import even_layer_split

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
GiB = 1024 ** 3


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
    """data-parallel degree (only matters with zero=1)"""
    zero: int = 0
    """1 = shard fp32 master params/grads and Adam states over dp (ZeRO-1 / distributed optimizer)"""

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
        if self.zero not in (0, 1):
            raise MemoryConfigError(f"zero must be 0 (replicated optimizer) or 1 (sharded over dp), got {self.zero!r}")
        if self.sequence_parallel and self.tp == 1:
            object.__setattr__(self, "sequence_parallel", False)  # nothing to split

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


# ------------------------------------------------------------------------------------- parameters
# layer_params, embedding_params, head_params, total_params: pipeloom.models.flops (imported above)


def static_bytes(params: int, train: TrainConfig) -> tuple[int, int, int]:
    """(params, grads, optimizer) bytes for ``params`` parameters (table in the module docstring)."""
    d = train.dp if train.zero else 1
    if train.dtype == "fp32":
        return 4 * params, 4 * params, math.ceil(8 * params / d)
    if train.dtype == "bf16":
        return 2 * params, 4 * params, math.ceil(12 * params / d)
    return 2 * params, 2 * params + math.ceil(4 * params / d), math.ceil(12 * params / d)


# ------------------------------------------------------------------------------------- activations
@dataclass(frozen=True, slots=True)
class Item:
    """One saved tensor of a microbatch's forward: ``bytes`` on one device."""

    name: str
    bytes: float
    w_input: bool = False
    """input of a weight GEMM: still needed by the weight-gradient pass W"""
    core: bool = False
    """attention core (recomputed by selective recompute)"""


def _norm_items(prefix: str, model: ModelConfig, train: TrainConfig, tokens: float, rep: int, *,
                width: int | None = None, rows: int = 1) -> list[Item]:
    """A norm over ``width`` (default hidden) features, ``rows`` vectors per token (per-head q/k norms:
    rows = heads, width = head_dim)."""
    e = train.elem
    w = (model.hidden if width is None else width) * rows
    if model.norm == "layernorm":  # F.layer_norm / fused kernel: input + mean + rstd (fp32)
        return [Item(f"{prefix}.input", e * w * tokens / rep), Item(f"{prefix}.stats", 8 * rows * tokens / rep)]
    if train.impl != "fused":     # x.float(); x * rsqrt(mean(x^2)); (..).to(dtype) * weight
        return [Item(f"{prefix}.input_fp32", 4 * w * tokens / rep), Item(f"{prefix}.rstd", 4 * rows * tokens / rep),
                Item(f"{prefix}.normalised", e * w * tokens / rep)]
    return [Item(f"{prefix}.input", e * w * tokens / rep), Item(f"{prefix}.rstd", 4 * rows * tokens / rep)]


def _mlp_items(prefix: str, model: ModelConfig, train: TrainConfig, ffn: int, tokens: float,
               with_input: bool = True, deferred: bool = True) -> list[Item]:
    """One MLP (dense, one expert's share of the routed tokens, or a shared expert) of width ``ffn``;
    ``deferred``: its weight gradients wait for W (their GEMM inputs are held from B to W)."""
    e, h, t = train.elem, model.hidden, train.tp
    items = [Item(f"{prefix}.fc1.input", e * h * tokens, w_input=deferred)] if with_input else []
    if model.mlp == "gelu":
        items.append(Item(f"{prefix}.gelu.input", e * ffn * tokens / t))
        if train.impl == "hf" and model.gelu_saved > 1:  # GPT-2's gelu_new, written out in PyTorch ops
            items.append(Item(f"{prefix}.gelu.intermediates", (model.gelu_saved - 1) * e * ffn * tokens / t))
    elif train.impl != "fused":
        items += [Item(f"{prefix}.swiglu.gate", e * ffn * tokens / t),
                  Item(f"{prefix}.swiglu.silu_gate", e * ffn * tokens / t),
                  Item(f"{prefix}.swiglu.up", e * ffn * tokens / t)]
    else:
        items.append(Item(f"{prefix}.swiglu.gate_up", 2 * e * ffn * tokens / t))
    items.append(Item(f"{prefix}.fc2.input", e * ffn * tokens / t, w_input=deferred))
    return items


def _moe_items(model: ModelConfig, train: TrainConfig, tokens: float, rep: int) -> list[Item]:
    """MoE block after its norm: router, the top-k routed tokens through the experts, shared experts.

    Per token: the router input (the norm output, ``h``, shared with the shared experts) and its fp32
    softmax over the experts (``4*E``), the top-k weights (``4*k``) and indices (``8*k``); per routed
    token (``k`` per token) a gathered copy of the input (``h``), the expert's MLP activations and its
    output (``h``, kept to differentiate the routing weight); per shared expert its MLP activations,
    and with a gate the gate's sigmoid (4 bytes) and the shared output (``h``).

    The router's and the routed experts' weight gradients are computed in B, as pipeloom's runtime does:
    transformers (5.x) holds the experts as 3-D parameters run by grouped GEMMs and the router as a raw
    parameter, which the split backward (:mod:`pipeloom.runtime.splitgrad`, ``nn.Linear`` and ``Conv1D``
    only) cannot defer; so nothing of theirs is held from B to W. The shared experts and their gate are
    ``nn.Linear``: deferred to W (they keep the router's input, their own input, until W).
    """
    e, h, k, E = train.elem, model.hidden, model.experts_per_token, model.experts
    routed = tokens * k
    items = [Item("router.input", e * h * tokens / rep, w_input=bool(model.shared_experts)),
             Item("router.probs_fp32", 4 * E * tokens), Item("router.topk_weights", 4 * k * tokens),
             Item("router.topk_indices", 8 * k * tokens)]
    items += _mlp_items("experts", model, train, model.expert_ffn, routed, deferred=False)
    items.append(Item("experts.output", e * h * routed))
    for i in range(model.shared_experts):
        items += _mlp_items(f"shared{i}", model, train, model.shared_expert_ffn, tokens, with_input=False)
    if model.shared_experts and model.shared_expert_gate:
        items += [Item("shared.gate_sigmoid", 4 * tokens), Item("shared.output", e * h * tokens)]
    return items


def layer_activations(model: ModelConfig, train: TrainConfig, *, recompute: str | None = None) -> list[Item]:
    """Saved tensors of one transformer layer for one microbatch on one device (see module docstring)."""
    recompute = train.recompute if recompute is None else recompute
    e, h, f, a, t = train.elem, model.hidden, model.ffn, model.heads, train.tp
    q = model.q_dim
    s = train.seq or model.seq
    tokens = s * train.micro_batch
    rep = t if train.sequence_parallel else 1          # norm inputs, masks: split only with SP
    if recompute == "full":                             # checkpoint keeps the layer input only
        return [Item("layer.input", e * h * tokens / rep)]
    drop = model.dropout > 0
    expand = train.attention == "math" or train.impl == "eager"   # hf + flash: SDPA's native GQA
    kvw = q if expand else model.kv_dim
    items = _norm_items("attn_norm", model, train, tokens, rep)
    items.append(Item("qkv.input", e * h * tokens / rep, w_input=True))
    if model.qk_norm:                                    # per-head RMSNorm of q and k (Qwen3)
        items += _norm_items("q_norm", model, train, tokens, t, width=model.head_dim, rows=model.heads)
        items += _norm_items("k_norm", model, train, tokens, t, width=model.head_dim, rows=model.kv_heads)
    if train.impl == "eager" and e != 4:
        # pipeloom.models.llama casts its fp32 rotary tables to the activation dtype in each of the
        # two apply_rope calls (q and k): cos and sin of (s, head_dim/2), kept by the multiplications
        items.append(Item("rope.tables", 2 * 2 * s * (model.head_dim // 2) * e))
    if train.attention == "math":
        items += [Item("attn.q", e * q * tokens / t), Item("attn.k", e * q * tokens / t),
                  Item("attn.softmax", e * a * s * s * train.micro_batch / t, core=True)]
        if drop:
            items += [Item("attn.dropout_mask", a * s * s * train.micro_batch / t, core=True),
                      Item("attn.dropout_out", e * a * s * s * train.micro_batch / t, core=True)]
        items += [Item("attn.v", e * q * tokens / t), Item("proj.input", e * q * tokens / t, w_input=True)]
    else:
        items += [Item("attn.q", e * q * tokens / t), Item("attn.k", e * kvw * tokens / t),
                  Item("attn.v", e * kvw * tokens / t),
                  Item("attn.lse", 4 * a * tokens / t, core=True),
                  Item("proj.input", e * q * tokens / t, w_input=True)]  # = the attention output
    if drop:
        items.append(Item("attn.residual_dropout_mask", h * tokens / rep))
    items += _norm_items("mlp_norm", model, train, tokens, rep)
    if model.moe:
        items += _moe_items(model, train, tokens, rep)
    else:
        mlp = _mlp_items("mlp", model, train, f, tokens)
        mlp[0] = Item("fc1.input", e * h * tokens / rep, w_input=True)
        items += [Item(it.name.removeprefix("mlp."), it.bytes, it.w_input, it.core) for it in mlp]
    if drop:
        items.append(Item("mlp.residual_dropout_mask", h * tokens / rep))
    if recompute == "selective":
        items = [it for it in items if not it.core]
    return items


def layer_w_grads(model: ModelConfig, train: TrainConfig) -> float:
    """Output gradients ``dy`` of the layer's weight GEMMs, made by B and kept until W (bytes).
    MoE: the shared experts' (and their gate's); the router's and the routed experts' weight gradients
    are made in B (see :func:`_moe_items`), so none of theirs is kept."""
    e, h, f, t = train.elem, model.hidden, model.ffn, train.tp
    tokens = (train.seq or model.seq) * train.micro_batch
    gated = 2 if model.mlp == "swiglu" else 1
    qkv = e * (model.q_dim + 2 * model.kv_dim) * tokens / t
    proj = e * h * tokens                                   # row-parallel output grad is full width
    if not model.moe:
        return qkv + proj + gated * e * f * tokens / t + e * h * tokens
    mlp = model.shared_experts * (gated * e * model.shared_expert_ffn / t + e * h) * tokens
    if model.shared_experts and model.shared_expert_gate:
        mlp += e * tokens
    return qkv + proj + mlp


def layer_w_held(model: ModelConfig, train: TrainConfig) -> float:
    """H per layer: what a microbatch still holds between its B and its W (bytes).

    With full recompute B re-runs the layer, so W needs the recomputed GEMM inputs as well.
    """
    items = layer_activations(model, train, recompute="none")
    return sum(it.bytes for it in items if it.w_input) + layer_w_grads(model, train)


def chunk_input_bytes(model: ModelConfig, train: TrainConfig) -> float:
    """The received input of a non-first chunk, held by the runtime until B returns its gradient,
    when no backward op of the first layer already keeps that same tensor (bytes).

    The fused norm, LayerNorm, fp32 eager RMSNorm and full recompute all save the input itself;
    the eager RMSNorm in 16-bit saves an fp32 copy instead, so the 16-bit input is extra.
    """
    if train.impl != "fused" and model.norm == "rmsnorm" and train.elem != 4 and train.recompute != "full":
        tokens = (train.seq or model.seq) * train.micro_batch
        return train.elem * model.hidden * tokens / (train.tp if train.sequence_parallel else 1)
    return 0.0


def chunk_rope_bytes(model: ModelConfig, train: TrainConfig) -> float:
    """``impl='hf'``: transformers computes the rotary cos and sin of ``(1, s, head_dim)`` once per forward
    (in the activation dtype) and every layer's q/k multiplications save those same two tensors, so a
    chunk with layers holds them once (bytes). 0 for other impls (per layer there) or learned positions."""
    if train.impl != "hf" or model.learned_positions or train.recompute == "full":
        return 0.0
    return 2.0 * (train.seq or model.seq) * model.head_dim * train.elem


def embedding_activations(model: ModelConfig, train: TrainConfig) -> list[Item]:
    tokens = (train.seq or model.seq) * train.micro_batch
    rep = train.tp if train.sequence_parallel else 1
    items = [Item("embed.token_ids", 8 * tokens)]
    if model.dropout > 0:
        items.append(Item("embed.dropout_mask", model.hidden * tokens / rep))
    return items


def head_activations(model: ModelConfig, train: TrainConfig) -> list[Item]:
    """Final norm, head input, and the fp32 log-softmax the cross-entropy loss keeps."""
    tokens = (train.seq or model.seq) * train.micro_batch
    rep = train.tp if train.sequence_parallel else 1
    items = _norm_items("final_norm", model, train, tokens, rep)
    items += [Item("head.input", train.elem * model.hidden * tokens / rep, w_input=True),
              Item("loss.log_softmax_fp32", 4 * model.vocab * tokens / train.tp),
              Item("loss.targets", 8 * tokens)]
    return items


def head_w_grads(model: ModelConfig, train: TrainConfig) -> float:
    tokens = (train.seq or model.seq) * train.micro_batch
    return train.elem * model.vocab * tokens / train.tp


# ------------------------------------------------------------------------------------- per chunk
def split_layers(layers: int, num_chunks: int) -> list[int]:
    """Layers per global chunk, filled round-robin: the counts of
    :func:`pipeloom.models.slicing.even_layer_split`, the split the runtime builds."""
    if layers < num_chunks:
        raise MemoryConfigError(f"{layers} layers cannot fill {num_chunks} chunks (pp*vpp) with at least one "
                                f"layer each; lower pp or vpp")
    return [len(c) for c in even_layer_split(layers, num_chunks)]


@dataclass(frozen=True, slots=True)
class ChunkMemory:
    """Memory of one global chunk: parameters and per-microbatch activation accounting."""

    chunk: int
    layers: int
    params: int
    activation_bytes: float
    """A: saved by one microbatch's F"""
    w_held_bytes: float
    """H: still held between that microbatch's B and W"""
    layer_activation_bytes: float
    """one layer's saved activations without recompute (for the transient estimate)"""
    first: bool
    last: bool


def chunk_memory(model: ModelConfig, train: TrainConfig, layers_per_chunk: Sequence[int]) -> list[ChunkMemory]:
    check_tp(model, train)
    n = len(layers_per_chunk)
    if sum(layers_per_chunk) != model.layers or any(x < 0 for x in layers_per_chunk):
        raise MemoryConfigError(f"layers per chunk {list(layers_per_chunk)} must be >= 0 and sum to the "
                                f"model's {model.layers} layers")
    per_layer = sum(it.bytes for it in layer_activations(model, train))
    per_layer_none = sum(it.bytes for it in layer_activations(model, train, recompute="none"))
    held_layer = layer_w_held(model, train)
    out = []
    for c, nl in enumerate(layers_per_chunk):
        first, last = c == 0, c == n - 1
        params = nl * layer_params(model, train.tp)
        A, H = nl * per_layer, nl * held_layer
        if nl:
            A += chunk_rope_bytes(model, train)
        if first:
            params += embedding_params(model, train.tp)
            A += sum(it.bytes for it in embedding_activations(model, train))
        else:
            A += chunk_input_bytes(model, train)
        if last:
            params += head_params(model, train.tp, with_tied_copy=not first)
            hi = head_activations(model, train)
            A += sum(it.bytes for it in hi)
            H += sum(it.bytes for it in hi if it.w_input) + head_w_grads(model, train)
        out.append(ChunkMemory(c, nl, params, A, H, per_layer_none, first, last))
    return out


def transient_bytes(model: ModelConfig, train: TrainConfig, chunks: Sequence[ChunkMemory], *,
                    split: bool = False) -> float:
    """Working memory on top of the held activations while a job of these chunks runs (bytes).

    * backward of a layer: the incoming activation gradient and two ``ffn``-wide gradients alive
      at once (SwiGLU: d(silu) and d(up) while d(gate*up) still exists), ``e*(h/r + 2*ffn/t)`` per
      token (r = t with sequence parallel, else 1); with ``impl='eager'`` PyTorch also materialises
      a weight gradient before adding it into ``.grad``: ``e*(h/r + ffn/t)`` per token plus one
      ``h x ffn`` matrix, if that is larger (Megatron's fused accumulation writes in place);
    * full recompute: plus the recomputed activations of that one layer;
    * ``split`` (the device runs B jobs of a B/W split): B keeps the ``ffn``-wide GEMM output grads
      for W while the layer's saved activations are still being released, ``e*ffn/t`` more;
    * last chunk: the loss backward holds the fp32 gradients of the log-softmax output and input
      at once, ``8*V/t`` per token (the forward's logits + fp32 copy, ``(e+4)*V/t``, is less).

    Parameter gradients themselves are static (``grads``). Calibrated against the real CPU
    allocator on :mod:`pipeloom.models.llama`; see docs/bench/memory.md.
    """
    if not chunks:
        return 0.0
    e, t, h, f = train.elem, train.tp, model.hidden, model.ffn
    f_mat = f
    if model.moe:  # ffn-wide activations per token: the routed experts' and the shared ones'
        f = model.experts_per_token * model.expert_ffn + model.shared_experts * model.shared_expert_ffn
        f_mat = max(model.expert_ffn, model.shared_expert_ffn if model.shared_experts else 0)
    tokens = (train.seq or model.seq) * train.micro_batch
    rep = t if train.sequence_parallel else 1
    work = e * (h / rep + 2 * f / t) * tokens
    if train.impl != "fused":
        work = max(work, e * (h / rep + f / t) * tokens + e * h * f_mat / t)
    if train.recompute == "full":
        work += chunks[0].layer_activation_bytes
    if split:
        work += e * f * tokens / t
    logits = 8 * model.vocab * tokens / t if any(c.last for c in chunks) else 0.0
    return max(work, logits)


# ------------------------------------------------------------------------------------- schedule
@dataclass(slots=True)
class DeviceMemory:
    device: int
    chunks: list[int]
    layers: int
    params: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: float
    """peak held activations over the schedule (from the memory trace)"""
    transient_bytes: float
    peak_bytes: float
    peak_units: float
    """peak activations in schedule units (one full-stage microbatch activation)"""
    fits: bool | None = None

    def to_dict(self) -> dict:
        return {"device": self.device, "chunks": self.chunks, "layers": self.layers, "params": self.params,
                "params_bytes": self.params_bytes, "grads_bytes": self.grads_bytes,
                "optimizer_bytes": self.optimizer_bytes, "activations_bytes": int(round(self.activations_bytes)),
                "transient_bytes": int(round(self.transient_bytes)), "peak_bytes": int(round(self.peak_bytes)),
                "peak_units": self.peak_units, "fits": self.fits}


@dataclass(slots=True)
class MemoryReport:
    model: ModelConfig
    train: TrainConfig
    schedule_name: str
    pp: int
    vpp: int
    microbatches: int
    layers_per_chunk: list[int]
    unit_bytes: float
    mem_a: list[float]
    mem_b: list[float]
    devices: list[DeviceMemory]
    total_params: int
    gpu_bytes: int | None = None
    reserve_bytes: int = 0
    limit_units_available: float | None = None
    mem_limit_units: float | None = None
    notes: list[str] = field(default_factory=list)
    schedule: object = None
    """the :class:`~pipeloom.core.ir.Schedule` whose memory trace was used"""

    @property
    def fits(self) -> bool | None:
        if self.gpu_bytes is None:
            return None
        return all(d.fits for d in self.devices)

    def largest_limit_level(self) -> str | None:
        """Largest of the standard limits 1p/1.5p/2p whose units fit in every device's free memory."""
        if self.limit_units_available is None:
            return None
        best = None
        for lvl in (1.0, 1.5, 2.0):
            if lvl * self.pp <= self.limit_units_available + 1e-9:
                best = f"{lvl:g}p"
        return best

    def to_dict(self) -> dict:
        t = self.train
        return {
            "model": self.model.name, "total_params": int(self.total_params),
            "active_params": int(active_params(self.model)), "schedule": self.schedule_name,
            "pp": self.pp, "vpp": self.vpp, "microbatches": self.microbatches, "tp": t.tp, "dp": t.dp,
            "zero": t.zero, "dtype": t.dtype, "seq": t.seq or self.model.seq, "micro_batch": t.micro_batch,
            "recompute": t.recompute, "sequence_parallel": t.sequence_parallel, "attention": t.attention,
            "impl": t.impl, "layers_per_chunk": self.layers_per_chunk, "unit_bytes": self.unit_bytes,
            "mem_model": {"a": self.mem_a, "b": self.mem_b}, "mem_limit_units": self.mem_limit_units,
            "gpu_memory_bytes": self.gpu_bytes, "reserve_bytes": self.reserve_bytes,
            "limit_units_available": self.limit_units_available,
            "largest_limit_level": self.largest_limit_level(), "fits": self.fits,
            "devices": [d.to_dict() for d in self.devices], "notes": self.notes,
        }


def mem_model_for(chunks: Sequence[ChunkMemory], pp: int) -> tuple[float, list[float], list[float]]:
    """(unit bytes U, a per chunk, b per chunk) in schedule units; b may be < 0 (B allocates)."""
    U = sum(c.activation_bytes for c in chunks) / pp
    a = [c.activation_bytes / U for c in chunks]
    b = [(c.activation_bytes - c.w_held_bytes) / U for c in chunks]
    return U, a, b


def activation_trace(schedule, a: Sequence[float], b: Sequence[float]) -> tuple[list[float], list[list[float]]]:
    """Per-device peak and running memory in units: the simulator's trace
    (:func:`pipeloom.sim.simulate.memory_profile`) when ``0 <= b <= a``; otherwise the same walk with
    ``b`` outside that range (B allocating more than it frees, e.g. full recompute + B/W split)."""
    from ..core.costs import MemModel
    from ..core.rules import peak_memory
    from ..sim.simulate import memory_profile

    if all(0.0 <= y <= x + 1e-12 for x, y in zip(a, b)):
        return memory_profile(schedule, MemModel(a=tuple(a), b=tuple(b)))
    walks = [peak_memory(seq, a, b) for seq in schedule.devices]  # the rules' deltas, any sign of b
    return [p for p, _ in walks], [t for _, t in walks]


_BYTES_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?b?|b)?\s*$", re.I)
_MULT = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "ki": 1024, "m": 1000 ** 2, "mb": 1000 ** 2,
         "mib": 1024 ** 2, "mi": 1024 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3, "gib": GiB, "gi": GiB,
         "t": 1000 ** 4, "tb": 1000 ** 4, "tib": 1024 ** 4, "ti": 1024 ** 4}


def parse_bytes(text: str | int | float) -> int:
    """``80GiB``, ``80GB`` (10^9), ``512MiB``, ``1.5TiB`` or a plain number of bytes -> bytes."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text < 0 or not math.isfinite(text):
            raise MemoryConfigError(f"a memory size must be finite and >= 0, got {text}")
        return int(text)
    m = _BYTES_RE.match(str(text))
    if not m:
        raise MemoryConfigError(f"memory size {text!r} not understood: use a number with an optional unit "
                                f"B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000), "
                                f"e.g. 80GiB")
    return int(float(m.group(1)) * _MULT[(m.group(2) or "").lower()])


def is_byte_size(text: str) -> bool:
    """True when ``text`` names bytes (has a B/KiB/GiB... unit), not schedule units or Xp."""
    m = _BYTES_RE.match(str(text))
    return bool(m and m.group(2))


def estimate(model: ModelConfig | str, train: TrainConfig | None = None, *, schedule: str = "1f1b", pp: int,
             microbatches: int, vpp: int | None = None, layers_per_chunk: Sequence[int] | None = None,
             gpu_bytes: int | str | None = None, reserve_bytes: int | str = 0,
             mem_limit: str | float | None = None, options: dict | None = None) -> MemoryReport:
    """Per-device memory of ``model`` trained with ``train`` under schedule ``schedule``.

    ``model``: a :class:`ModelConfig`, a preset name, a shipped published config's name or a path to a
    Hugging Face ``config.json`` (:func:`pipeloom.models.hf_config.resolve_model`).

    The schedule is built by the registry with a :class:`~pipeloom.core.costs.MemModel` made from
    this estimate (so memory-aware builders plan with the model's real a/b), and its order-based
    memory trace gives the peak number of live microbatch activations per device.
    ``mem_limit``: schedule units, ``Xp``, or bytes per device (``"60GiB"``: converted with
    :func:`mem_limit_units`). ``gpu_bytes``: device memory to check the peak against.
    """
    from ..schedule.planning import make_spec, plan
    from ..schedule import registry
    from ..core.ir import Kind
    from ..core.costs import MemModel

    model = resolve_model(model)
    train = train or TrainConfig()
    if vpp is None:
        vpp = registry.default_vpp(schedule)
    if not isinstance(pp, int) or pp < 1 or not isinstance(vpp, int) or vpp < 1:
        raise MemoryConfigError(f"pp and vpp must be integers >= 1, got pp={pp!r} vpp={vpp!r}")
    nc = pp * vpp
    lpc = list(layers_per_chunk) if layers_per_chunk is not None else split_layers(model.layers, nc)
    if len(lpc) != nc:
        raise MemoryConfigError(f"layers per chunk has {len(lpc)} entries but pp*vpp = {nc} chunks")
    chunks = chunk_memory(model, train, lpc)
    U, a, b = mem_model_for(chunks, pp)
    notes = []
    b_model = [min(max(y, 0.0), x) for x, y in zip(a, b)]
    gpu = parse_bytes(gpu_bytes) if gpu_bytes is not None else None
    reserve = parse_bytes(reserve_bytes)
    placement = None
    # the chunk placement only depends on the builder; build once without a limit to learn it
    spec0 = make_spec(pp=pp, microbatches=microbatches, vpp=vpp, mem=MemModel(a=tuple(a), b=tuple(b_model)),
                      options=options)
    sched = plan(schedule, spec0, check=False)
    placement = sched.placement
    limit_units = None
    if mem_limit is not None and str(mem_limit).strip().lower() not in ("", "none"):
        if isinstance(mem_limit, str) and is_byte_size(mem_limit):
            limit_units = _available_units(model, train, chunks, pp, vpp, placement, parse_bytes(mem_limit),
                                           reserve, U)
            if limit_units <= 0:
                raise MemoryConfigError(f"memory limit {mem_limit} per device leaves no room for activations: "
                                        f"parameters, gradients and optimizer states alone need more")
            notes.append(f"--mem-limit {mem_limit} = {limit_units:.3g} units ({limit_units / pp:.3g}p)")
        spec = make_spec(pp=pp, microbatches=microbatches, vpp=vpp, mem=MemModel(a=tuple(a), b=tuple(b_model)),
                         mem_limit=float(limit_units) if limit_units is not None else mem_limit, options=options)
        limit_units = spec.mem_limit
        sched = plan(schedule, spec, check=False)
    peaks, _ = activation_trace(sched, a, b)
    if limit_units is not None and max(peaks) > limit_units + 1e-9:
        notes.append(f"schedule {sched.name!r} peaks at {max(peaks):.3g} units, above the limit of "
                     f"{limit_units:.3g} units (only memory-aware schedules honour --mem-limit)")
    if any(y < 0 for y in b) and any(j.kind is Kind.B for seq in sched.devices for j in seq):
        notes.append("B allocates more than it frees for this config (W needs the GEMM inputs and output grads: "
                     "H > A, e.g. with full recompute or sequence parallel); the schedule was planned with b = 0, "
                     "the peak is traced with the real b")
    devices = []
    for d in range(pp):
        mine = [c for c in chunks if sched.device_of(c.chunk) == d]
        params = _device_params(model, train, mine)
        pb, gb, ob = static_bytes(params, train)
        act = peaks[d] * U
        has_b = any(j.kind is Kind.B for j in sched.devices[d])
        tr = transient_bytes(model, train, mine, split=has_b)
        peak = pb + gb + ob + act + tr
        devices.append(DeviceMemory(d, [c.chunk for c in mine], sum(c.layers for c in mine), params, pb, gb, ob,
                                    act, tr, peak, peaks[d],
                                    None if gpu is None else peak + reserve <= gpu))
    rep = MemoryReport(model=model, train=train, schedule_name=sched.name, pp=pp, vpp=vpp,
                       microbatches=microbatches, layers_per_chunk=lpc, unit_bytes=U, mem_a=a, mem_b=b,
                       devices=devices, total_params=total_params(model), gpu_bytes=gpu, reserve_bytes=reserve,
                       mem_limit_units=limit_units, notes=notes, schedule=sched)
    if gpu is not None:
        rep.limit_units_available = _available_units(model, train, chunks, pp, vpp, placement, gpu, reserve, U)
    return rep


def _device_params(model: ModelConfig, train: TrainConfig, mine: Sequence[ChunkMemory]) -> int:
    params = sum(c.params for c in mine)
    if model.tied_embeddings and any(c.first for c in mine) and any(c.last and not c.first for c in mine):
        params -= model.vocab * model.hidden // train.tp  # tied head on the embedding's device: one copy
    return params


def _available_units(model, train, chunks, pp, vpp, placement, gpu: int, reserve: int, U: float) -> float:
    from ..core.ir import device_of

    avail = math.inf
    for d in range(pp):
        mine = [c for c in chunks if device_of(c.chunk, pp, placement) == d]
        pb, gb, ob = static_bytes(_device_params(model, train, mine), train)
        free = gpu - reserve - pb - gb - ob - transient_bytes(model, train, mine, split=True)
        avail = min(avail, free / U)
    return avail


def mem_limit_units(model: ModelConfig | str, train: TrainConfig | None = None, *, pp: int, vpp: int = 1,
                    gpu_bytes: int | str, placement: str = "interleaved", reserve_bytes: int | str = 0,
                    layers_per_chunk: Sequence[int] | None = None) -> float:
    """A per-device memory size in bytes -> the schedulers' memory limit in units.

    ``units = min_d (gpu - reserve - static_d - transient_d) / U``: what is left for held
    activations on the tightest device, in full-stage microbatch activations ``U``.
    Pass the result as ``PlanSpec.mem_limit`` (or ``--mem-limit``); 1p = pp units.
    """
    model = resolve_model(model)
    train = train or TrainConfig()
    lpc = list(layers_per_chunk) if layers_per_chunk is not None else split_layers(model.layers, pp * vpp)
    chunks = chunk_memory(model, train, lpc)
    U = sum(c.activation_bytes for c in chunks) / pp
    return _available_units(model, train, chunks, pp, vpp, placement, parse_bytes(gpu_bytes),
                            parse_bytes(reserve_bytes), U)
