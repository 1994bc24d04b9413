"""Verdicts a person can act on, from a what-if analysis (:mod:`.whatif`) of an op trace (no torch).

Each verdict is a :class:`Verdict`: its kind, its text and its **score**, the share of the whole slowdown
``S`` (Eq. 1) that its subject alone explains, ``(S_x - 1) / (S - 1)`` clipped to [0, 1] with ``S_x`` the
subject's own what-if slowdown (S_w of a worker, S_stage of a stage, S_t of an op type); 0 when there is
no slowdown. Rules (``thr`` = the slowdown threshold, default 5%):

* nothing is said when ``S`` is below ``1 + thr``;
* **slow rank** (``straggler``): a worker with ``S_w >= 1 + thr`` whose per-step ``S_w`` passes the threshold
  in at least 60% of the steps and whose own compute takes more than typical (``compute x >= 1 + thr/2``;
  workers that only wait are not blamed) and is not explained by its stage (below);
* **imbalanced stage**: at least 3/4 of the dp ranks of a stage are such slow workers (dp = 1: its one
  worker) *and* the stage's compute exceeds the median of the other stages' by at least ``thr`` (a
  positive excess: a stage shorter than the others is never told to take fewer layers). The text gives
  a ``pipeloom partition`` command with layer costs fitted from the trace when the run's layer count is
  known (``--layers``, ``--model``, or the model line of pipeloom's own logs; never assumed). A worker of
  an imbalanced stage whose compute exceeds the median of its stage's other dp ranks by ``thr`` in at
  least 60% of the steps is a slow rank as well (a slow GPU on a heavy stage: both verdicts);
* **slow link** (``slow_link``): a communication op type ``t`` (anything but forward, backward and
  backward-weight compute) with ``S_t >= 1 + thr`` whose ops take >= 1.5x their typical time on some
  workers, none of which shares a pipeline (its dp rank; a dp collective: its stage) with a slow rank or
  an imbalanced stage. A compute slowdown makes the ranks that exchange data with it wait, and that waiting
  is the slow rank's, not a link's: such comm slowdowns are named in the slow rank's verdict instead.
  The link is the worker where ``t`` is slowest and its peer for ``t`` (forward send/recv: the next/previous
  stage; backward: the other way; a dp collective: the stage's dp group); the text says whether both ends
  share one machine (then it is no network) when the input tells machines (run logs);
* otherwise, when the steps are slow but the slowest worker changes from step to step: no fixed
  straggler (sequence-length or data imbalance; score ``1 - M_W``), or one worker is slowest in most slow
  steps (an intermittent straggler; score as a slow rank).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from ...core.files import atomic_write
from .whatif import COMPUTE_OPS, WhatIf

PERSISTENT_SHARE = 0.6
STAGE_SHARE = 0.75
LINK_RATIO = 1.5
"""a comm op type is slow on a worker when its ops take this many times their typical time there"""
HANDOFF_WAITED = 0.5
"""a worker's slow sends are a link's only when its consumers waited for at least this share of its hand-offs"""


@dataclass
class Verdict:
    """One finding: ``kind`` is ``slow_rank``, ``imbalanced_stage``, ``slow_link``, ``no_fixed_straggler`` or
    ``intermittent_straggler``; ``score`` the share of the slowdown its subject alone explains (module doc)."""

    kind: str
    text: str
    score: float
    subject: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Diagnosis:
    items: list[Verdict] = field(default_factory=list)
    stragglers: list[tuple[int, int]] = field(default_factory=list)
    imbalanced_stages: list[int] = field(default_factory=list)
    slow_optypes: list[str] = field(default_factory=list)
    no_fixed_straggler: bool = False
    scores: np.ndarray | None = None
    partition_command: str | None = None
    layer_costs: dict | None = None

    @property
    def verdicts(self) -> list[str]:
        """The texts, each ending with its score."""
        return [f"{v.text} [score {v.score:.2f}]" for v in self.items]


def _share(sx: float, S: float) -> float:
    """(S_x - 1) / (S - 1) clipped to [0, 1]; 0 without a slowdown."""
    if not (S > 1 + 1e-9) or not math.isfinite(sx):
        return 0.0
    return float(min(1.0, max(0.0, (sx - 1) / (S - 1))))


def _stage_compute(r: WhatIf, model, exclude: list[int] | None = None) -> np.ndarray:
    """Per stage the median over dp ranks and steps of the worker's compute time per step (fwd, bwd + weight);
    the workers in ``exclude`` (stragglers) count only where they are all their stage has."""
    W, K = r.W, len(r.steps)
    keep = np.ones(W, dtype=bool)
    keep[list(exclude or [])] = False
    out = np.zeros((r.pp, 2))
    key = model.worker * K + model.k
    for j, names in enumerate((COMPUTE_OPS[:1], COMPUTE_OPS[1:])):  # forward; backward (B and W)
        codes = [model.optypes.index(nm) for nm in names if nm in model.optypes]
        if not codes:
            continue
        sel = np.isin(model.op, codes)
        tot = np.bincount(key[sel], weights=model.dm[sel], minlength=W * K).reshape(r.dp, r.pp, K)
        for st in range(r.pp):
            use = keep[st::r.pp] if keep[st::r.pp].any() else np.ones(r.dp, dtype=bool)
            out[st, j] = np.median(tot[use, st])
    return out


def _stage_name(s: int, pp: int) -> str:
    return ("the last stage" if s == pp - 1 and pp > 1 else "the first stage" if s == 0 else f"stage {s}") + f" ({s})"


def diagnose(r: WhatIf, model, *, threshold: float = 0.05, layers: int | None = None,
             layers_per_stage: list[int] | None = None, vpp: int = 1, costs_path: str = "layer-costs.json",
             machines: dict[tuple[int, int], int] | None = None,
             handoffs: dict[tuple[int, int, str], float] | None = None) -> Diagnosis:
    """Apply the rules of the module docstring. ``layers``: the model's layer count (None: the run's, from
    ``layers_per_stage``; neither: unknown, no partition command); ``layers_per_stage``: the layers each stage
    held in the run (used when their sum is ``layers`` or ``layers`` is None; else an even split of ``layers``);
    ``machines``: (dp rank, stage) -> machine, when the input tells (run logs); ``handoffs``: (dp rank, stage,
    "forward" | "backward") -> the share of the worker's hand-offs its consumers waited for
    (:func:`~pipeloom.trace.runops.handoff_waits`, run logs), so that a send that only waits for a late receiver
    is no slow link."""
    dg = Diagnosis()
    W, K = r.W, len(r.steps)
    S = r.slowdown
    sw = np.array([r.worker_slowdown(w) for w in range(W)])
    dg.scores = np.array([_share(x, S) for x in sw])
    if not (S >= 1 + threshold):
        return dg
    # persistently slow workers (their own compute)
    swk = r.worker_slowdown_step()
    cr = r.compute_ratio
    med_cr = np.array([np.nanmedian(cr[w]) if np.isfinite(cr[w]).any() else 1.0 for w in range(W)])
    frac = (swk >= 1 + threshold).mean(axis=1)
    persistent = (sw >= 1 + threshold) & (frac >= PERSISTENT_SHARE) & (med_cr >= 1 + threshold / 2)
    stage_of, dp_of = np.arange(W) % r.pp, np.arange(W) // r.pp
    need = 1 if r.dp == 1 else max(2, math.ceil(STAGE_SHARE * r.dp))
    candidates = [s for s in range(r.pp) if ((stage_of == s) & persistent).sum() >= need]
    # a worker of a heavy stage that is clearly slower than the stage's other dp ranks is a straggler as well
    inner: dict[int, np.ndarray] = {}
    for w in np.flatnonzero(persistent & np.isin(stage_of, candidates)).tolist():
        rel = _stage_relative(cr, w, r.pp)
        if rel is not None and (rel >= 1 + threshold).mean() >= PERSISTENT_SHARE and np.nanmedian(rel) >= 1 + threshold:
            inner[w] = rel
    comp = _stage_compute(r, model, exclude=list(inner))
    tot = comp.sum(axis=1)
    excess = np.full(r.pp, np.nan)
    for s in range(r.pp):
        others = np.delete(tot, s)
        if others.size and np.median(others) > 0:
            excess[s] = tot[s] / np.median(others) - 1
    # a stage is imbalanced only when its compute exceeds the others' (a positive excess of at least thr)
    heavy = [s for s in candidates if r.pp > 1 and np.isfinite(excess[s]) and excess[s] >= threshold]
    if r.pp == 1:
        heavy = []
    slow_pipes: set[int] = set()  # dp ranks whose pipeline holds a slow rank
    slow_groups: set[int] = set()  # stages whose dp group holds one
    found: list[Verdict] = []
    rank_items: dict[int, Verdict] = {}
    for s in heavy:
        dg.imbalanced_stages.append(s)
        slow_pipes.update(range(r.dp))
        slow_groups.add(s)
        note = " (dp=1: one slow GPU looks the same)" if r.dp == 1 else ""
        text = (f"{_stage_name(s, r.pp)} is {100 * excess[s]:.0f}% longer than the median other stage on "
                f"all {r.dp} dp rank(s), every step, and alone slows the step {r.by_stage[s]:.2f}x: give it fewer "
                f"layers{note}")
        cmd, costs, why = _partition(r, comp, layers, layers_per_stage, vpp, costs_path)
        if cmd:
            dg.partition_command, dg.layer_costs = cmd, costs
            text += f"; rebalance: {cmd}"
        else:
            text += f"; {why}"
        found.append(Verdict("imbalanced_stage", text, _share(float(r.by_stage[s]), S),
                             {"stage": s, "excess": float(excess[s])}))
    for w in np.flatnonzero(persistent).tolist():
        s, d = int(stage_of[w]), int(dp_of[w])
        if w in inner:
            rel = inner[w]
            text = (f"worker dp {d} / pp {s} alone slows the step {sw[w]:.2f}x: beyond its stage's imbalance, its "
                    f"compute is {np.nanmedian(rel):.2f}x that of the other dp ranks of stage {s} in "
                    f"{int((rel >= 1 + threshold).sum())}/{K} steps (a slow rank: check that GPU)")
        elif s in heavy:
            continue  # as slow as its stage: the stage's verdict covers it
        else:
            nslow = int((cr[w] >= 1 + threshold / 2).sum())
            text = (f"worker dp {d} / pp {s} alone slows the step {sw[w]:.2f}x: its compute is {med_cr[w]:.2f}x "
                    f"its peers' in {nslow}/{K} steps (a slow rank: check that GPU)")
        dg.stragglers.append((d, s))
        slow_pipes.add(d)
        slow_groups.add(s)
        rank_items[w] = Verdict("slow_rank", text, _share(float(sw[w]), S), {"dp_rank": d, "stage": s})
        found.append(rank_items[w])
    # communication: a slow link only where no slow rank explains the waiting
    waits: dict[str, list[str]] = {}
    for t, st in sorted(r.by_optype.items(), key=lambda kv: -kv[1]):
        if t in COMPUTE_OPS or st < 1 + threshold:
            continue
        ratio = r.optype_ratio.get(t)
        if ratio is None:
            continue
        with np.errstate(all="ignore"):
            wr = np.array([np.nanmedian(ratio[w]) if np.isfinite(ratio[w]).any() else np.nan for w in range(W)])
        slow_w = [w for w in range(W) if np.isfinite(wr[w]) and wr[w] >= LINK_RATIO]
        if not slow_w:
            continue
        collective = not _is_p2p(t)
        explained = [w for w in slow_w if (stage_of[w] in slow_groups if collective else dp_of[w] in slow_pipes)]
        if len(explained) == len(slow_w):
            waits[t] = slow_w
            continue
        rest = [w for w in slow_w if w not in explained]
        if handoffs and t in ("forward-send", "backward-send"):  # a send that waits for a late receiver
            late_rx = [w for w in rest if handoffs.get((int(dp_of[w]), int(stage_of[w]), t.split("-")[0]), 1.0)
                       < HANDOFF_WAITED]
            rest = [w for w in rest if w not in late_rx]
            if not rest:
                continue
        w0 = max(rest, key=lambda w: wr[w])
        d0, s0 = int(dp_of[w0]), int(stage_of[w0])
        nsteps = int((r.by_optype_step[t] >= 1 + threshold).sum())
        if collective:
            where = f"on the dp group of stage {s0} ({wr[w0]:.1f}x its typical time on dp rank {d0})"
            ends = [(x, s0) for x in range(r.dp)]
            subject = {"optype": t, "stage": s0}
        else:
            peer = _p2p_peer(t, s0, r.pp)
            a, b = (s0, peer) if "send" in t else (peer, s0)
            where = (f"between stage {a} and stage {b}" + (f" of dp rank {d0}" if r.dp > 1 else "")
                     + f" ({t} on stage {s0} takes {wr[w0]:.1f}x its typical time)")
            ends = [(d0, a), (d0, b)]
            subject = {"optype": t, "dp_rank": d0, "from_stage": a, "to_stage": b}
        spread = len({int(stage_of[w]) for w in rest}) == r.pp and r.pp > 2
        if machines is not None and all(e in machines for e in ends):
            ms = sorted({machines[e] for e in ends})
            hint = (f"both ends on machine {ms[0]}: not the network; the transport between those ranks or a busy "
                    f"host" if len(ms) == 1 else f"check the network between machines {', '.join(map(str, ms))}")
        else:
            hint = "check the link between those ranks (network or intra-node transport)"
        if spread:
            hint = (f"slow on every stage, so not one link: a shared transport or a busy machine; the slowest is "
                    f"{where}")
            text = f"{t} alone slows the step {st:.2f}x in {nsteps}/{K} steps while every rank computes at its " \
                   f"typical speed: {hint}"
        else:
            text = (f"{t} alone slows the step {st:.2f}x in {nsteps}/{K} steps {where} while both ends compute at "
                    f"their typical speed: a slow link ({hint})")
        dg.slow_optypes.append(t)
        found.append(Verdict("slow_link", text, _share(float(st), S), subject))
    for t, ws in waits.items():  # the most telling slow rank (stage) whose pipeline waits says so in its verdict
        collective = not _is_p2p(t)
        best = None
        for v in sorted(found, key=lambda v: -v.score):
            if v.kind == "imbalanced_stage":
                mine = [w for w in ws if not collective or stage_of[w] == v.subject["stage"]]
            elif v.kind == "slow_rank":
                mine = [w for w in ws if (stage_of[w] == v.subject["stage"] if collective
                                          else dp_of[w] == v.subject["dp_rank"])]
            else:
                continue
            if mine:
                best = (v, mine)
                break
        if best is not None:
            v, mine = best
            where = ("every worker" if len(mine) == W else
                     ", ".join(f"pp {stage_of[w]}" + (f" / dp {dp_of[w]}" if r.dp > 1 else "") for w in mine))
            v.text += f"; the {t} ops of {where} wait for it (not a link)"
    dg.items = sorted(found, key=lambda v: -v.score)
    if not dg.items:
        slow_steps = np.flatnonzero(r.step_slowdown >= 1 + threshold)
        if len(slow_steps):
            worst = np.nanargmax(np.where(np.isfinite(cr[:, slow_steps]), cr[:, slow_steps], -np.inf), axis=0)
            vals, counts = np.unique(worst, return_counts=True)
            share = counts.max() / len(slow_steps)
            if len(slow_steps) >= 2 and share < 0.5:
                dg.no_fixed_straggler = True
                dg.items.append(Verdict(
                    "no_fixed_straggler",
                    f"slow workers change from step to step (no fixed straggler): {len(slow_steps)}/{K} steps are "
                    f"slower than ideal by >= {100 * threshold:.0f}%, their slowest worker is one of {len(vals)} "
                    f"different workers; likely sequence-length or data imbalance",
                    float(min(1.0, max(0.0, 1.0 - r.mw))), {"slow_steps": int(len(slow_steps))}))
            else:
                w = int(vals[np.argmax(counts)])
                dg.items.append(Verdict(
                    "intermittent_straggler",
                    f"worker dp {w // r.pp} / pp {w % r.pp} is the slowest in {counts.max()} of the "
                    f"{len(slow_steps)} slow steps (an intermittent straggler); the step is {S:.2f}x the ideal",
                    _share(float(sw[w]), S), {"dp_rank": w // r.pp, "stage": w % r.pp}))
    return dg


def _is_p2p(t: str) -> bool:
    return t in ("forward-send", "forward-recv", "backward-send", "backward-recv")


def _p2p_peer(t: str, s: int, pp: int) -> int:
    """The other end of a point-to-point op of stage ``s`` (forward: the next stage gets what ``s`` sends)."""
    step = 1 if t.startswith("forward") else -1
    if t.endswith("recv"):
        step = -step
    return (s + step) % pp


def _stage_relative(cr: np.ndarray, w: int, pp: int) -> np.ndarray | None:
    """Per step: worker ``w``'s compute ratio / the median of the other dp ranks' of its stage (None at dp = 1)."""
    peers = [x for x in range(w % pp, cr.shape[0], pp) if x != w]
    if not peers:
        return None
    with np.errstate(invalid="ignore", divide="ignore"):
        med = np.nanmedian(cr[peers], axis=0) if np.isfinite(cr[peers]).any() else np.full(cr.shape[1], np.nan)
        rel = cr[w] / med
    return np.where(np.isfinite(rel), rel, 0.0)


def _partition(r: WhatIf, comp: np.ndarray, layers: int | None, layers_per_stage: list[int] | None, vpp: int,
               costs_path: str) -> tuple[str | None, dict | None, str]:
    """Layer costs fitted from per-stage compute (each stage's layers: as the run held them, else an even split;
    the extra of the first and last stage becomes the embedding and the head) and the ``pipeloom partition``
    command that rebalances them; without a layer count, none, and why."""
    pp = r.pp
    if pp < 2:
        return None, None, "one stage: nothing to rebalance"
    if (layers_per_stage is not None and len(layers_per_stage) == pp and min(layers_per_stage) >= 1
            and layers in (None, sum(layers_per_stage))):  # the run's own split (a different count given: even)
        n = np.asarray(layers_per_stage, dtype=float)
        L = int(n.sum())
    elif layers is not None:
        L = layers
        n = np.full(pp, L // pp, dtype=float)
        n[: L % pp] += 1
    else:
        return None, None, ("for a pipeloom partition command that rebalances it, give the model's layer count "
                            "(--layers N or --model CONFIG)")
    if L < pp * max(1, vpp) or (n < 1).any():
        return None, None, f"{L} layers cannot fill {pp * max(1, vpp)} chunks: no partition command"
    per_layer = np.median(comp / n[:, None], axis=0)  # (fwd, bwd) of one layer, from the typical stages
    extra = np.maximum(0.0, comp - n[:, None] * per_layer[None, :])
    scale = per_layer[0] if per_layer[0] > 0 else 1.0

    def c(f, b):
        return {"F": round(float(f / scale), 4), "B": round(float(b / 2 / scale), 4),
                "W": round(float(b / 2 / scale), 4)}

    costs = {"layers": dict(count=int(L), **c(*per_layer)), "embedding": c(*extra[0]), "head": c(*extra[-1])}
    cmd = (f"pipeloom partition --layer-costs {costs_path} --pp {pp}" + (f" --vpp {vpp}" if vpp > 1 else "")
           + " --balance")
    return cmd, costs, ""


def write_layer_costs(path: str, costs: dict) -> str:
    """Write the fitted layer costs (JSON) whole or not at all."""
    with atomic_write(path) as fh:
        json.dump(costs, fh, indent=1)
    return path
