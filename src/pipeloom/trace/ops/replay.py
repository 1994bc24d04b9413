"""The op-trace model's arrays in replay order, and its vectorised replay (no torch).

:func:`~pipeloom.trace.ops.opmodel.build_model` fills a :class:`Model`: every analysed op at its position in
replay (level) order, its incoming edges in CSR form, and the :class:`Level` blocks whose ops only depend on
earlier levels. :func:`replay` then times any number of duration scenarios at once, one numpy reduction per
level; :func:`replay_times` gives one scenario's per-op start and end for the pictures.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Level:
    """One level of the replay: ops ``a:b`` (positions), their incoming edges ``ea:eb`` (sorted by dependant)."""

    a: int
    b: int
    ea: int
    eb: int
    has: np.ndarray | None
    """positions (relative to a) of the ops with incoming edges; None = all of them"""
    seg: np.ndarray
    """offsets (relative to ea) of each such op's first edge"""
    urel: np.ndarray | None
    """unit starts relative to a, or None when every op of the level is its own unit"""
    uidx: np.ndarray | None


@dataclass
class Model:
    """The dependency graph of the analysed steps, arrays in replay (level) order."""

    optypes: list[str]
    steps: np.ndarray
    """step numbers, index k = position"""
    dp: int
    pp: int
    n: int
    worker: np.ndarray
    stage: np.ndarray
    dpr: np.ndarray
    k: np.ndarray
    op: np.ndarray
    mb: np.ndarray
    gmc: np.ndarray
    e_src: np.ndarray
    """source position of every edge, edges sorted by their dependant's position (CSR with ``e_ptr``)"""
    e_ptr: np.ndarray
    e_kind: np.ndarray
    gap: np.ndarray
    """measured launch gap: start - when its dependencies (and unit) let it start, >= 0"""
    bind: np.ndarray
    """kind of the dependency that ended last before the op (its launch gap is counted there)"""
    dm: np.ndarray
    """measured duration (transfer time for members of P2P pairs and collectives)"""
    dt: np.ndarray
    """typical duration of the op's optype in its step"""
    levels: list
    step_perm: np.ndarray
    step_bounds: np.ndarray
    measured: np.ndarray
    """measured step time per step"""
    rel_start: np.ndarray
    rel_end: np.ndarray
    warnings: list[str] = field(default_factory=list)
    merged_tp_rows: int = 0
    pipeline_edges: int = 0
    p2p_pairs: int = 0
    collectives: int = 0
    together: tuple | None = None
    """(positions, reduceat starts, unit of each) of the units whose members end together (run-log pairs)"""
    placement: dict = field(default_factory=dict)
    """what each row became: lanes, no-op records, unpaired sends/recvs, lone collective members, opaque ops"""
    dependencies: dict = field(default_factory=dict)
    """per dependency kind: edges, contradicted (the dependency ended after the dependant started), launch gap"""
    clock: dict = field(default_factory=dict)
    """clock alignment from the collectives: workers shifted, largest offset"""
    tol: float = 0.0

    @property
    def W(self) -> int:
        return self.dp * self.pp


def _together(model: Model, D: np.ndarray) -> np.ndarray:
    """Members of a run-log pair take the longer of their durations (they end together)."""
    if model.together is None:
        return D
    pos, starts, of = model.together
    D = D.copy()
    D[pos] = np.maximum.reduceat(D[pos], starts, axis=0)[of]
    return D


def replay(model: Model, D: np.ndarray, *, gaps=False) -> np.ndarray:
    """Step times (steps x scenarios) of the model replayed with durations ``D`` (ops x scenarios, replay order);
    ``gaps``: True replays the measured launch gaps, an (ops x scenarios) array its own per scenario."""
    n = model.n
    B = D.shape[1]
    D = _together(model, D)
    end = np.zeros((n + 1, B))
    if gaps is True:
        G = model.gap[:, None]
    elif gaps is False or gaps is None:
        G = None
    else:
        G = gaps
    src = model.e_src
    for lv in model.levels:
        a, b = lv.a, lv.b
        if lv.eb > lv.ea:
            r = np.maximum.reduceat(end[src[lv.ea:lv.eb]], lv.seg, axis=0)
            if lv.has is None:
                st = r
            else:
                st = np.zeros((b - a, B))
                st[lv.has] = r
        else:
            st = np.zeros((b - a, B))
        if G is not None:
            st = st + G[a:b]
        if lv.urel is not None:
            st = np.maximum.reduceat(st, lv.urel, axis=0)[lv.uidx]
        end[a:b] = st + D[a:b]
    return np.maximum.reduceat(end[:n][model.step_perm], model.step_bounds, axis=0)


def replay_times(model: Model, D: np.ndarray, *, gaps: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per-op (start, end) of one scenario (vector ``D``), for the timeline pictures."""
    n = model.n
    Dm = _together(model, D[:, None])
    end = np.zeros((n + 1, 1))
    start = np.zeros((n, 1))
    src = model.e_src
    for lv in model.levels:
        a, b = lv.a, lv.b
        st = np.zeros((b - a, 1))
        if lv.eb > lv.ea:
            r = np.maximum.reduceat(end[src[lv.ea:lv.eb]], lv.seg, axis=0)
            if lv.has is None:
                st = r
            else:
                st[lv.has] = r
        if gaps:
            st = st + model.gap[a:b, None]
        if lv.urel is not None:
            st = np.maximum.reduceat(st, lv.urel, axis=0)[lv.uidx]
        start[a:b] = st
        end[a:b] = st + Dm[a:b]
    return start[:, 0], end[:n, 0]
