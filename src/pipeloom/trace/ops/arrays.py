"""Vectorised group helpers over numpy columns for the op-trace model (no torch).

Keys and lexicographic orders over several integer columns, per-group counts and reductions, matching
rows of one table in another, the last/first row of a group before/after a time, Kahn levels of a graph,
and the worker-order segments of a lane: the array building blocks :mod:`.opmodel` writes its rules with.
"""
from __future__ import annotations

import numpy as np

def _densify(a: np.ndarray) -> np.ndarray:
    return np.unique(a, return_inverse=True)[1].astype(np.int64).reshape(-1)


def _key(keys: list[np.ndarray]) -> np.ndarray:
    """One int64 per row, ordered like the tuple of the integer columns ``keys`` (any values: a column or the
    running key is replaced by its ranks where the product of the value ranges would overflow)."""
    n = keys[0].shape[0]
    key = np.zeros(n, dtype=np.int64)
    if not n:
        return key
    total = 1
    for c in keys:
        c = np.asarray(c).astype(np.int64, copy=False)
        lo, hi = int(c.min()), int(c.max())
        span = hi - lo + 1
        if span >= 1 << 31:
            c, lo, span = _densify(c), 0, 0
            span = int(c.max()) + 1
        if total * span >= 1 << 62:
            key = _densify(key)
            total = int(key.max()) + 1
        key = key * span + (c - lo)
        total *= span
    return key


def _lex(keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, new-group flags in sorted order, dense group id per element) for integer keys (primary first)."""
    key = _key(keys)
    order = np.argsort(key, kind="stable")
    sk = key[order]
    new = np.ones(len(key), dtype=bool)
    new[1:] = sk[1:] != sk[:-1]
    gid = np.empty(len(key), dtype=np.int64)
    gid[order] = np.cumsum(new) - 1
    return order, new, gid


def _cumcount(keys: list[np.ndarray], tiebreak: np.ndarray) -> np.ndarray:
    """Rank of each element within its group of ``keys``, ordered by ``tiebreak``."""
    key = _key(keys)
    o1 = np.argsort(tiebreak, kind="stable")
    order = o1[np.argsort(key[o1], kind="stable")]
    sk = key[order]
    n = len(key)
    new = np.ones(n, dtype=bool)
    new[1:] = sk[1:] != sk[:-1]
    starts = np.flatnonzero(new)
    g = np.cumsum(new) - 1
    out = np.empty(n, dtype=np.int64)
    out[order] = np.arange(n) - starts[g]
    return out


def _group_reduce(ufunc, gid: np.ndarray, values: np.ndarray, ngroups: int, fill: float) -> np.ndarray:
    """``ufunc`` (np.maximum / np.minimum) of ``values`` per group id, by a sort and reduceat (not ufunc.at)."""
    order = np.argsort(gid, kind="stable")
    sg = gid[order]
    out = np.full(ngroups, fill, dtype=np.float64 if values.dtype.kind == "f" else np.int64)
    if not len(sg):
        return out
    b = np.flatnonzero(np.r_[True, sg[1:] != sg[:-1]])
    out[sg[b]] = ufunc.reduceat(values[order], b)
    return out


def group_median(gid: np.ndarray, values: np.ndarray, ngroups: int) -> np.ndarray:
    """Median of ``values`` per group id (NaN for empty groups)."""
    o1 = np.argsort(values, kind="stable")
    order = o1[np.argsort(gid[o1], kind="stable")]
    sg, sv = gid[order], values[order]
    counts = np.bincount(sg, minlength=ngroups)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    out = np.full(ngroups, np.nan)
    has = counts > 0
    lo = starts[has] + (counts[has] - 1) // 2
    hi = starts[has] + counts[has] // 2
    out[has] = 0.5 * (sv[lo] + sv[hi])
    return out


def _match(keys_a: list[np.ndarray], keys_q: list[np.ndarray], valid_q: np.ndarray | None = None) -> np.ndarray:
    """For every query row the index of a row of ``a`` with the same key tuple (the first), -1 where none."""
    na = len(keys_a[0])
    nq = len(keys_q[0])
    if not na or not nq:
        return np.full(nq, -1, dtype=np.int64)
    key = _key([np.concatenate([a, q]) for a, q in zip(keys_a, keys_q)])
    ka, kq = key[:na], key[na:]
    order = np.argsort(ka, kind="stable")
    sk = ka[order]
    pos = np.minimum(np.searchsorted(sk, kq), na - 1)
    hit = sk[pos] == kq
    if valid_q is not None:
        hit &= valid_q
    return np.where(hit, order[pos], -1)


def _last_before(ga: np.ndarray, ta: np.ndarray, gq: np.ndarray, tq: np.ndarray) -> np.ndarray:
    """For every query (group gq, time tq) the index of the candidate of the same group with the largest time
    ``ta < tq``; -1 where none."""
    na, nq = len(ga), len(gq)
    if not na or not nq:
        return np.full(nq, -1, dtype=np.int64)
    g = np.concatenate([ga, gq])
    t = np.concatenate([ta, tq])
    typ = np.r_[np.ones(na, dtype=np.int8), np.zeros(nq, dtype=np.int8)]  # at equal times the query first
    order = np.lexsort((typ, t, g))
    is_cand = order < na
    marker = np.where(is_cand, np.arange(len(order)), -1)
    last = np.maximum.accumulate(marker)
    qpos = np.flatnonzero(~is_cand)
    lp = last[qpos]
    cand = np.where(lp >= 0, order[np.maximum(lp, 0)], -1)
    same = (cand >= 0) & (g[np.maximum(cand, 0)] == g[order[qpos]])
    out = np.full(nq, -1, dtype=np.int64)
    out[order[qpos] - na] = np.where(same, cand, -1)
    return out


def _take(arr: np.ndarray, j: np.ndarray) -> np.ndarray:
    """``arr[j]`` where ``j >= 0``, -1 elsewhere (also when ``arr`` is empty)."""
    if not len(arr):
        return np.full(len(j), -1, dtype=np.int64)
    return np.where(j >= 0, arr[np.maximum(j, 0)], -1)


def _first_after(ga: np.ndarray, ta: np.ndarray, gq: np.ndarray, tq: np.ndarray) -> np.ndarray:
    """The candidate of the same group with the smallest time ``ta > tq``; -1 where none."""
    return _last_before(ga, -ta, gq, -tq)


def _kahn(U: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray | None:
    """Longest-path level of every unit (vectorised Kahn); None when the graph has a cycle."""
    indeg = np.bincount(dst, minlength=U).astype(np.int64)
    order = np.argsort(src, kind="stable")
    s_dst = dst[order]
    cnt = np.bincount(src, minlength=U)
    off = np.concatenate(([0], np.cumsum(cnt)))
    level = np.full(U, -1, dtype=np.int64)
    front = np.flatnonzero(indeg == 0)
    L = 0
    done = 0
    while front.size:
        level[front] = L
        done += front.size
        c = cnt[front]
        tot = int(c.sum())
        if tot:
            starts = np.repeat(off[front], c)
            within = np.arange(tot) - np.repeat(np.cumsum(c) - c, c)
            succ = s_dst[starts + within]
            u, uc = np.unique(succ, return_counts=True)
            indeg[u] -= uc
            front = u[indeg[u] == 0]
        else:
            front = front[:0]
        L += 1
    return level if done == U else None


def _segment_edges(g: np.ndarray, s: np.ndarray, e: np.ndarray, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """Worker-order edges of the main lane (ops sorted by group, start; times relative to the step): consecutive
    ops that overlap form a segment; every op of a segment depends on every op of the previous segment of its
    group. Returns (source, dependant) index arrays."""
    n = len(g)
    first = np.r_[True, g[1:] != g[:-1]]
    gi = np.cumsum(first) - 1
    big = float(max(np.abs(e).max(), np.abs(s).max())) * 2 + 1.0 if n else 1.0
    runmax = np.maximum.accumulate(e + gi * big) - gi * big  # the latest end so far within the group
    new = first.copy()
    new[1:] |= s[1:] >= runmax[:-1] - tol
    seg = np.cumsum(new) - 1
    seg_start = np.flatnonzero(new)
    seg_size = np.diff(np.r_[seg_start, n])
    has_prev = ~first[seg_start]  # the segment has a previous one in its group
    cnt = np.where(has_prev[seg], seg_size[np.maximum(seg - 1, 0)], 0)
    tot = int(cnt.sum())
    dst = np.repeat(np.arange(n), cnt)
    base = np.repeat(seg_start[np.maximum(seg - 1, 0)], cnt)
    within = np.arange(tot) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    return base + within, dst
