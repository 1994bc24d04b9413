"""The step model's terms for expert parallelism, context parallelism and FP8 (no torch).

Each term is a formula with its source, checked by hand in ``tests/tune/test_moe_costs.py``; ``tune --explain``
prints them per job kind (:func:`layer_times`' ``parts``).

All-to-all (expert parallel; Lepikhin et al. 2020 GShard sec. 3; DeepSeek-V3 report sec. 3.2.2)
    One MoE layer's F sends a **dispatch** (each of a rank's tokens to its ``k`` experts) and a **combine**
    (the expert outputs back); its B sends their gradients the other way, two all-to-alls more. A rank sends
    ``V = tokens/(tp*cp) * k * h * load`` values per all-to-all (its sequence-parallel share of the
    microbatch; ``load`` the capacity factor or the dropless imbalance, :mod:`pipeloom.models.moe`), of
    which ``1/ep`` stays on the rank. With ``n`` ranks of the EP group in its node
    (:func:`pipeloom.models.moe.ep_ranks_per_node`), ``(n-1)/ep`` of it crosses NVLink and ``(ep-n)/ep``
    the network, each at its own per-GPU bandwidth, both at once::

        t_a2a = max((n-1)/ep * V*bytes / intra_bw + intra_lat,  (ep-n)/ep * V*bytes / inter_bw + inter_lat)

    (``+ inter_lat`` only when ``ep > n``). Node-limited routing (DeepSeek-V3: each token to at most
    ``route_nodes`` = 4 nodes, sent once per node over InfiniBand and forwarded inside it over NVLink) caps
    the network share at ``route_nodes * (N-1)/N`` copies per token (``N = ep/n`` nodes) instead of
    ``k * (ep-n)/ep``. Bytes per value: the activation dtype, the dispatch in FP8 (1 byte) under ``fp8``.

Routing permutation (Megatron-Core ``moe_utils.permute``/``unpermute``)
    Before the dispatch, a rank gathers each token's ``k`` copies in expert order; after the combine it
    scatter-adds them back, weighted. Each reads and writes ``tokens * k * h`` values: ``4 * e * tokens * k * h``
    bytes of HBM traffic per pass (F; B moves the gradients the same way), on every MoE layer, ep = 1 included.

Light recompute (DeepSeek-V3 sec. 3.2.3)
    B re-runs every RMSNorm (memory-bound, not priced) and MLA's up-projections, ``2 * tokens * (r_q * H * d_q +
    r_kv * H * (d_n + d_v))`` FLOPs split tp ways.

Expert load
    The busiest rank sets the pace: the routed experts' FLOPs (F: ``2*t*k*m*h*f_e``; B: twice that, their
    weight gradients being made in B, :mod:`pipeloom.models.flops`) are priced ``load`` times.

Ring attention (context parallel; Liu et al. 2023 "Ring Attention"; Megatron-Core's ``cp_comm_type p2p``)
    Each rank holds ``s/cp`` tokens (zig-zag: chunks ``i`` and ``2cp-1-i`` of ``2cp``, so every rank does
    the same causal work). F runs ``cp`` steps; in each, the attention of the local queries against one
    KV block while the next block (``2 * kv * s/cp * b`` values, K and V, per TP rank) is sent to the
    neighbour. Only what a step's transfer exceeds its compute is exposed::

        F: (cp - 1) * max(0, t_send(KV block) - core_F / cp)
        B: (cp - 1) * max(0, t_send(2 KV blocks: K, V and dK, dV) - core_B / cp)

    with ``core_F`` the attention-core seconds of the rank's queries against the whole sequence; the link is
    NVLink when ``tp * cp`` GPUs fit in a node, else the network.

FP8 (DeepSeek-V3 sec. 3.3; Transformer Engine's delayed/tile-wise scaling)
    The weight GEMMs run at ``fp8_speedup`` (2 on Hopper: 1979 vs 989 dense TFLOP/s) times the BF16 rate; the
    attention core stays BF16. Scaling overhead: every GEMM input is quantised before its GEMM, reading the
    16-bit value and writing one byte (+ the amax), ``3`` bytes per value at the HBM bandwidth, for the
    inputs of F's GEMMs and the output gradients of B's.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..models import flops as _flops
from ..models.config import ModelConfig
from ..models.moe import FP8_BYTES, dispatched_values, ep_ranks_per_node
from .costs import ACT_BYTES, PassTimes, layer_times as _dense_layer_times
from .gpus import GPU, Link

#: FP8 over BF16 dense tensor-core rate (H100/H200/H800 datasheets: 1979 / 989 TFLOP/s)
FP8_SPEEDUP = 2.0
#: bytes of HBM traffic to quantise one value to FP8 (read 2, write 1)
FP8_QUANT_BYTES = 3.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Parallel:
    """What the MoE / long-context terms need of a configuration."""

    ep: int = 1
    cp: int = 1
    load: float = 1.0
    """the busiest rank's expert load over the mean (capacity factor or dropless imbalance)"""
    fp8: bool = False
    route_nodes: int | None = None
    """node-limited routing: a token goes to at most this many nodes (DeepSeek-V3: 4); None = unlimited"""
    recompute_norms: bool = False
    """light recompute (DeepSeek-V3 sec. 3.2.3): B re-runs the norms and MLA's up-projections"""
    moe: bool = False
    """the layer is a MoE layer (its routing permutation is priced)"""

    @property
    def plain(self) -> bool:
        """Nothing of this module applies: :func:`pipeloom.tune.costs.layer_times` answers alone."""
        return (self.ep == 1 and self.cp == 1 and self.load == 1.0 and not self.fp8 and not self.recompute_norms
                and not self.moe)


# ------------------------------------------------------------------------------------------ all-to-all
def all_to_all_seconds(nbytes: float, ep: int, ranks_per_node: int, intra: Link, inter: Link, *,
                       copies_per_token: float | None = None, route_nodes: int | None = None) -> float:
    """Seconds of one all-to-all in which a rank sends ``nbytes`` spread evenly over the ``ep`` ranks of its
    group, ``ranks_per_node`` of which share its node (module docstring). ``copies_per_token`` (k) and
    ``route_nodes`` cap the network share under node-limited routing."""
    if ep <= 1 or nbytes <= 0:
        return 0.0
    n = max(1, min(ranks_per_node, ep))
    intra_share = (n - 1) / ep
    inter_share = (ep - n) / ep
    if route_nodes is not None and copies_per_token and ep > n:
        nodes = ep / n
        inter_share = min(inter_share, route_nodes * (nodes - 1) / nodes / copies_per_token)
        intra_share = (ep - 1) / ep - inter_share  # the rest crosses NVLink (directly or forwarded)
    t = intra_share * nbytes / intra.bandwidth + (intra.latency if n > 1 else 0.0)
    if ep > n:
        t = max(t, inter_share * nbytes / inter.bandwidth + inter.latency)
    return t


def moe_a2a_seconds(model: ModelConfig, gpu: GPU, *, tokens: float, tp: int, par: Parallel) -> tuple[float, float]:
    """(F, B) all-to-all seconds of one MoE layer for ``tokens`` tokens of a microbatch on one TP x CP group:
    F = dispatch (FP8 with ``fp8``) + combine; B = their two gradients (module docstring)."""
    if not model.moe or par.ep <= 1:
        return 0.0, 0.0
    values = dispatched_values(model, tokens / (tp * par.cp), load=par.load)
    n = ep_ranks_per_node(par.ep, tp, gpu.gpus_per_node, par.cp)

    def one(nbytes: float) -> float:
        return all_to_all_seconds(nbytes, par.ep, n, gpu.intra, gpu.inter, copies_per_token=model.experts_per_token,
                                  route_nodes=par.route_nodes)

    dispatch = one(values * (FP8_BYTES if par.fp8 else ACT_BYTES))
    combine = one(values * ACT_BYTES)
    return dispatch + combine, 2 * combine


# ------------------------------------------------------------------------------------------ ring attention
def kv_values_per_token(model: ModelConfig) -> int:
    """K and V values one token contributes to a ring step: ``2 * kv_heads * head_dim``; MLA sends its
    up-projected per-head keys and values, ``H * (d_nope + d_rope + d_v)`` (Megatron-Core's MLA with CP)."""
    if hasattr(model, "kv_lora_rank"):
        return model.heads * (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim)
    return 2 * model.kv_dim


def ring_seconds(model: ModelConfig, gpu: GPU, *, micro_batch: int, seq: int, tp: int, cp: int,
                 core_F: float, core_B: float) -> tuple[float, float]:
    """(F, B) exposed seconds of ring attention in one layer (module docstring); ``core_F``/``core_B`` are the
    rank's attention-core seconds in F and B."""
    if cp <= 1:
        return 0.0, 0.0
    link = gpu.intra if tp * cp <= gpu.gpus_per_node else gpu.inter
    block = kv_values_per_token(model) * seq / cp * micro_batch * ACT_BYTES / tp
    send = block / link.bandwidth + link.latency
    send_b = 2 * block / link.bandwidth + link.latency
    return (cp - 1) * max(0.0, send - core_F / cp), (cp - 1) * max(0.0, send_b - core_B / cp)


# ------------------------------------------------------------------------------------------ FP8
def gemm_input_width(model: ModelConfig) -> float:
    """Values per token that enter a layer's weight GEMMs (quantised under FP8): attention input and output
    (MLA: its latents too), the MLP's inputs (MoE: router input, ``k`` routed copies of ``h + f_e``, the shared
    experts' ``h + f_s``)."""
    h = model.hidden
    if hasattr(model, "kv_lora_rank"):
        attn = h + (model.q_lora_rank or 0) + model.kv_lora_rank + model.heads * model.v_head_dim
    else:
        attn = h + model.q_dim
    if not model.moe:
        return attn + h + model.ffn
    return (attn + h + model.experts_per_token * (h + model.expert_ffn)
            + model.shared_experts * (h + model.shared_expert_ffn))


# ------------------------------------------------------------------------------------------ one layer
def layer_times(model: ModelConfig, gpu: GPU, efficiency: float, *, tp: int, micro_batch: int, seq: int,
                recompute: str, par: Parallel | None = None, **dense_kw) -> PassTimes:
    """One decoder layer on one rank with the terms of the module docstring on top of
    :func:`pipeloom.tune.costs.layer_times` (its rate, its exposed TP collectives under ``dense_kw``'s overlap
    mode), which it returns unchanged for a plain layout."""
    par = par or Parallel()
    dense = _dense_layer_times(model, gpu, efficiency, tp=tp, micro_batch=micro_batch, seq=seq, recompute=recompute,
                               **dense_kw)
    if par.plain:
        return dense
    rate = dense.parts["rate_flops"]
    tokens = micro_batch * seq / par.cp                       # this rank's tokens (zig-zag share)
    f, b, w = _flops.layer_flops(model, tokens, seq=seq)      # GEMMs on them, core against the whole sequence
    core_f = f - _flops.layer_flops(model, tokens, seq=0)[0]  # the attention core's forward FLOPs (linear in s)
    gemm_f, gemm_b, gemm_w = f - core_f, b - 2 * core_f, w
    g = FP8_SPEEDUP if par.fp8 else 1.0
    routed = 2.0 * tokens * model.experts_per_token * model.mlp_matrices * model.hidden * model.expert_ffn \
        if model.moe else 0.0
    extra_load = par.load - 1.0
    tF = (gemm_f + extra_load * routed) / tp / rate / g + core_f / tp / rate
    tB = (gemm_b + 2 * extra_load * routed) / tp / rate / g + 2 * core_f / tp / rate
    tW = gemm_w / tp / rate / g
    quant = FP8_QUANT_BYTES * tokens * gemm_input_width(model) / tp / gpu.hbm_bandwidth if par.fp8 else 0.0
    exposed = dense.parts.get("tp_exposed_s", {})             # the dense layer's TP collectives, on seq/cp tokens
    cF, cB, cW = (exposed.get(k, 0.0) / par.cp for k in ("F", "B", "W"))
    a2a_F, a2a_B = moe_a2a_seconds(model, gpu, tokens=micro_batch * seq, tp=tp, par=par)
    ring_F, ring_B = ring_seconds(model, gpu, micro_batch=micro_batch, seq=seq, tp=tp, cp=par.cp,
                                  core_F=core_f / tp / rate, core_B=2 * core_f / tp / rate)
    perm = 4.0 * ACT_BYTES * tokens * model.experts_per_token * model.hidden * par.load / tp / gpu.hbm_bandwidth \
        if model.moe else 0.0
    extra = 0.0
    if recompute == "full":
        extra = tF + quant + cF + a2a_F + ring_F + perm
    elif recompute == "selective":
        extra = core_f / tp / rate
    light = 0.0
    if par.recompute_norms and hasattr(model, "kv_lora_rank") and recompute != "full":
        H = model.heads
        up = (model.q_lora_rank or 0) * H * (model.qk_nope_head_dim + model.qk_rope_head_dim) \
            + model.kv_lora_rank * H * (model.qk_nope_head_dim + model.v_head_dim)
        light = 2.0 * tokens * up / tp / rate / g
    extra += light
    parts = {**dense.parts, "flops_F": f, "flops_B": b, "flops_W": w, "tokens": tokens,
             "compute_F_s": tF, "compute_B_s": tB, "compute_W_s": tW, "tp_comm_per_pass_s": cF,
             "recompute_in_B_s": extra, "a2a_F_s": a2a_F, "a2a_B_s": a2a_B, "ring_F_s": ring_F, "ring_B_s": ring_B,
             "fp8_quant_per_pass_s": quant, "permute_per_pass_s": perm, "light_recompute_in_B_s": light,
             "expert_load": par.load, "ep": par.ep, "cp": par.cp}
    return PassTimes(tF + quant + cF + a2a_F + ring_F + perm, tB + quant + cB + extra + a2a_B + ring_B + perm,
                     tW + cW + (quant if par.fp8 else 0.0), parts)


# ------------------------------------------------------------------------------------------ one configuration
#: schedules whose builder pairs an F with a B (an overlapped pair hides all-to-all, core/costs.pair_hidden)
PAIRED = ("dualpipev",)


def chunk_a2a(space, c) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per chunk of ``c``: the all-to-all seconds inside its F and inside its B (the layer's times the chunk's
    layers; 0 for a dense model or ep = 1), what an overlapped pair can hide."""
    from .costs import backward_fused

    lt, _ = space.times(c.tp, c.microbatch_size, c.recompute, backward_fused(c.schedule), c.ep, c.cp)
    aF, aB = lt.parts.get("a2a_F_s", 0.0), lt.parts.get("a2a_B_s", 0.0)
    return tuple(n * aF for n in c.seg_layer_num), tuple(n * aB for n in c.seg_layer_num)


def pairs(space, c) -> bool:
    """Whether ``c``'s schedule has F&B pairs: its builder makes them (:data:`PAIRED`), or ``tune --pair-fb``
    adds them (:func:`pair_pass`)."""
    return c.schedule in PAIRED or bool(getattr(space.p, "pair_fb", False))


def pair_pass(space, c, sched, costs):
    """``sched`` with F&B pairs added (:func:`pipeloom.schedule.pairing.pair_forward_backward`, timed with the
    configuration's exact ``costs``) when ``tune --pair-fb`` asks for them, the schedule does not pair by itself
    and a pair has all-to-all to hide; else ``sched``. The pass never makes the schedule longer."""
    if c.schedule in PAIRED or not getattr(space.p, "pair_fb", False) or not any(
            x > 0 for v in (costs.a2a_F, costs.a2a_B) for x in (v if isinstance(v, (tuple, list)) else (v,))):
        return sched
    from ..schedule.pairing import pair_forward_backward

    return pair_forward_backward(sched, costs)


def hideable(space, c, F, B):
    """``F`` and ``B`` less what pairs can hide, for the lower bounds of a schedule that pairs (:data:`PAIRED`):
    a pair hides at most its two jobs' communication, so ``F - a2a_F`` and ``B - a2a_B`` bound its work."""
    if not pairs(space, c):
        return F, B
    aF, aB = chunk_a2a(space, c)
    return [x - y for x, y in zip(F, aF)], [x - y for x, y in zip(B, aB)]


def grad_groups(space, c, chunks) -> list:
    """The gradient groups of ``c`` (:class:`pipeloom.sim.dp.GradGroup`): the dense gradients reduce over the
    ``dp x cp`` ranks on the dp link (:func:`pipeloom.tune.costs.dp_link`), the routed experts' (``expert_params``
    of each chunk) over the ``dp x cp / ep`` expert-data-parallel ranks (:func:`pipeloom.models.moe.group_sizes`);
    that group's ranks are ``tp x ep`` apart (rank order tp-cp-ep-dp-pp), so it stays in a node when
    ``tp x ep x expert_dp <= gpus per node``, else its ``k = gpus per node / (tp x ep)`` ranks of a node share
    ``min(intra, k x inter)`` (the dp link's rule)."""
    from ..sim.dp import GradGroup
    from .costs import dp_link

    ep, cp = getattr(c, "ep", 1), getattr(c, "cp", 1)
    n = c.dp * cp
    share = [(ch.expert_params / ch.params) if ch.params > 0 else 0.0 for ch in chunks]
    dense = GradGroup(share=[1.0 - x for x in share], ranks=n, link=dp_link(space, c))
    if ep <= 1 or not any(share):
        return [GradGroup(share=[1.0] * len(chunks), ranks=n, link=dense.link)]
    m, stride, gpn = n // ep, c.tp * ep, space.p.gpn
    if stride * m <= gpn:
        link = space.gpu.intra
    else:
        k = max(1, min(m, gpn // stride)) if stride <= gpn else 1
        inter = space.gpu.inter
        link = inter if k == 1 else Link(bandwidth=min(space.gpu.intra.bandwidth, k * inter.bandwidth),
                                          latency=inter.latency)
    return [dense, GradGroup(share=share, ranks=m, link=link)]


__all__ = ["FP8_QUANT_BYTES", "FP8_SPEEDUP", "PAIRED", "Parallel", "all_to_all_seconds", "chunk_a2a", "gemm_input_width",
           "grad_groups", "hideable", "kv_values_per_token", "layer_times", "moe_a2a_seconds", "pair_pass", "pairs",
           "ring_seconds"]
