"""Tensor- and sequence-parallel communication of one decoder layer, and what each overlap mode hides (no torch).

One function per term, so that every exposed and every hidden second has a name (``pipeloom tune --explain``
prints them per job kind). Other parallel dimensions (expert, context parallel) add their terms beside these.

Volumes (Megatron-LM with sequence parallelism, Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models", Sec. 4.2.2): ``X = tokens x h`` activation values of 2 bytes; one ring all-gather or
reduce-scatter of X over ``t`` ranks takes ``g = (t-1)/t X / bw + (t-1) lat`` (:func:`pipeloom.sim.dp.collective_seconds`)
and an all-reduce of X takes ``2g``. Per layer (attention block, then MLP block):

* forward (F): an all-gather before each column-parallel GEMM (QKV, fc1) and a reduce-scatter after each
  row-parallel GEMM (output projection, fc2): ``4g`` (without sequence parallelism: two all-reduces, the same).
  :func:`tp_forward`.
* input gradient (B): an all-gather of the output gradient before each row-parallel dgrad (``2g``,
  :func:`tp_grad_gather`) and a reduce-scatter of each column-parallel dgrad (``2g``, :func:`tp_dgrad_reduce`;
  without sequence parallelism the input-gradient all-reduce). Only the second can run behind other work: it is
  what Megatron's ``LinearWithGradAccumulationAndAsyncCommunication`` launches asynchronously and waits for
  after the weight-gradient GEMM (Narayanan et al. 2021, Sec. 4.2; Megatron-LM's
  ``tensor_parallel/layers.py``).
* weight gradient (W): the re-gather (``2g``, :func:`tp_input_regather`). With sequence parallelism a
  column-parallel group keeps only its input's sequence shard (Megatron's accounting, the default of
  :func:`pipeloom.memory.layers.layer_activations`) and gathers it again before its weight gradients (Megatron's
  ``LinearWithGradAccumulationAndAsyncCommunication.backward``; pipeloom's runtime,
  :func:`pipeloom.models.tp_comm.regather_wgrad`). A split W double-buffers them: group k+1's gather runs under
  group k's GEMMs (:func:`regather_exposed`); a fused backward starts each group's gather before its dgrad GEMMs
  and waits before its wgrad ones, ``max(0, g - dgrad of the group)`` per group. ``off`` runs them blocking.
  With ``regather=False`` (``pipeloom run --keep-gathered-input``: the gathered input kept from F, counted
  full width by ``pipeloom memory --keep-gathered-input``) there is no W-side collective.

What each mode exposes (:func:`tp_layer_terms`; ``G_*`` are GEMM seconds of the layer on one rank):

* ``off``: every collective in full, in the job that issues it.
* ``async`` (Megatron's default): in a fused backward (BW) the dgrad reduce-scatter hides behind the
  column-parallel wgrad GEMMs, ``max(0, dgrad_reduce - G_wgrad_col)``; a split B (zero-bubble schedules) has no
  wgrad left to hide behind: the reduce-scatter is exposed in B (issue 30; the zero-bubble authors' fork makes
  it blocking when it splits).
* ``chunked:K``: in a split B the dgrad is micro-pipelined in K token chunks, the reduce-scatter of chunk i
  runs during the dgrad GEMM of chunk i+1: exposed ``c + (K-1) max(0, c - G_dgrad/K)`` with
  ``c = dgrad_reduce / K``; a fused BW runs as in ``async`` (the runtime's
  :mod:`pipeloom.runtime.tp_overlap` does: the wgrad GEMMs hide the whole collective, no token pieces).
* ``fill``: a split B runs an earlier microbatch's pending W while its reduce-scatter is in flight:
  ``max(0, dgrad_reduce - G_wgrad_col)`` as in a fused BW (the W work is moved, not removed); a fused BW as
  in ``async``. That assumes W work is pending at every split B; :func:`fill_pricing` checks it B by B on the
  plan (the tuner's :func:`fill_b_costs`), so a B with nothing pending exposes its collective in full.

Per job of a plan (a split B whose own W is the next job, which the runtime fuses; a fill that finds no
pending W) :mod:`pipeloom.sim.tp_jobs` applies these rules job by job for ``pipeloom simulate --tp-overlap``.
* ``userbuffers`` (Megatron's ``--tp-comm-overlap``, TransformerEngine): the forward all-gathers and
  reduce-scatters and the backward's output-gradient all-gathers are split into ``t`` ring steps that overlap the
  GEMMs consuming them: exposed ``max(comm / t, comm - G)`` (the first step cannot overlap).

Not modelled: the attention core, norms and the vocabulary-parallel loss' small all-reduces; contention between
the TP collectives and the pipeline's P2P on the same NVLink.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..models import flops as _flops
from ..models.config import ModelConfig
from ..sim.dp import Link, collective_seconds
from ..sim.tp_jobs import chunked_exposed, exposed_dgrad

#: bytes per activation value on the TP wire (bf16)
ACT_BYTES = 2
#: the overlap modes of the tensor-parallel runtime (issue 30) and the chunk count of ``chunked``
TP_OVERLAP_MODES = ("off", "async", "chunked", "fill")


class TPOverlapError(ValueError):
    """A bad ``--tp-overlap`` value (one line: what is allowed)."""


@dataclass(frozen=True, slots=True)
class TPOverlap:
    """How the TP collectives of a layer overlap compute: a mode of :data:`TP_OVERLAP_MODES` (``chunks`` for
    ``chunked``) and ``userbuffers`` (forward and output-gradient collectives overlapped with the GEMMs)."""

    mode: str = "async"
    chunks: int = 1
    userbuffers: bool = False

    def __post_init__(self) -> None:
        if self.mode not in TP_OVERLAP_MODES:
            raise TPOverlapError(f"tp overlap {self.mode!r}: choose off, async, chunked:K or fill")
        if not isinstance(self.chunks, int) or isinstance(self.chunks, bool) or self.chunks < 1:
            raise TPOverlapError(f"tp overlap chunks must be an integer >= 1, got {self.chunks!r}")
        if self.mode == "chunked" and self.chunks < 2:
            raise TPOverlapError(f"chunked:K needs K >= 2 token chunks, got {self.chunks}")

    @classmethod
    def parse(cls, text: "str | TPOverlap", userbuffers: bool = False) -> "TPOverlap":
        """``off``, ``async``, ``fill`` or ``chunked:K``."""
        if isinstance(text, TPOverlap):
            return text
        s = str(text).strip().lower()
        if s.startswith("chunked"):
            _, _, k = s.partition(":")
            if not k.strip().isdigit():
                raise TPOverlapError(f"tp overlap {text!r}: give chunked:K with K >= 2 token chunks, e.g. chunked:4")
            return cls("chunked", int(k), userbuffers)
        if s not in TP_OVERLAP_MODES:
            raise TPOverlapError(f"tp overlap {text!r}: choose off, async, chunked:K or fill")
        return cls(s, 1, userbuffers)

    def __str__(self) -> str:
        return (f"chunked:{self.chunks}" if self.mode == "chunked" else self.mode) + (
            " + userbuffers" if self.userbuffers else "")


# ------------------------------------------------------------------------------------------ volumes (seconds)
def _g(model: ModelConfig, tokens: float, tp: int, link: Link) -> float:
    """One all-gather (or reduce-scatter) of the ``tokens x h`` activation over ``tp`` ranks."""
    return collective_seconds("all_gather", tokens * model.hidden * ACT_BYTES, tp, link)


def tp_forward(model: ModelConfig, tokens: float, tp: int, link: Link) -> float:
    """F: all-gather before QKV and fc1, reduce-scatter after the output projection and fc2 (4 g)."""
    return 4 * _g(model, tokens, tp, link)


def tp_grad_gather(model: ModelConfig, tokens: float, tp: int, link: Link) -> float:
    """B: all-gather of the output gradient before the two row-parallel dgrads (2 g; needed before they start)."""
    return 2 * _g(model, tokens, tp, link)


def tp_dgrad_reduce(model: ModelConfig, tokens: float, tp: int, link: Link) -> float:
    """B: reduce-scatter of the two column-parallel input gradients (2 g): Megatron's async collective."""
    return 2 * _g(model, tokens, tp, link)


def tp_input_regather(model: ModelConfig, tokens: float, tp: int, link: Link) -> float:
    """The all-gather of the QKV and fc1 inputs for their weight gradients (2 g), run where those are computed
    (W, or a fused backward): Megatron's and pipeloom's default with sequence parallelism (module docstring)."""
    return 2 * _g(model, tokens, tp, link)


def regather_exposed(gathers, gemms) -> float:
    """Exposed seconds of W's double-buffered re-gathers: ``gathers[k]`` is group k's all-gather, ``gemms[k]`` the
    weight-gradient GEMMs W runs after waiting for it and before waiting for group k+1's (group k's own and the
    row-parallel ones that follow it). Gather k+1 starts before group k's GEMMs (at most two gathered inputs
    alive), so ``gathers[0] + sum_k max(0, gathers[k] - gemms[k-1])`` (:func:`pipeloom.models.tp_comm.regather_wgrad`;
    Megatron overlaps the same all-gather with the dgrad GEMM of its fused backward)."""
    gathers, gemms = list(gathers), list(gemms)
    if not gathers:
        return 0.0
    return gathers[0] + sum(max(0.0, g - gemms[k - 1]) for k, g in enumerate(gathers) if k)


def column_wgrad_flops(model: ModelConfig, tokens: float) -> float:
    """FLOPs of the column-parallel weight gradients of one layer (QKV, and fc1 or gate+up; for a MoE layer the
    active experts' and shared experts' first GEMMs): what the dgrad reduce-scatter can hide behind."""
    h, m = model.hidden, model.mlp_matrices
    qkv = h * (model.q_dim + 2 * model.kv_dim)
    if not model.moe:
        up = (m - 1) * h * model.ffn
    else:
        up = (model.experts_per_token * (m - 1) * h * model.expert_ffn
              + model.shared_experts * (m - 1) * h * (model.shared_expert_ffn or 0))
    return 2.0 * tokens * (qkv + up)


def gemm_flops(model: ModelConfig, tokens: float) -> float:
    """FLOPs of one layer's weight GEMMs in one pass (F's GEMMs; B's dgrad GEMMs are as many)."""
    return 2.0 * tokens * _flops.active_layer_params(model)


def column_share(model: ModelConfig) -> float:
    """Share of a layer's weight-GEMM time in its column-parallel groups (QKV, fc1/gate+up): the part of a W
    (wgrad) or B (dgrad) that can hide the input-gradient collective (:class:`pipeloom.sim.tp_jobs.TPJobTerms`)."""
    return column_wgrad_flops(model, 1.0) / gemm_flops(model, 1.0)


# ------------------------------------------------------------------------------------------ overlap
def _userbuffers(comm: float, gemm: float, tp: int) -> float:
    """TransformerEngine's ring-exchange overlap: ``max(comm / t, comm - gemm)`` stays exposed."""
    return max(comm / tp, comm - gemm)


def tp_layer_terms(model: ModelConfig, tokens: float, tp: int, link: Link, rate: float, overlap: TPOverlap,
                   *, fused: bool, regather: bool = True) -> dict:
    """Every TP term of one layer on one rank (seconds): ``{"F"|"B"|"W": {term: (total, exposed)}}``, where
    ``B`` (with ``fused``) is the B part of a fused BW, whose wgrad GEMMs hide the dgrad reduce-scatter.
    ``rate``: FLOP/s a rank reaches (peak x efficiency). The module docstring has the rules. ``regather``: the
    column groups' inputs are gathered again for their weight gradients (``tp_input_regather``: in W, or in the
    B of a fused BW); False: kept from F, no term."""
    if tp <= 1:
        return {"F": {}, "B": {}, "W": {}}
    terms = _layer_terms(model, tokens, tp, link, rate, overlap, fused=fused)
    if regather:
        total, exp = regather_layer(model, tokens, tp, link, rate, overlap, fused=fused)
        terms["B" if fused else "W"]["tp_input_regather"] = (total, exp)
    return terms


def regather_layer(model: ModelConfig, tokens: float, tp: int, link: Link, rate: float, overlap: TPOverlap,
                   *, fused: bool) -> tuple[float, float]:
    """(total, exposed) seconds of one layer's re-gathers (QKV's and fc1's inputs, ``g`` each). Split W, in a
    chunk's steady state (:func:`regather_exposed`): fc1's gather runs under the QKV and output-projection wgrad
    GEMMs, the next layer's QKV gather under fc1's and fc2's; the first gather of each W (one ``g`` per chunk
    pass) is not in this per-layer term. Fused backward: each gather under its own group's dgrad GEMMs. ``off``:
    blocking, all of it."""
    g = _g(model, tokens, tp, link)
    if overlap.mode == "off":
        return 2 * g, 2 * g
    h = model.hidden
    qkv = 2.0 * tokens * h * (model.q_dim + 2 * model.kv_dim) / tp / rate    # its wgrad (and dgrad) GEMMs
    up = (column_wgrad_flops(model, tokens) / tp / rate) - qkv                # fc1 (gate+up, or the experts')
    rest = max(0.0, gemm_flops(model, tokens) / tp / rate - qkv - up)         # output projection and fc2
    proj = min(rest, 2.0 * tokens * h * model.q_dim / tp / rate)              # the output projection
    if fused:
        return 2 * g, max(0.0, g - qkv) + max(0.0, g - up)
    # steady state: [qkv gather under the previous layer's fc1 + fc2, fc1 gather under qkv + proj]
    return 2 * g, regather_exposed([0.0, g, g], [up + rest - proj, qkv + proj])


def _layer_terms(model: ModelConfig, tokens: float, tp: int, link: Link, rate: float, overlap: TPOverlap,
                 *, fused: bool) -> dict:
    fwd = tp_forward(model, tokens, tp, link)
    gat = tp_grad_gather(model, tokens, tp, link)
    red = tp_dgrad_reduce(model, tokens, tp, link)
    g_gemm = gemm_flops(model, tokens) / tp / rate  # F's GEMMs; B's dgrad GEMMs
    g_wcol = column_wgrad_flops(model, tokens) / tp / rate
    ub = overlap.userbuffers
    f_exp = _userbuffers(fwd, g_gemm, tp) if ub else fwd
    gat_exp = _userbuffers(gat, g_gemm, tp) if ub else gat
    red_exp = dgrad_reduce_exposed(overlap, red, g_gemm, g_wcol, fused=fused)
    return {"F": {"tp_forward": (fwd, f_exp)},
            "B": {"tp_grad_gather": (gat, gat_exp), "tp_dgrad_reduce": (red, red_exp)},
            "W": {}}


def dgrad_reduce_exposed(overlap: TPOverlap, red: float, g_dgrad: float, g_wcol: float, *, fused: bool) -> float:
    """Exposed seconds of the column-parallel input-gradient collective ``red`` of a B (``fused``: of a BW, or of
    a B the runtime fuses with its W) under ``overlap``, with ``g_dgrad`` / ``g_wcol`` the seconds of the
    column groups' dgrad / wgrad GEMMs. ``fill`` assumes an earlier microbatch's W of at least ``g_wcol``
    is pending (:mod:`pipeloom.sim.tp_jobs` checks per job)."""
    return exposed_dgrad(overlap.mode, overlap.chunks, red, g_dgrad, g_wcol, fused=fused)


def exposed(terms: dict, kind: str) -> float:
    """Exposed seconds of the ``kind`` job (F, B or W) in :func:`tp_layer_terms`' output."""
    return sum(e for _, e in terms[kind].values())


__all__ = ["ACT_BYTES", "TPOverlap", "TPOverlapError", "TP_OVERLAP_MODES", "chunked_exposed", "column_share", "column_wgrad_flops",
           "dgrad_reduce_exposed", "exposed", "gemm_flops", "regather_exposed", "regather_layer", "tp_dgrad_reduce", "tp_forward",
           "tp_grad_gather", "tp_input_regather", "tp_layer_terms"]


# ------------------------------------------------------------------------------------------ fill, B by B of a plan
@dataclass(frozen=True, slots=True)
class FillPricing:
    """What ``fill`` hides in one plan, B by B (:func:`fill_pricing`)."""

    split_b: tuple[int, ...]
    """per device: its split Bs with a collective (a B whose own W is the next job is fused by the runtime, and a
    chunk without TP layers has none: not counted)"""
    filled_b: tuple[int, ...]
    """per device: the split Bs that find pending W work of an earlier microbatch at their position"""
    split_per_chunk: tuple[int, ...]
    """per chunk: its split Bs"""
    hidden: tuple[float, ...]
    """per chunk: collective seconds its split Bs hide under that W work"""
    exposed: tuple[float, ...]
    """per chunk: collective seconds its split Bs leave exposed"""


def fill_pricing(devices, comm, w, hideable=None) -> FillPricing:
    """Price ``fill`` per split B of a plan (``devices``: each device's job list; ``comm[c]``: the input-gradient
    collective of one B of chunk ``c``; ``w[c]``: the seconds of one W of chunk ``c``; ``hideable[c]``: the most
    of ``comm[c]`` a B may hide, default all). A split B hides as much of it as the W work pending at its position
    covers: the W jobs after it whose B has run, of another microbatch's pair, with no BW of their chunk in
    between, taken in order and each W's work once, as the runtime takes them
    (:meth:`pipeloom.runtime.tp_overlap.TPOverlap._fill`; :mod:`pipeloom.sim.tp_jobs` holds the one copy of that
    rule); the rest of its collective is exposed. So a B with no such W hides nothing: the first Bs of a
    cool-down, a B whose next pending W is its own pair's. Pure: the job lists only, no torch."""
    from ..core.ir import Kind
    from ..sim.tp_jobs import fill_work, fused_pairs

    nc = len(comm)
    cap = comm if hideable is None else hideable
    fused = fused_pairs(devices)
    hidden, exposed, per_chunk = [0.0] * nc, [0.0] * nc, [0] * nc
    split, filled = [], []
    for d, jobs in enumerate(devices):
        pos = {(j.kind, j.mb, j.chunk): i for i, j in enumerate(jobs)}
        moved = [0.0] * len(jobs)  # W work already taken by an earlier B's fill
        s = f = 0
        for i, j in enumerate(jobs):
            if j.kind is not Kind.B or (d, i) in fused or comm[j.chunk] <= 0:
                continue  # not a split B, or one without a collective (a chunk of no TP layer)
            took = fill_work(jobs, i, pos, w, moved, min(cap[j.chunk], comm[j.chunk]))
            s, f = s + 1, f + (took > 0)
            per_chunk[j.chunk] += 1
            hidden[j.chunk] += took
            exposed[j.chunk] += comm[j.chunk] - took
        split.append(s)
        filled.append(f)
    return FillPricing(tuple(split), tuple(filled), tuple(per_chunk), tuple(hidden), tuple(exposed))


def fill_b_costs(devices, B, W, layers, red: float, assumed: float,
                 movable: float = 1.0) -> tuple[list[float], FillPricing]:
    """Per-chunk B seconds of a plan under ``fill``, priced B by B. ``B``, ``W``: per-chunk seconds as
    :func:`tp_layer_terms` charges them: every split B exposing ``assumed`` of each layer's collective ``red``
    (``max(0, red - column wgrad)``, as if an earlier W were always pending); ``layers``: decoder layers per chunk.
    Here a split B of chunk ``c`` (collective ``layers[c] x red``) hides only what :func:`fill_pricing` finds
    pending, at most the ``layers[c] x (red - assumed)`` the layer model lets it hide (so no B gets cheaper than
    the tuner's bounds assume), and the difference is spread over the chunk's backward jobs (one B or BW per
    microbatch): each device's busy time is exact, its spread over the microbatches an average. ``movable``: the
    share of a W that fill may run (with re-gathered sequence-parallel inputs only the row-parallel GEMMs,
    ``1 - column_share``, as the runtime and :mod:`pipeloom.sim.tp_jobs` do). Returns the new B and the pricing
    (``--explain``)."""
    from ..core.ir import Kind

    pr = fill_pricing(devices, [n * red for n in layers], [w * movable for w in W],
                      [n * (red - assumed) for n in layers])
    backs = [0] * len(B)
    for jobs in devices:
        for j in jobs:
            if j.kind in (Kind.B, Kind.BW):
                backs[j.chunk] += 1
    out = [b + (pr.exposed[c] - pr.split_per_chunk[c] * layers[c] * assumed) / backs[c] if backs[c] else b
           for c, b in enumerate(B)]
    return out, pr


__all__ += ["FillPricing", "fill_b_costs", "fill_pricing"]
