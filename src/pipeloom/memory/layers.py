"""The analytic layer model: what one decoder layer, chunk and device hold, in bytes (no torch).

Everything is counted in bytes on one device (one tensor-parallel rank of one pipeline stage).

Static memory per parameter (Megatron-LM's mixed-precision accounting, docs/distrib_optimizer.md),
``d`` = data-parallel degree, sharded per ZeRO level ``z`` (Rajbhandari et al. 2020, "ZeRO", sec. 5:
stage 1 shards the optimizer states, stage 2 also the gradients, stage 3 also the parameters; FSDP's
full sharding is stage 3, Llama 3's FSDP without resharding after the forward is stage 2)::

    dtype   params        grads                          optimizer (fp32 master + Adam m, v)   z=0
    fp32    4  (/d z=3)   4  (/d z>=2)                   8 / d (z>=1; no master copy)           16
    bf16    2  (/d z=3)   4  (/d z>=2; fp32 main grads)  12 / d (z>=1)                          18
    fp16    2  (/d z=3)   2 + 4/d (z=1), 6/d (z>=2)      12 / d (z>=1)                          20

(ZeRO counts 16 bytes/param for fp16 Adam because it keeps no separate fp32 master gradient;
Megatron keeps one: 20.) Sharded gradients and parameters cost a transient per device (the
unsharded gradients of one chunk before their reduce-scatter; with z=3 also its gathered parameters
during its F, B and W): :func:`shard_transient_bytes`.

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

Peak activations of a device come from the schedule itself (:mod:`pipeloom.memory.analytic`): the
order-based memory trace with that MemModel, scaled by the unit ``U = sum_c A_c / pp`` (one full-stage
microbatch activation), plus a transient working set (one layer's activation grads during its backward;
on the last stage the logits and their fp32 gradient), see :func:`transient_bytes`. What a device
holds besides the schedule's activations is :func:`pipeloom.memory.budget.device_budget`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..models.config import ModelConfig
from ..models.flops import embedding_params, head_params, layer_params, layers_params
from ..models.slicing import even_layer_split
from .sharding import ZERO_LEVELS, shard_transient_bytes, sharded, static_bytes, zero_help  # noqa: F401
from .train import DTYPE_BYTES, MemoryConfigError, TrainConfig, check_tp  # noqa: F401  (their home: memory/train.py)

# ------------------------------------------------------------------------------------- parameters
# layer_params, embedding_params, head_params, total_params: pipeloom.models.flops (imported above)


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
    parameter, which the split backward (:mod:`pipeloom.autograd.splitgrad`, ``nn.Linear`` and ``Conv1D``
    only) cannot defer; so nothing of theirs is held from B to W. The shared experts and their gate are
    ``nn.Linear``: deferred to W (they keep the router's input, their own input, until W).
    """
    from .moe import train_load

    e, h, k, E = train.elem, model.hidden, model.experts_per_token, model.experts
    routed = tokens * k * train_load(train)  # a rank's experts carry the mean load times the load factor
    items = [Item("router.input", e * h * tokens / rep, w_input=bool(model.shared_experts)),
             Item("router.probs_fp32", 4 * E * tokens), Item("router.topk_weights", 4 * k * tokens),
             Item("router.topk_indices", 8 * k * tokens)]
    items += _mlp_items("experts", model, train, model.expert_ffn, routed, deferred=False)
    if train.impl != "fused":  # transformers weighs the expert's output; Megatron's weighted SwiGLU does not keep it
        items.append(Item("experts.output", e * h * routed))
    for i in range(model.shared_experts):
        items += _mlp_items(f"shared{i}", model, train, model.shared_expert_ffn, tokens, with_input=False)
    if model.shared_experts and model.shared_expert_gate:
        items += [Item("shared.gate_sigmoid", 4 * tokens), Item("shared.output", e * h * tokens)]
    return items


def layer_activations(model: ModelConfig, train: TrainConfig, *, recompute: str | None = None) -> list[Item]:
    """Saved tensors of one transformer layer for one microbatch on one device (see module docstring).
    ``recompute`` given (e.g. 'none' for what W needs) overrides the training's own, light recompute included."""
    own = recompute is None
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
    from . import moe as _moe

    if _moe.is_mla(model):  # DeepSeek's multi-head latent attention: its own items (memory/moe.py)
        items += [Item(*x) for x in _moe.mla_items(model, train, tokens, rep)]
        return _finish(model, train, items + _mlp_block(model, train, tokens, rep, f, drop), recompute, own)
    rep_in = 1 if train.keep_gathered_input else rep   # the column groups' input: gathered, or the shard
    items.append(Item("qkv.input", e * h * tokens / rep_in, w_input=True))
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
    return _finish(model, train, items + _mlp_block(model, train, tokens, rep, f, drop), recompute, own)


def _mlp_block(model: ModelConfig, train: TrainConfig, tokens: float, rep: int, f: int, drop: bool) -> list[Item]:
    e, h = train.elem, model.hidden
    items = [Item("attn.residual_dropout_mask", h * tokens / rep)] if drop else []
    items += _norm_items("mlp_norm", model, train, tokens, rep)
    if model.moe:
        items += _moe_items(model, train, tokens, rep)
    else:
        mlp = _mlp_items("mlp", model, train, f, tokens)
        rep_in = 1 if train.keep_gathered_input else rep   # the column groups' input: gathered, or the shard
        mlp[0] = Item("fc1.input", e * h * tokens / rep_in, w_input=True)
        items += [Item(it.name.removeprefix("mlp."), it.bytes, it.w_input, it.core) for it in mlp]
    if drop:
        items.append(Item("mlp.residual_dropout_mask", h * tokens / rep))
    return items


def _finish(model: ModelConfig, train: TrainConfig, items: list[Item], recompute: str, own: bool) -> list[Item]:
    """Selective recompute drops the attention core; FP8 caches the weight GEMMs' inputs in 1 byte; light
    recompute (``recompute_norms``) drops the norm and up-projection outputs from what F keeps, only for the
    training's own recompute (the items of ``recompute='none'`` are what B re-makes and W needs)."""
    from .moe import FP8_CACHED, LIGHT_RECOMPUTED, fp8_bytes

    if recompute == "selective":
        items = [it for it in items if not it.core]
    if train.fp8:
        items = [Item(it.name, fp8_bytes(it.bytes, train.elem), it.w_input, it.core)
                 if it.w_input or it.name.endswith(FP8_CACHED) else it for it in items]
    if train.recompute_norms and own:
        items = [it for it in items if it.name not in LIGHT_RECOMPUTED]
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
    from .moe import is_mla, mla_w_grads

    if is_mla(model):  # MLA's five projections (memory/moe.py)
        qkv, proj = mla_w_grads(model, train, tokens), 0.0
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


def stage_output_bytes(model: ModelConfig, train: TrainConfig) -> float:
    """A chunk's output for one microbatch (the hidden states it sends on; split over tp with sequence
    parallelism), bytes."""
    tokens = (train.seq or model.seq) * train.micro_batch
    return train.elem * model.hidden * tokens / (train.tp if train.sequence_parallel else 1)


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
    expert_params: int = 0
    """of ``params``: the routed experts' (their optimizer states shard over the expert-data-parallel group)"""


def chunk_memory(model: ModelConfig, train: TrainConfig, layers_per_chunk: Sequence[int]) -> list[ChunkMemory]:
    check_tp(model, train)
    from ..models.moe import ep_saving, expert_params
    from .moe import local_train

    train = local_train(model, train)  # checks ep; cp: every rank holds seq / cp tokens of each sequence
    n = len(layers_per_chunk)
    if sum(layers_per_chunk) != model.layers or any(x < 0 for x in layers_per_chunk):
        raise MemoryConfigError(f"layers per chunk {list(layers_per_chunk)} must be >= 0 and sum to the "
                                f"model's {model.layers} layers")
    per_layer = sum(it.bytes for it in layer_activations(model, train))
    per_layer_none = sum(it.bytes for it in layer_activations(model, train, recompute="none"))
    held_layer = layer_w_held(model, train)
    out, start = [], 0
    for c, nl in enumerate(layers_per_chunk):
        first, last = c == 0, c == n - 1
        # each layer counted as its own kind (DeepSeek's first dense layers are not MoE layers)
        params = layers_params(model, start, nl, train.tp) - ep_saving(model, start, nl, tp=train.tp, ep=train.ep)
        experts = expert_params(model, start, nl, tp=train.tp, ep=train.ep)
        start += nl
        A, H = nl * per_layer, nl * held_layer
        if nl:
            A += chunk_rope_bytes(model, train)
        if first:
            params += embedding_params(model, train.tp)
            A += sum(it.bytes for it in embedding_activations(model, train))
        else:
            A += chunk_input_bytes(model, train)
        if not last and not train.free_stage_io:  # the sent output, kept until B
            A += stage_output_bytes(model, train)
        if last:
            params += head_params(model, train.tp, with_tied_copy=not first)
            hi = head_activations(model, train)
            A += sum(it.bytes for it in hi)
            H += sum(it.bytes for it in hi if it.w_input) + head_w_grads(model, train)
            if getattr(model, "mtp_layers", 0):  # DeepSeek-V3's MTP modules sit with the head (memory/moe.py)
                from .moe import mtp_chunk

                p_, e_, a_, h_ = mtp_chunk(model, train, per_layer, held_layer, hi, head_w_grads(model, train))
                params, experts, A, H = params + p_, experts + e_, A + a_, H + h_
        out.append(ChunkMemory(c, nl, params, A, H, per_layer_none, first, last, experts))
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
    from .moe import local_train, routing_buffer_bytes

    train = local_train(model, train)
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
    work += routing_buffer_bytes(model, train, tokens)  # one dispatch/combine in flight (0 for a dense model)
    logits = 8 * model.vocab * tokens / t if any(c.last for c in chunks) else 0.0
    return max(work, logits)
