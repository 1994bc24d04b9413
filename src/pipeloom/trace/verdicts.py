"""Verdicts a person can act on, from a what-if analysis (:mod:`.whatif`) of an op trace (no torch).

Rules (``thr`` = the slowdown threshold, default 5%):

* nothing is said when the whole slowdown ``S`` (Eq. 1) is below ``1 + thr``;
* a communication optype ``t`` (anything but the compute ops: forward, backward, backward-weight) with ``S_t >= 1 + thr`` (Eq. 2) is
  named, with the stages whose dp group spends clearly more than the typical time on it;
* a worker is *persistently slow* when ``S_w >= 1 + thr`` (Eq. 4), its per-step ``S_w`` passes the threshold
  in at least 60% of the steps, and its own compute takes more than typical (so waiting workers are not
  blamed). When at least 3/4 of the dp ranks of one stage are persistently slow the stage is
  *imbalanced* (give it fewer layers; a ``pipeloom partition`` command with layer costs fitted from the
  trace follows); the other persistently slow workers are *stragglers* (hardware?), and so is a worker of an
  imbalanced stage whose compute exceeds the median of its stage's other dp ranks by ``thr`` in at least 60%
  of the steps (a slow GPU on a heavy stage: both verdicts);
* otherwise, when the steps are slow but the slowest worker changes from step to step: no fixed
  straggler (sequence-length or data imbalance).

Per-worker score in [0, 1]: ``(S_w - 1) / (S - 1)`` clipped, the share of the slowdown the worker alone
explains (0 when there is no slowdown).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

import numpy as np

from .whatif import COMPUTE_OPS, WhatIf

PERSISTENT_SHARE = 0.6
STAGE_SHARE = 0.75
DEFAULT_LAYERS_PER_STAGE = 8


@dataclass
class Diagnosis:
    verdicts: list[str] = field(default_factory=list)
    stragglers: list[tuple[int, int]] = field(default_factory=list)
    imbalanced_stages: list[int] = field(default_factory=list)
    slow_optypes: list[str] = field(default_factory=list)
    no_fixed_straggler: bool = False
    scores: np.ndarray | None = None
    partition_command: str | None = None
    layer_costs: dict | None = None


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


def diagnose(r: WhatIf, model, *, threshold: float = 0.05, layers: int | None = None, vpp: int = 1,
             costs_path: str = "layer-costs.json") -> Diagnosis:
    """Apply the rules of the module docstring."""
    dg = Diagnosis()
    W, K = r.W, len(r.steps)
    S = r.slowdown
    sw = np.array([r.worker_slowdown(w) for w in range(W)])
    dg.scores = np.clip((sw - 1) / (S - 1), 0, 1) if S > 1 + 1e-9 else np.zeros(W)
    if S < 1 + threshold:
        return dg
    # communication optypes
    for t, st in sorted(r.by_optype.items(), key=lambda kv: -kv[1]):
        if t in COMPUTE_OPS or st < 1 + threshold:
            continue
        ratio = r.optype_ratio.get(t)
        where = ""
        if ratio is not None:
            per_stage = np.array([np.nanmedian(ratio[s::r.pp]) if np.isfinite(ratio[s::r.pp]).any() else np.nan
                                  for s in range(r.pp)])
            slow = [s for s in range(r.pp) if np.isfinite(per_stage[s]) and per_stage[s] >= 1.5]
            if slow:
                where = (f": it takes {np.nanmax(per_stage[slow]):.1f}x its typical time on the dp group of stage"
                         f"{'s' if len(slow) > 1 else ''} {', '.join(map(str, slow))}")
        nsteps = int((r.by_optype_step[t] >= 1 + threshold).sum())
        dg.slow_optypes.append(t)
        dg.verdicts.append(f"{t} alone slows the step {st:.2f}x in {nsteps}/{K} steps{where} "
                           f"(a slow link or collective: check those ranks' network)")
    # persistently slow workers
    swk = r.worker_slowdown_step()
    cr = r.compute_ratio
    med_cr = np.array([np.nanmedian(cr[w]) if np.isfinite(cr[w]).any() else 1.0 for w in range(W)])
    frac = (swk >= 1 + threshold).mean(axis=1)
    persistent = (sw >= 1 + threshold) & (frac >= PERSISTENT_SHARE) & (med_cr >= 1 + threshold / 2)
    stage_of, dp_of = np.arange(W) % r.pp, np.arange(W) // r.pp
    need = 1 if r.dp == 1 else max(2, math.ceil(STAGE_SHARE * r.dp))
    heavy = [s for s in range(r.pp) if ((stage_of == s) & persistent).sum() >= need]
    # a worker of a heavy stage that is clearly slower than the stage's other dp ranks is a straggler as well
    inner: dict[int, np.ndarray] = {}
    for w in np.flatnonzero(persistent & np.isin(stage_of, heavy)).tolist():
        rel = _stage_relative(cr, w, r.pp)
        if rel is not None and (rel >= 1 + threshold).mean() >= PERSISTENT_SHARE and np.nanmedian(rel) >= 1 + threshold:
            inner[w] = rel
    comp = _stage_compute(r, model, exclude=list(inner))
    for s in heavy:
        dg.imbalanced_stages.append(s)
        tot = comp.sum(axis=1)
        others = np.delete(tot, s)
        pct = 100 * (tot[s] / others.mean() - 1) if others.size and others.mean() > 0 else float("nan")
        name = "the last stage" if s == r.pp - 1 else "the first stage" if s == 0 else f"stage {s}"
        note = " (dp=1: one slow GPU looks the same)" if r.dp == 1 else ""
        text = (f"{name} ({s}) is {pct:.0f}% longer than the others on all {r.dp} dp rank(s), every step, and "
                f"alone slows the step {r.by_stage[s]:.2f}x: give it fewer layers{note}")
        cmd, costs = _partition(r, comp, layers, vpp, costs_path)
        if cmd:
            dg.partition_command, dg.layer_costs = cmd, costs
            text += f"; rebalance: {cmd}"
        dg.verdicts.append(text)
    for w in np.flatnonzero(persistent).tolist():
        s, d = int(stage_of[w]), int(dp_of[w])
        if w in inner:
            rel = inner[w]
            dg.stragglers.append((d, s))
            dg.verdicts.append(f"worker dp {d} / pp {s} alone slows the step {sw[w]:.2f}x: beyond its stage's "
                               f"imbalance, its compute is {np.nanmedian(rel):.2f}x that of the other dp ranks of "
                               f"stage {s} in {int((rel >= 1 + threshold).sum())}/{K} steps (hardware? check that GPU)")
            continue
        if s in heavy:
            continue  # as slow as its stage: the stage's verdict covers it
        dg.stragglers.append((d, s))
        nslow = int((cr[w] >= 1 + threshold / 2).sum())
        dg.verdicts.append(f"worker dp {d} / pp {s} alone slows the step {sw[w]:.2f}x: its compute is "
                           f"{med_cr[w]:.2f}x slower than its peers' in {nslow}/{K} steps (hardware? check that GPU)")
    if not dg.verdicts:
        slow_steps = np.flatnonzero(r.step_slowdown >= 1 + threshold)
        if len(slow_steps):
            worst = np.nanargmax(np.where(np.isfinite(cr[:, slow_steps]), cr[:, slow_steps], -np.inf), axis=0)
            vals, counts = np.unique(worst, return_counts=True)
            share = counts.max() / len(slow_steps)
            if len(slow_steps) >= 2 and share < 0.5:
                dg.no_fixed_straggler = True
                dg.verdicts.append(f"slow workers change from step to step (no fixed straggler): {len(slow_steps)}/{K} "
                                   f"steps are slower than ideal by >= {100 * threshold:.0f}%, their slowest worker is "
                                   f"one of {len(vals)} different workers; likely sequence-length or data imbalance")
            else:
                w = int(vals[np.argmax(counts)])
                dg.verdicts.append(f"worker dp {w // r.pp} / pp {w % r.pp} is the slowest in {counts.max()} of the "
                                   f"{len(slow_steps)} slow steps (an intermittent straggler); the step is "
                                   f"{S:.2f}x the ideal")
    return dg


def _stage_relative(cr: np.ndarray, w: int, pp: int) -> np.ndarray | None:
    """Per step: worker ``w``'s compute ratio / the median of the other dp ranks' of its stage (None at dp = 1)."""
    peers = [x for x in range(w % pp, cr.shape[0], pp) if x != w]
    if not peers:
        return None
    with np.errstate(invalid="ignore", divide="ignore"):
        med = np.nanmedian(cr[peers], axis=0) if np.isfinite(cr[peers]).any() else np.full(cr.shape[1], np.nan)
        rel = cr[w] / med
    return np.where(np.isfinite(rel), rel, 0.0)


def _partition(r: WhatIf, comp: np.ndarray, layers: int | None, vpp: int,
               costs_path: str) -> tuple[str | None, dict | None]:
    """Layer costs fitted from per-stage compute (uniform layers assumed now; the extra of the first and last
    stage becomes the embedding and the head) and the ``pipeloom partition`` command that rebalances them."""
    pp = r.pp
    if pp < 2:
        return None, None
    L = layers or DEFAULT_LAYERS_PER_STAGE * pp
    n = np.full(pp, L // pp, dtype=float)
    n[: L % pp] += 1
    per_layer = np.median(comp / n[:, None], axis=0)  # (fwd, bwd) of one layer, from the typical stages
    extra = np.maximum(0.0, comp - n[:, None] * per_layer[None, :])
    scale = per_layer[0] if per_layer[0] > 0 else 1.0

    def c(f, b):
        return {"F": round(float(f / scale), 4), "B": round(float(b / 2 / scale), 4),
                "W": round(float(b / 2 / scale), 4)}

    costs = {"layers": dict(count=int(L), **c(*per_layer)), "embedding": c(*extra[0]), "head": c(*extra[-1])}
    cmd = (f"pipeloom partition --layer-costs {costs_path} --pp {pp}" + (f" --vpp {vpp}" if vpp > 1 else "")
           + " --balance")
    if layers is None:
        cmd += f"  (assumes {L} layers; pass --layers)"
    return cmd, costs


def write_layer_costs(path: str, costs: dict) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(costs, fh, indent=1)
    return path
