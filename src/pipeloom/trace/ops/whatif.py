"""What-if straggler analysis of an op trace: dependency model, vectorised replay, slowdown metrics (no torch).

Follows Lin et al., "Understanding Stragglers in Large Model Training Using What-if Analysis" (OSDI 2025).

The dependency model is :mod:`.opmodel` and its replay :mod:`.replay` (lanes, P2P pairs, no-op records, collectives,
clock alignment); this module runs the what-if scenarios on it.

Scenarios and metrics (times are mean step times over the analysed steps):

* ``T_meas``: measured; ``T_base``: the replay of the measured durations without launch gaps (the paper's "no
  delay"): its distance to ``T_meas`` is the *replay accuracy* (``replay.error``; beyond 5% the what-if figures
  are flagged unreliable, with the dependency kind whose unexplained waits or contradictions disagree most);
  ``T_replay``: the replay with the measured launch gaps too (``replay_error``: about 0 when no dependency
  contradicts the recorded times);
* ``T_ideal``: every op's duration replaced by the typical duration of its optype in its step (median
  over workers of each worker's median);
* Eq. (1) ``S = T_base / T_ideal``; per step ``S_k`` likewise;
* Eq. (2) ``S_t = T(ideal, ops of type t restored to measured) / T_ideal``; the same restore per stage,
  per dp rank and per worker gives ``S_stage``, ``S_dp`` and ``S_w``;
* Eq. (4) the per-worker slowdown: ``S_w`` replayed exactly for the candidate workers (the top ones by
  the bound ``min(S_dp, S_stage)``, which the paper uses as the worker score) and that bound elsewhere;
* Eq. (5) ``M_W``: the share of the slowdown removed by fixing (typical durations) the top 3% workers
  by ``S_w`` in the measured trace: ``(T_base - T_fix) / (T_base - T_ideal)``; ``M_S``: the same with
  the last stage fixed (stage partitioning imbalance: the loss head lengthens the last stage).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .arrays import group_median
from .opmodel import (COMPUTE_OPS, DP_COLLECTIVES, GLOBAL_COLLECTIVES, KIND_NAMES, KNOWN_OPS,  # noqa: F401
                      PP_EDGE_COLLECTIVES, SEND_OF_RECV, WEIGHT_GRAD_OP, WhatIfError, build_model)
from .replay import Model, replay, replay_times

TOP_WORKER_SHARE = 0.03
"""the paper's 3%: M_W fixes the top ceil(3% of workers) by S_w"""
REPLAY_TOLERANCE = 0.05
"""a replay of the measured durations further than this from the measured step makes the what-if figures unreliable"""


# ---------------------------------------------------------------------------------------- analysis
@dataclass
class WhatIf:
    """Every number of the analysis (times in the trace's unit; per-step arrays follow ``steps``)."""

    steps: list[int]
    dp: int
    pp: int
    optypes: list[str]
    t_measured: np.ndarray
    t_replay: np.ndarray
    t_base: np.ndarray
    t_ideal: np.ndarray
    slowdown: float
    step_slowdown: np.ndarray
    by_optype: dict
    by_optype_step: dict
    by_stage: np.ndarray
    by_stage_step: np.ndarray
    by_dp: np.ndarray
    by_dp_step: np.ndarray
    worker_bound: np.ndarray
    worker_bound_step: np.ndarray
    """(W, K) min(S_dp, S_stage) per step (the paper's per-worker score)"""
    worker_exact: dict
    """worker -> (S_w, per-step S_w) replayed exactly"""
    mw: float
    mw_workers: list[int]
    ms: float
    t_fix_workers: float
    t_fix_last_stage: float
    mw_step: np.ndarray
    """per step M_W (NaN where the step has no slowdown to explain)"""
    ms_step: np.ndarray
    compute_ratio: np.ndarray
    """(W, K) the worker's measured compute time / typical compute time"""
    optype_ratio: dict
    """optype -> (W, K) measured / typical time of the worker's ops of that type"""
    replay_error: float
    replay_error_max_step: float
    launch_slowdown: float
    scenarios: int = 0
    replay: dict = field(default_factory=dict)
    """replay accuracy: the measured durations replayed without launch gaps vs the measured step (``error``,
    ``error_max_step``, ``per_step``), ``reliable`` (error <= :data:`REPLAY_TOLERANCE`), per dependency kind its
    edges, contradictions, launch gaps and the share of the gap to the measured step they explain, and the kind
    that ``disagrees_most``"""

    @property
    def W(self) -> int:
        return self.dp * self.pp

    def worker_slowdown(self, w: int) -> float:
        return self.worker_exact[w][0] if w in self.worker_exact else float(self.worker_bound[w])

    def worker_slowdown_step(self) -> np.ndarray:
        m = self.worker_bound_step.copy()
        for w, (_, per) in self.worker_exact.items():
            m[w] = per
        return m


class _Batch:
    """Scenarios replayed together, a column each: (name, base 'ideal'|'base', mask function)."""

    def __init__(self, model: Model, width: int):
        self.model, self.width = model, width
        self.items: list[tuple] = []
        self.out: dict = {}

    def add(self, name, base: str, mask) -> None:
        self.items.append((name, base, mask))

    def run(self, progress=None) -> dict:
        m = self.model
        for i in range(0, len(self.items), self.width):
            chunk = self.items[i: i + self.width]
            D = np.empty((m.n, len(chunk)))
            for j, (_, base, mask) in enumerate(chunk):
                msk = mask() if callable(mask) else mask
                if base == "ideal":
                    D[:, j] = np.where(msk, m.dm, m.dt)
                else:
                    D[:, j] = np.where(msk, m.dt, m.dm)
            T = replay(m, D)
            for j, (name, _, _) in enumerate(chunk):
                self.out[name] = T[:, j]
            if progress is not None:
                progress(len(chunk))
        self.items = []
        return self.out


def analyse(model: Model, *, threshold: float = 0.05, progress=None, max_exact: int = 32) -> WhatIf:
    """Run the what-if scenarios on ``model`` (see the module docstring for the definitions)."""
    m = model
    K, W = len(m.steps), m.W
    width = int(max(1, min(32, 8_000_000 // max(m.n, 1))))
    ts = replay(m, m.dm[:, None], gaps=True)[:, 0]
    if progress is not None:
        progress(1)
    b = _Batch(m, width)
    b.add("base", "base", np.zeros(m.n, dtype=bool))
    b.add("ideal", "ideal", np.zeros(m.n, dtype=bool))
    present = np.unique(m.op)
    for c in present.tolist():
        b.add(("op", c), "ideal", lambda c=c: m.op == c)
    for s in range(m.pp):
        b.add(("stage", s), "ideal", lambda s=s: m.stage == s)
    for d in range(m.dp):
        b.add(("dp", d), "ideal", lambda d=d: m.dpr == d)
    out = b.run(progress)
    tb, ti = out["base"], out["ideal"]
    if not (np.isfinite(tb).all() and np.isfinite(ti).all() and ti.mean() > 0 and m.measured.mean() > 0):
        raise WhatIfError("the steps of the trace take no time (or no finite time) when replayed: nothing to "
                          "compare a slowdown with; no verdict")
    S = float(tb.mean() / ti.mean())
    by_op = {m.optypes[c]: float(out[("op", c)].mean() / ti.mean()) for c in present.tolist()}
    by_op_step = {m.optypes[c]: out[("op", c)] / ti for c in present.tolist()}
    st = np.array([out[("stage", s)].mean() / ti.mean() for s in range(m.pp)])
    st_k = np.array([out[("stage", s)] / ti for s in range(m.pp)])
    dpv = np.array([out[("dp", d)].mean() / ti.mean() for d in range(m.dp)])
    dp_k = np.array([out[("dp", d)] / ti for d in range(m.dp)])
    wd, ws = np.arange(W) // m.pp, np.arange(W) % m.pp
    bound = np.minimum(dpv[wd], st[ws])
    bound_k = np.minimum(dp_k[wd], st_k[ws])
    # exact S_w for the candidates: the top 3% by the bound, and every worker whose bound passes half the threshold
    ntop = max(1, math.ceil(TOP_WORKER_SHARE * W))
    order = np.argsort(-bound, kind="stable")
    cand = [int(w) for w in order[:max_exact] if bound[w] >= 1 + threshold / 2]
    for w in order[:ntop].tolist():
        if w not in cand:
            cand.append(int(w))
    for w in cand:
        b.add(("w", w), "ideal", lambda w=w: m.worker == w)
    out = b.run(progress)
    exact = {w: (float(out[("w", w)].mean() / ti.mean()), out[("w", w)] / ti) for w in cand}
    top = sorted(exact, key=lambda w: -exact[w][0])[:ntop]
    b.add("fixw", "base", lambda: np.isin(m.worker, top))
    b.add("fixlast", "base", lambda: m.stage == m.pp - 1)
    out = b.run(progress)
    gap_all = tb.mean() - ti.mean()
    gk = tb - ti
    ok = gk > 1e-9 * np.maximum(ti, 1e-12)
    with np.errstate(invalid="ignore", divide="ignore"):
        mw_k = np.where(ok, (tb - out["fixw"]) / np.where(ok, gk, 1), np.nan)
        ms_k = np.where(ok, (tb - out["fixlast"]) / np.where(ok, gk, 1), np.nan)
    mw = float((tb.mean() - out["fixw"].mean()) / gap_all) if gap_all > 0 else 0.0
    ms = float((tb.mean() - out["fixlast"].mean()) / gap_all) if gap_all > 0 else 0.0
    # own slowness: measured / typical time per worker and step (compute; each optype)
    key = m.worker * K + m.k
    ratios = {}
    for c in present.tolist():
        sel = m.op == c
        num = np.bincount(key[sel], weights=m.dm[sel], minlength=W * K)
        den = np.bincount(key[sel], weights=m.dt[sel], minlength=W * K)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratios[m.optypes[c]] = np.where(den > 0, num / np.where(den > 0, den, 1), np.nan).reshape(W, K)
    comp = np.isin(m.op, [m.optypes.index(x) for x in COMPUTE_OPS if x in m.optypes])
    num = np.bincount(key[comp], weights=m.dm[comp], minlength=W * K)
    den = np.bincount(key[comp], weights=m.dt[comp], minlength=W * K)
    with np.errstate(invalid="ignore", divide="ignore"):
        cr = np.where(den > 0, num / np.where(den > 0, den, 1), np.nan).reshape(W, K)
    err = np.abs(ts - m.measured) / m.measured
    acc = replay_accuracy(m, ts, tb)
    return WhatIf(steps=[int(s) for s in m.steps], dp=m.dp, pp=m.pp, optypes=m.optypes, t_measured=m.measured,
                  t_replay=ts, t_base=tb, t_ideal=ti, slowdown=S, step_slowdown=tb / ti, by_optype=by_op,
                  by_optype_step=by_op_step, by_stage=st, by_stage_step=st_k, by_dp=dpv, by_dp_step=dp_k,
                  worker_bound=bound, worker_bound_step=bound_k, worker_exact=exact, mw=mw, mw_workers=top, ms=ms,
                  t_fix_workers=float(out["fixw"].mean()), t_fix_last_stage=float(out["fixlast"].mean()),
                  mw_step=mw_k, ms_step=ms_k,
                  compute_ratio=cr, optype_ratio=ratios,
                  replay_error=float(abs(ts.mean() - m.measured.mean()) / m.measured.mean()),
                  replay_error_max_step=float(err.max()), launch_slowdown=float(ts.mean() / tb.mean()),
                  scenarios=3 + len(present) + m.pp + m.dp + len(cand) + 2 + acc.pop("scenarios"), replay=acc)


def replay_accuracy(m: Model, t_gaps: np.ndarray, t_base: np.ndarray, tolerance: float = REPLAY_TOLERANCE) -> dict:
    """How far the replay of the measured durations (no launch gaps: ``t_base``) is from the measured steps, and
    which dependency kind disagrees most: the kind whose launch gaps (waits the model does not explain), replayed
    alone, close most of the distance, or, when the replay is longer than measured, the kind with the most
    dependencies that ended after their dependant had started."""
    meas = m.measured
    mm = float(meas.mean())
    err = abs(float(t_base.mean()) - mm) / mm if mm > 0 else float("inf")
    per = np.where(meas > 0, np.abs(t_base - meas) / np.where(meas > 0, meas, 1), np.inf)
    deps = {name: dict(v) for name, v in m.dependencies.items()}
    kinds = [kd for kd in np.unique(m.bind[m.gap > 0]).tolist()]
    short = mm - float(t_base.mean())
    runs = 0
    if kinds and short > 0:
        D = np.repeat(m.dm[:, None], len(kinds), axis=1)
        G = np.zeros((m.n, len(kinds)))
        for j, kd in enumerate(kinds):
            G[:, j] = np.where(m.bind == kd, m.gap, 0.0)
        T = replay(m, D, gaps=G)
        runs = len(kinds)
        for j, kd in enumerate(kinds):
            deps.setdefault(KIND_NAMES[kd], {"edges": 0, "contradicted": 0, "launch_gap": 0.0})
            deps[KIND_NAMES[kd]]["explains"] = float((T[:, j].mean() - t_base.mean()) / short)
    worst = None
    if err > 0:
        if short > 0:
            cand = [(v.get("explains", 0.0), name) for name, v in deps.items() if v.get("explains", 0.0) > 0]
        else:
            cand = [(v["contradicted"], name) for name, v in deps.items() if v["contradicted"] > 0]
        worst = max(cand)[1] if cand else None
    return {"error": err, "error_max_step": float(per.max()) if per.size else 0.0,
            "with_launch_gaps_error": abs(float(t_gaps.mean()) - mm) / mm if mm > 0 else float("inf"),
            "tolerance": tolerance, "reliable": bool(err <= tolerance), "replay_shorter": bool(short > 0),
            "per_step": per, "dependencies": deps, "disagrees_most": worst, "scenarios": runs}


def scenario_count(model: Model) -> int:
    """Scenarios of the first two passes (for a progress bar; the candidate pass adds a few)."""
    return 3 + len(np.unique(model.op)) + model.pp + model.dp
