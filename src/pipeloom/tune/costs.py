"""The tuner's cost model: per-layer F/B/W seconds from FLOPs, and the communication formulas (no torch).

Every number the tuner uses comes from here, so ``pipeloom tune --explain`` can print them all.

Compute
    F, B, W FLOPs of one decoder layer for one microbatch come from :mod:`pipeloom.models.flops`
    (dense and MoE; B = input-gradient GEMMs + attention backward, W = weight-gradient GEMMs: the split
    the runtime performs). A device does ``1/tp`` of them at ``peak x efficiency`` FLOP/s. The head
    (final norm + vocabulary projection + loss) runs with the last chunk: ``2 * tokens * V * h`` FLOPs
    per pass (F, B and W alike); the embedding lookup costs no FLOPs.
    Recompute: ``full`` re-runs the layer's forward (and its TP collectives) inside B; ``selective``
    re-runs the attention core (QK^T and AV): B - F of the layer's FLOPs.

Tensor parallel (Megatron with sequence parallelism)
    Per layer: the all-gathers and reduce-scatters of the ``tokens x h`` activation in F, B and W, each named
    and charged by :mod:`pipeloom.tune.comm_terms` with what the overlap mode (``--tp-overlap off | async |
    chunked:K | fill``, ``--tp-comm-overlap``) hides: by default (``async``, Megatron's) the input-gradient
    reduce-scatter hides behind the weight-gradient GEMMs in a fused BW (1F1B, interleaved) and is exposed in a
    split B (zero-bubble schedules: :func:`backward_fused` says which a builder runs). On the intra-node link,
    ring algorithm: ``all_gather(n bytes, t ranks) = (t-1)/t * n / bandwidth + (t-1) * latency``.

Efficiency
    ``peak x efficiency`` for wide layers; with a calibration's ``efficiency_half_hidden`` the saturating curve
    :func:`shape_efficiency` of the hidden size (the work a layer does besides its GEMMs, norms, activations,
    residuals, is per ``tokens x h`` where the GEMMs' is per ``tokens x h^2``: its share falls as ``1/h``).

Pipeline
    One send per chunk boundary: ``tokens x h x 2 / tp`` bytes (sequence-parallel shard), ``latency +
    bytes / bandwidth``; on the intra-node link when the whole pipeline group sits in one node, else
    inter-node. The simulator adds it to every cross-device dependency.

Data parallel
    Gradients in fp32 (Megatron accumulates and reduces bf16 training's grads in fp32): ring all-reduce
    ``2 (d-1)/d`` of the bytes; with ZeRO reduce-scatter of the fp32 grads, and with ZeRO-1/2 all-gather of the
    bf16 parameters, ``(d-1)/d`` each. The gradients fill buckets (Megatron-Core's ``max(40M, 1M x dp)``
    parameters, :func:`dp_bucket_params`) through each chunk's last weight-gradient job of the simulated
    schedule and reduce as they fill, one after another on the device's link; ZeRO-2/3 per layer after every
    backward, ZeRO-3 gathering parameters per layer before each F and B. The model, the ring formulas and the
    link type are :mod:`pipeloom.sim.dp`'s (one DP model for the simulator's ``--dp`` and the tuner). Link
    (:func:`dp_link`): NVLink when the group sits in one node, else the inter-node link times the group's ranks
    per node (one NCCL ring per NIC), at most NVLink's bandwidth.

Optimizer
    Adam over the device's parameters is memory-bound: ``28 / z + 2`` bytes touched per parameter
    (fp32 master, grad, m, v read; master, m, v written; bf16 copy written; z = dp with ZeRO-1, else 1)
    at the HBM bandwidth.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..core.files import InputFileError, load_json
from ..models import flops as _flops
from ..models.config import ModelConfig
from ..sim.dp import collective_seconds, default_bucket_params, p2p_seconds
from .comm_terms import TPOverlap, tp_layer_terms
from .comm_terms import exposed as tp_exposed
from .gpus import GPU, GPUError, Link, check_figure, with_overrides

#: bytes per value: activations and TP/PP traffic in bf16, DP gradients in fp32
ACT_BYTES = 2
GRAD_BYTES = 4
PARAM_BYTES = 2


class CalibrationError(ValueError):
    """A calibration file that cannot be used (one line: what is wrong, what is allowed)."""


# ------------------------------------------------------------------------------------------ FLOPs
def layer_flops(model: ModelConfig, tokens: int, seq: int) -> tuple[float, float, float]:
    """(F, B, W) FLOPs of one decoder layer for ``tokens`` tokens of sequences of length ``seq``
    (:func:`pipeloom.models.flops.layer_flops`: dense and MoE)."""
    f, b, w = _flops.layer_flops(model, tokens, seq=seq)
    return float(f), float(b), float(w)


def attention_core_flops(model: ModelConfig, tokens: int, seq: int) -> float:
    """Forward FLOPs of the attention core (QK^T and AV): what B does beyond F in
    :func:`pipeloom.models.flops.layer_flops` (the core's backward is twice its forward)."""
    f, b, _ = layer_flops(model, tokens, seq)
    return b - f


def head_flops(model: ModelConfig, tokens: int) -> float:
    """FLOPs of one pass (F, B or W) of the vocabulary projection (:func:`pipeloom.models.flops.head_flops`)."""
    return float(_flops.head_flops(model, tokens)[0])


# ------------------------------------------------------------------------------------------ collectives
# (the ring formulas and the link type are pipeloom.sim.dp's, the one data-parallel reduction model)
def all_reduce(nbytes: float, n: int, link: Link) -> float:
    """Ring all-reduce of ``nbytes`` over ``n`` ranks (seconds): :func:`pipeloom.sim.dp.collective_seconds`."""
    return collective_seconds("allreduce", nbytes, n, link)


def reduce_scatter(nbytes: float, n: int, link: Link) -> float:
    """Ring reduce-scatter of ``nbytes`` total over ``n`` ranks (seconds)."""
    return collective_seconds("reduce_scatter", nbytes, n, link)


def all_gather(nbytes: float, n: int, link: Link) -> float:
    """Ring all-gather of ``nbytes`` total over ``n`` ranks (seconds)."""
    return collective_seconds("all_gather", nbytes, n, link)


p2p = p2p_seconds


# ------------------------------------------------------------------------------------------ calibration
@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """Figures that are measured rather than derived: the GEMM efficiency and (optionally) the links.

    File format (JSON), every key optional::

        {"efficiency": 0.5,                       # fraction of peak FLOP/s a layer's work reaches
         "intra": {"bandwidth": 3.6e11, "latency": 5e-6},   # bytes/s per GPU, seconds per message
         "inter": {"bandwidth": 4.5e10, "latency": 1e-5},
         "hbm_bandwidth": 3.35e12,                # bytes/s (optimizer step)
         "source": "free text: where the figures come from",
         # written by `pipeloom run --calibrate` (pipeloom.tune.measured):
         "achieved_flops": 2.1e10,                # FLOP/s the run's layers reached
         "device": {"type": "cpu", "name": "x86_64"},   # where (cuda: torch's device name)
         "measured": {...}}                       # the raw figures (per pass, P2P, DP all-reduce)

    With ``achieved_flops``, :meth:`resolve` turns the measurement into the tuner's figures for one GPU.
    """

    efficiency: float = 0.5
    intra: Link | None = None
    inter: Link | None = None
    hbm_bandwidth: float | None = None
    source: str = "default"
    achieved_flops: float | None = None
    device: dict | None = None
    measured: dict | None = None
    note: str = ""
    """how a measured calibration was used (set by :meth:`resolve`)"""
    efficiency_half_hidden: float = 0.0
    """the hidden size at which a layer reaches half of ``efficiency`` (:func:`shape_efficiency`); 0: one
    efficiency for every shape"""

    def __post_init__(self) -> None:
        if not (isinstance(self.efficiency, (int, float)) and 0 < self.efficiency <= 1):
            raise CalibrationError(f"efficiency must lie in (0, 1], got {self.efficiency!r}")

    def apply(self, gpu: GPU) -> GPU:
        return with_overrides(gpu, hbm_bandwidth=self.hbm_bandwidth,
                              intra_bandwidth=self.intra.bandwidth if self.intra else None,
                              intra_latency=self.intra.latency if self.intra else None,
                              inter_bandwidth=self.inter.bandwidth if self.inter else None,
                              inter_latency=self.inter.latency if self.inter else None)

    @classmethod
    def from_dict(cls, data: dict, source: str = "dict") -> "Calibration":
        if not isinstance(data, dict):
            raise CalibrationError(f"{source}: a calibration is a JSON object, got {type(data).__name__}")
        allowed = {"efficiency", "intra", "inter", "hbm_bandwidth", "source", "achieved_flops", "device", "measured",
                   "efficiency_half_hidden"}
        bad = set(data) - allowed
        if bad:
            raise CalibrationError(f"{source}: unknown key(s) {', '.join(sorted(bad))}; allowed: "
                                   f"{', '.join(sorted(allowed))}")
        kw: dict = {"source": str(data.get("source", source))}
        if "efficiency" in data:
            kw["efficiency"] = _num(data["efficiency"], source, "efficiency")
        for k in ("intra", "inter"):
            if k in data:
                v = data[k]
                if not isinstance(v, dict) or set(v) - {"bandwidth", "latency"}:
                    raise CalibrationError(f"{source}: {k} must be {{\"bandwidth\": bytes/s, \"latency\": s}}")
                try:
                    kw[k] = Link(bandwidth=_num(v.get("bandwidth", 1.0), source, f"{k}.bandwidth"),
                                 latency=_num(v.get("latency", 0.0), source, f"{k}.latency"))
                except ValueError as e:
                    raise CalibrationError(f"{source}: {k}: {e}") from None
                if "bandwidth" not in v:
                    raise CalibrationError(f"{source}: {k} needs a bandwidth (bytes/s)")
        if "hbm_bandwidth" in data:
            kw["hbm_bandwidth"] = _num(data["hbm_bandwidth"], source, "hbm_bandwidth")
        if "efficiency_half_hidden" in data:
            kw["efficiency_half_hidden"] = _num(data["efficiency_half_hidden"], source, "efficiency_half_hidden")
        if "achieved_flops" in data:
            kw["achieved_flops"] = _num(data["achieved_flops"], source, "achieved_flops")
            if kw["achieved_flops"] <= 0:
                raise CalibrationError(f"{source}: achieved_flops must be > 0 (FLOP/s)")
        if "device" in data:
            dev = data["device"]
            if not isinstance(dev, dict) or not isinstance(dev.get("type"), str):
                raise CalibrationError(f"{source}: device must be {{\"type\": \"cuda\" or \"cpu\", \"name\": ...}}")
            kw["device"] = {"type": dev["type"], "name": str(dev.get("name", ""))}
        if "measured" in data:
            if not isinstance(data["measured"], dict):
                raise CalibrationError(f"{source}: measured must be a JSON object")
            kw["measured"] = data["measured"]
        cal = cls(**kw)  # its own checks first
        try:  # plausible ranges (tune/gpus.py FIGURE_RANGES): a typo or an impossible measurement stops here
            for key, v, kind in ([("efficiency", kw.get("efficiency"), "efficiency"),
                                  ("hbm_bandwidth", kw.get("hbm_bandwidth"), "bandwidth"),
                                  ("achieved_flops", kw.get("achieved_flops"), "flops")]
                                 + [(f"{k}.{f}", getattr(kw[k], f), f) for k in ("intra", "inter") if k in kw
                                    for f in ("bandwidth", "latency")]):
                if v is not None:
                    check_figure(f"{source}: {key}", v, kind)
        except GPUError as e:
            raise CalibrationError(str(e)) from None
        return cal

    def ran_on(self, gpu: GPU) -> bool:
        """True when the measured run's device is ``gpu`` (a CUDA device whose name holds the preset's
        model, e.g. 'NVIDIA H100 80GB HBM3' for h100, 'NVIDIA A100-SXM4-80GB' for a100-80g)."""
        if not self.device or self.device.get("type") != "cuda":
            return False
        model = gpu.name.lower().split("-")[0]
        return bool(model) and model in self.device.get("name", "").lower().replace(" ", "")

    def resolve(self, gpu: GPU) -> tuple["Calibration", GPU]:
        """The calibration and GPU the tuner uses. Without ``achieved_flops``: both unchanged. Measured on
        ``gpu`` itself: efficiency = achieved / the preset's peak. Measured elsewhere (e.g. this CPU): the
        achieved FLOP/s replace the GPU's peak at efficiency 1 (what ``--gpu-flops X --efficiency 1``
        does); ``note`` says which, and ``--explain`` prints it."""
        if self.achieved_flops is None:
            return self, gpu
        dev = self.device or {"type": "?", "name": "?"}
        if self.ran_on(gpu):
            if self.achieved_flops > 1.05 * gpu.peak_flops:  # 5%: the datasheet's rounding, a boost clock
                raise CalibrationError(f"{self.source}: achieved_flops = {self.achieved_flops:.4g} FLOP/s measured on "
                                       f"{dev['name']} is {self.achieved_flops / gpu.peak_flops:.3g} x the {gpu.name} "
                                       f"peak of {gpu.peak_flops:.4g}; a run cannot beat its GPU's peak: measure again "
                                       f"or give --gpu")
            eff = min(1.0, self.achieved_flops / gpu.peak_flops)
            note = (f"measured on {dev['name']}: efficiency = {self.achieved_flops:.4g} FLOP/s / the {gpu.name} "
                    f"peak {gpu.peak_flops:.4g} = {eff:.4g}")
            hidden = (self.measured or {}).get("hidden")
            if self.efficiency_half_hidden and isinstance(hidden, (int, float)) and hidden > 0:
                # the run's layers reached eff at their width: the curve's wide-layer efficiency is above it
                eff = min(1.0, eff * (hidden + self.efficiency_half_hidden) / hidden)
                note += (f", at the run's hidden size {hidden:g} on the curve of half hidden size "
                         f"{self.efficiency_half_hidden:g}: {eff:.4g} for wide layers")
            return replace(self, efficiency=eff, note=note), gpu
        note = (f"measured on {dev['type']} ({dev['name']}), not on a {gpu.name}: its {self.achieved_flops:.4g} "
                f"FLOP/s replace the {gpu.name} peak at efficiency 1 (as --gpu-flops {self.achieved_flops:.4g} "
                f"--efficiency 1); memory and the links not in the file stay the {gpu.name}'s")
        return (replace(self, efficiency=1.0, note=note),
                replace(gpu, peak_flops=self.achieved_flops, name=f"{gpu.name} at {dev['type']} speed"))

    @classmethod
    def load(cls, path: str) -> "Calibration":
        try:  # bounded; not UTF-8, invalid JSON, too deep, a key given twice: one line naming the file
            data = load_json(path, "calibration file")
        except InputFileError as e:
            raise CalibrationError(str(e)) from None
        return cls.from_dict(data, source=path)

    def to_dict(self) -> dict:
        out: dict = {"efficiency": self.efficiency, "source": self.source}
        for k in ("intra", "inter"):
            v = getattr(self, k)
            if v is not None:
                out[k] = {"bandwidth": v.bandwidth, "latency": v.latency}
        if self.hbm_bandwidth is not None:
            out["hbm_bandwidth"] = self.hbm_bandwidth
        if self.efficiency_half_hidden:
            out["efficiency_half_hidden"] = self.efficiency_half_hidden
        for k in ("achieved_flops", "device", "measured"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        if self.note:
            out["note"] = self.note
        return out


def _num(v, source: str, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise CalibrationError(f"{source}: {key} must be a finite number >= 0, got {v!r}")
    return float(v)


# ------------------------------------------------------------------------------------------ per-layer times
@dataclass(frozen=True, slots=True)
class PassTimes:
    """Seconds of one microbatch's F, B, W on one device, and where they come from (for --explain)."""

    F: float
    B: float
    W: float
    parts: dict = field(default_factory=dict, compare=False)


def shape_efficiency(efficiency: float, half_hidden: float, hidden: float) -> float:
    """Fraction of peak a layer of hidden size ``hidden`` reaches: ``efficiency x h / (h + half_hidden)``
    (``efficiency`` for wide layers, half of it at ``h = half_hidden``; 0: every width alike). The form is time =
    GEMM work / rate + a part proportional to ``tokens x h / tp`` (norms, activations, dropout, residuals: memory-
    bound, per value of the layer's input): relative to the GEMMs' ``tokens x h^2 / tp`` it is ``half_hidden / h``
    whatever the tokens and tp (with sequence parallelism those ops run on ``tokens / tp``)."""
    if half_hidden <= 0:
        return efficiency
    return efficiency * hidden / (hidden + half_hidden)


def backward_fused(schedule: str) -> bool:
    """True when the builder ``schedule`` runs each backward as one fused BW job (1F1B, interleaved, ...), False
    when it splits B and W (zero-bubble, V-shapes): found once per builder by planning a small pipeline. A builder
    that mixes both (dualpipev) counts as split: its TP collectives are charged with the larger exposure."""
    hit = _FUSED.get(schedule)
    if hit is None:
        from ..core.ir import Kind
        from ..schedule import registry
        from ..schedule.registry import PlanSpec

        info = registry.get(schedule)
        vpp = {"1": 1, "2": 2}.get(info.vpp, 2)
        try:
            sched = registry.build(schedule, PlanSpec(pp=2, vpp=vpp, microbatches=4))
            hit = all(j.kind in (Kind.F, Kind.BW) for d in sched.devices for j in d)
        except Exception:  # a builder that cannot plan the probe: charge it as split (the larger exposure)
            hit = False
        _FUSED[schedule] = hit
    return hit


_FUSED: dict[str, bool] = {}


def layer_times(model: ModelConfig, gpu: GPU, efficiency: float, *, tp: int, micro_batch: int, seq: int,
                recompute: str, tp_overlap: TPOverlap | str = "async", fused: bool = True,
                half_hidden: float = 0.0) -> PassTimes:
    """One decoder layer on one TP rank (see the module docstring): compute at peak x
    :func:`shape_efficiency` (of the hidden size), plus the exposed part of each TP term of :func:`pipeloom.tune.comm_terms.tp_layer_terms`
    under ``tp_overlap``; ``fused``: the schedule runs B and W as one BW job (its wgrad GEMMs hide the dgrad
    reduce-scatter), else split. ``parts`` holds every term (total and exposed) for ``--explain``."""
    tokens = micro_batch * seq
    ov = TPOverlap.parse(tp_overlap)
    eff = shape_efficiency(efficiency, half_hidden, model.hidden)
    rate = gpu.peak_flops * eff
    f, b, w = layer_flops(model, tokens, seq)
    terms = tp_layer_terms(model, tokens, tp, gpu.intra, rate, ov, fused=fused)
    cF, cB, cW = tp_exposed(terms, "F"), tp_exposed(terms, "B"), tp_exposed(terms, "W")
    tF, tB, tW = f / tp / rate, b / tp / rate, w / tp / rate
    extra = 0.0
    if recompute == "full":
        extra = tF + cF
    elif recompute == "selective":
        extra = attention_core_flops(model, tokens, seq) / tp / rate
    parts = {"flops_F": f, "flops_B": b, "flops_W": w, "tokens": tokens, "rate_flops": rate, "efficiency": eff,
             "compute_F_s": tF, "compute_B_s": tB, "compute_W_s": tW,
             "tp_overlap": str(ov), "backward": "fused BW" if fused else "split B/W",
             "tp_comm_per_pass_s": cF, "tp_exposed_s": {"F": cF, "B": cB, "W": cW},
             "tp_terms_s": {k: {n: {"total": t, "exposed": e, "hidden": t - e} for n, (t, e) in v.items()}
                            for k, v in terms.items()},
             "recompute_in_B_s": extra}
    return PassTimes(tF + cF, tB + cB + extra, tW + cW, parts)


def head_times(model: ModelConfig, gpu: GPU, efficiency: float, *, tp: int, micro_batch: int, seq: int,
               half_hidden: float = 0.0) -> PassTimes:
    tokens = micro_batch * seq
    eff = shape_efficiency(efficiency, half_hidden, model.hidden)
    t = head_flops(model, tokens) / tp / (gpu.peak_flops * eff)
    return PassTimes(t, t, t, {"flops_per_pass": head_flops(model, tokens), "efficiency": eff})


def step_model_flops(model: ModelConfig, global_batch: int, seq: int) -> float:
    """FLOPs of one training step without recompute (the MFU numerator)."""
    tokens = global_batch * seq
    f, b, w = layer_flops(model, tokens, seq)
    return model.layers * (f + b + w) + 3 * head_flops(model, tokens)


__all__ = ["ACT_BYTES", "Calibration", "CalibrationError", "GRAD_BYTES", "PARAM_BYTES", "PassTimes", "all_gather",
           "all_reduce", "attention_core_flops", "head_flops", "head_times", "layer_flops", "layer_times", "p2p",
           "reduce_scatter", "step_model_flops"]

# ------------------------------------------------------------------------------------------ one configuration
# (``space`` is the search's cache of layer times and GPU figures, ``c`` a configuration: tune/space.py)
def chunk_costs(space, c) -> tuple[list[float], list[float], list[float], float]:
    """Per-chunk F, B, W seconds of ``c`` (:func:`pipeloom.partition.layer_costs.uniform_chunk_costs`: every layer
    the same, the head on the last chunk) and the P2P seconds of one chunk boundary."""
    from ..partition.layer_costs import uniform_chunk_costs

    lt, ht = space.times(c.tp, c.microbatch_size, c.recompute, backward_fused(c.schedule), getattr(c, "ep", 1),
                         getattr(c, "cp", 1))
    F, B, W = uniform_chunk_costs(c.seg_layer_num, (lt.F, lt.B, lt.W), (ht.F, ht.B, ht.W))
    n = getattr(space.p.model, "mtp_layers", 0)
    if n:  # DeepSeek-V3's MTP modules run with the head on the last chunk: one more layer and head pass each
        F[-1], B[-1], W[-1] = F[-1] + n * (lt.F + ht.F), B[-1] + n * (lt.B + ht.B), W[-1] + n * (lt.W + ht.W)
    return F, B, W, comm_p2p(space, c)


def comm_p2p(space, c) -> float:
    if c.pp == 1:
        return 0.0
    p = space.p
    cp = getattr(c, "cp", 1)
    link = space.gpu.intra if c.tp * cp * c.dp * c.pp <= p.gpn else space.gpu.inter
    nbytes = c.microbatch_size * p.seq * p.model.hidden * ACT_BYTES / c.tp / cp
    return p2p(nbytes, link)


def dp_ranks_per_node(space, c) -> int:
    """Ranks of one DP group inside one node: Megatron's rank order puts tp innermost, then dp, so a node of
    ``gpn`` GPUs holds ``min(dp, gpn / tp)`` of them."""
    return max(1, min(c.dp, space.p.gpn // c.tp))


def dp_link(space, c) -> Link:
    """The link a DP collective of ``c`` runs at: intra-node when the whole group sits in one node; else the
    inter-node link with the NICs of the group's ranks in a node working together (NCCL runs one ring per
    NIC: with ``k`` ranks per node each node sends through ``k`` NICs; every DP group of the node does the
    same at once, so each gets its own ``k``): ``min(intra, k x inter)`` bandwidth."""
    if c.tp * c.dp <= space.p.gpn:
        return space.gpu.intra
    k = dp_ranks_per_node(space, c)
    if k == 1:
        return space.gpu.inter
    inter = space.gpu.inter
    return Link(bandwidth=min(space.gpu.intra.bandwidth, k * inter.bandwidth), latency=inter.latency)


def dp_bucket_params(space, c) -> int:
    """Parameters per DP gradient bucket: the problem's, else Megatron-Core's default max(40M, 1M x dp)."""
    return space.p.dp_bucket_params or default_bucket_params(c.dp)


def dp_reduce_time(space, c, params: float) -> float:
    """Seconds to reduce ``params`` parameters' fp32 gradients over dp: all-reduce, or with any ZeRO level the
    reduce-scatter (:func:`pipeloom.sim.dp.collective_seconds`)."""
    kind = reduce_scatter if c.zero else all_reduce
    return kind(params * GRAD_BYTES, c.dp, dp_link(space, c))


def dp_param_gather_time(space, c, params: float) -> float:
    """Seconds to all-gather ``params`` bf16 parameters over dp (ZeRO-1/2 after the step, ZeRO-3 per pass)."""
    return all_gather(params * PARAM_BYTES, c.dp, dp_link(space, c)) if c.zero else 0.0


def dp_time(space, c, params: float) -> float:
    """Seconds to reduce ``params`` parameters' gradients over dp (and re-gather them with ZeRO-1/2): one
    chunk's whole reduction in one piece."""
    return dp_reduce_time(space, c, params) + (dp_param_gather_time(space, c, params) if c.zero in (1, 2) else 0.0)


def dp_tail(space, c, chunk_params: float, device_params: float, job_s: float = 0.0, units: int = 1) -> float:
    """Seconds of DP communication that must follow the end of a chunk's last weight-gradient job (at most
    ``job_s`` seconds long: its W, or B + W when fused) in every schedule (the tuner's bounds read this): its buckets
    (:func:`pipeloom.sim.dp.bucket_ready`) become ready from ``job_s (1 - b/P)`` before that end on and run one
    after another, so at least ``max(last bucket, all of them - job_s (1 - b/P))``; with ZeRO-1/2 the all-gather
    of the device's ``device_params`` parameters follows. ZeRO-2/3 reduce one of the chunk's ``units`` (layers)
    at a time instead of buckets."""
    b = chunk_params / max(1, units) if c.zero >= 2 else dp_bucket_params(space, c)
    if chunk_params > 0:
        n = math.ceil(chunk_params / b)
        last = dp_reduce_time(space, c, chunk_params - (n - 1) * b)
        every = (n - 1) * dp_reduce_time(space, c, b) + last
        t = max(last, every - job_s * (1.0 - min(1.0, b / chunk_params)))
    else:
        t = 0.0
    if c.zero in (1, 2):
        t += dp_param_gather_time(space, c, device_params)
    return t


def optimizer_time(space, c, params: float, expert_params: float = 0.0) -> float:
    n = c.dp * getattr(c, "cp", 1)
    z, ze = (n, n // getattr(c, "ep", 1)) if c.zero else (1, 1)
    return ((params - expert_params) * (28.0 / z + 2.0) + expert_params * (28.0 / ze + 2.0)) / space.gpu.hbm_bandwidth

