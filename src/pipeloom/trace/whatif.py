"""What-if straggler analysis of an op trace: dependency model, vectorised replay, slowdown metrics (no torch).

Follows Lin et al., "Understanding Stragglers in Large Model Training Using What-if Analysis" (OSDI 2025).

Dependency model (per step; steps are replayed independently, each from its first op at t = 0):

* a worker is one (dp_rank, stage); the TP ranks of a worker are one worker (rows of several TP ranks
  are merged per (worker, step, optype, seq): latest start, latest end);
* within a worker, the recorded order (start time): an op starts after the previous one ends, plus the
  measured launch gap (idle time not explained by any dependency);
* pipeline: forward-compute of (microbatch, global chunk g) after forward-compute of (mb, g - 1);
  backward-compute of (mb, g) after backward-compute of (mb, g + 1) (chunks for VPP, so stage pp-1 chunk
  k feeds stage 0 chunk k+1); with P2P ops recorded, the n-th forward-recv of stage s pairs with the n-th
  forward-send of stage (s - 1) mod pp (backward: (s + 1) mod pp) of the same dp rank and step; a send is
  non-blocking, a recv starts when it is posted and its send has ended and then takes its transfer time;
* collectives synchronise their members: grads-reduce-scatter, params-all-gather and
  separate-grads-all-reduce over the dp ranks of a stage, embedding-grads-all-reduce over the first and
  last stage of a dp rank, optimizer-clip-main-grad over all workers (the grad-norm all-reduce); a
  collective starts when its last member arrives and ends for all members after its transfer time
  (the measured transfer = member end - last member arrival). Ops with one ``pair`` id (an overlapped
  pair of one worker, e.g. DualPipe's F & B, only from run logs) are one unit the same way: they start
  when both are ready and end together, after the longer of the two; their typical duration is taken over
  paired ops only (their measured time is the pair's). Other optypes (compute, optimizer,
  layernorm-grads-all-reduce inside the TP group, backward-weight-compute, gc, unknown ones) are local to the
  worker.

Replay: the units (ops, and collectives as one unit) get levels by a vectorised Kahn topological sort;
each level is one numpy step over a batch of scenarios at once (a column per scenario).

Scenarios and metrics (times are mean step times over the analysed steps):

* ``T_meas``: measured; ``T_replay``: replay with measured durations and gaps (its gap to ``T_meas`` is the
  ``replay_error``); ``T_base``: measured durations without launch gaps (the paper's "no delay");
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

from .optrace import OpTrace

WEIGHT_GRAD_OP = "backward-weight-compute"
"""the weight-gradient half of a split backward (zero-bubble W): compute of its worker, no pipeline edge (nothing
on another stage waits for it)"""
COMPUTE_OPS = ("forward-compute", "backward-compute", WEIGHT_GRAD_OP)
SEND_OF_RECV = {"forward-recv": "forward-send", "backward-recv": "backward-send"}
DP_COLLECTIVES = ("grads-reduce-scatter", "params-all-gather", "separate-grads-all-reduce")
PP_EDGE_COLLECTIVES = ("embedding-grads-all-reduce",)
GLOBAL_COLLECTIVES = ("optimizer-clip-main-grad",)
KNOWN_OPS = COMPUTE_OPS + tuple(SEND_OF_RECV) + tuple(SEND_OF_RECV.values()) + DP_COLLECTIVES + \
    PP_EDGE_COLLECTIVES + GLOBAL_COLLECTIVES + ("layernorm-grads-all-reduce", "optimizer", "gc")
TOP_WORKER_SHARE = 0.03
"""the paper's 3%: M_W fixes the top ceil(3% of workers) by S_w"""


class WhatIfError(ValueError):
    pass


# ----------------------------------------------------------------------------------------- helpers
def _key(keys: list[np.ndarray]) -> np.ndarray:
    """One int64 per row, ordered like the tuple of the integer columns ``keys`` (values >= -1)."""
    key = np.zeros(keys[0].shape[0], dtype=np.int64)
    total = 1
    for c in keys:
        base = int(c.max()) + 2 if c.size else 1
        total *= base
        if total >= 2 ** 62:
            raise WhatIfError("trace too large to index (key overflow)")
        key = key * base + (c.astype(np.int64) + 1)
    return key


def _lex(keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, new-group flags in sorted order, group id per element) for integer keys (primary first)."""
    key = _key(keys)
    order = np.argsort(key, kind="stable")
    sk = key[order]
    new = np.ones(len(key), dtype=bool)
    new[1:] = sk[1:] != sk[:-1]
    gid_sorted = np.cumsum(new) - 1
    gid = np.empty(len(key), dtype=np.int64)
    gid[order] = gid_sorted
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


def _lookup(keys: np.ndarray, want: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Index of the element whose key == want (first if several), -1 where none or not ``valid``."""
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    pos = np.searchsorted(sk, want)
    pos = np.minimum(pos, max(len(sk) - 1, 0))
    hit = valid & (len(sk) > 0) & (sk[pos] == want) if len(sk) else np.zeros_like(valid)
    return np.where(hit, order[pos] if len(sk) else -1, -1)


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


# ------------------------------------------------------------------------------------------- model
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
    dpr: int | np.ndarray
    k: np.ndarray
    op: np.ndarray
    mb: np.ndarray
    gmc: np.ndarray
    prev: np.ndarray
    """position of the previous op of the worker (n = none)"""
    xdep: np.ndarray
    """position of the cross dependency (pipeline predecessor or the send of a recv; n = none)"""
    is_recv: np.ndarray
    gap: np.ndarray
    dm: np.ndarray
    """measured duration (transfer time for recv ops and collectives)"""
    dt: np.ndarray
    """typical duration of the op's optype in its step"""
    ustart: np.ndarray
    """first position of each unit (units are contiguous)"""
    unit_of: np.ndarray
    levels: list
    """(a, b, rel unit starts or None, rel unit index or None) per level"""
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
    coll_pos: np.ndarray | None = None
    coll_starts: np.ndarray | None = None
    coll_of: np.ndarray | None = None

    @property
    def W(self) -> int:
        return self.dp * self.pp


def build_model(tr: OpTrace, steps: list[int] | None = None) -> Model:
    """Rebuild every analysed step's dependency graph from the op table (see the module docstring)."""
    pp, dp = tr.sizes["pp_size"], tr.sizes["dp_size"]
    warnings: list[str] = []
    keep = np.ones(len(tr), dtype=bool) if steps is None else np.isin(tr.step, np.asarray(steps, dtype=np.int64))
    if not keep.any():
        have = tr.steps
        raise WhatIfError(f"none of the steps {steps} are in {tr.path} (it has steps {have[0]}..{have[-1]})")
    dpr, stage, step, op = tr.dp[keep], tr.stage[keep], tr.step[keep], tr.op[keep]
    start, dur, rank, seq = tr.start[keep], tr.dur[keep], tr.rank[keep], tr.seq[keep]
    mb, gmc, mc = tr.mb[keep], tr.gmc[keep], tr.mc[keep]
    pair = tr.pair[keep] if tr.pair is not None else np.full(len(mb), -1, dtype=np.int64)
    var = tr.variant[keep] if tr.variant is not None else np.zeros(len(mb), dtype=np.int64)
    end = start + dur
    worker = dpr * pp + stage
    # ---- TP ranks of one worker: one row per (worker, step, optype, n-th of that type)
    merged = 0
    if (rank >= 0).any():
        nth = _cumcount([rank, step, op], start)
        _, new, gid = _lex([worker, step, op, nth])
        ng = int(gid.max()) + 1
        if ng < len(gid):
            merged = len(gid) - ng
            first = _group_reduce(np.minimum, gid, np.arange(len(gid)), ng, len(gid))
            s_max = _group_reduce(np.maximum, gid, start, ng, -np.inf)
            e_max = _group_reduce(np.maximum, gid, end, ng, -np.inf)
            dpr, stage, step, op, worker = dpr[first], stage[first], step[first], op[first], worker[first]
            seq, mb, gmc, mc, pair, var = seq[first], mb[first], gmc[first], mc[first], pair[first], var[first]
            start, end = s_max, e_max
    n = len(start)
    steps_u = np.unique(step)
    k = np.searchsorted(steps_u, step)
    # ---- time order within (step, worker)
    o1 = np.lexsort((seq, start))
    torder = o1[np.argsort(_key([k, worker])[o1], kind="stable")]
    inv = np.empty(n, dtype=np.int64)
    inv[torder] = np.arange(n)
    dpr, stage, k, op, worker, mb, gmc, mc, pair, var = (a[torder] for a in (dpr, stage, k, op, worker, mb, gmc,
                                                                              mc, pair, var))
    start, end = start[torder], end[torder]
    same = np.zeros(n, dtype=bool)
    same[1:] = (k[1:] == k[:-1]) & (worker[1:] == worker[:-1])
    prev = np.where(same, np.arange(n) - 1, -1)
    nth = _cumcount([k, worker, op], np.arange(n))
    gmc = np.where((gmc < 0) & (mc >= 0), mc * pp + stage, gmc)
    names = tr.optypes
    code = {nm: i for i, nm in enumerate(names)}
    # ---- cross dependencies
    xdep = np.full(n, -1, dtype=np.int64)
    is_recv = np.zeros(n, dtype=bool)
    p2p = 0
    for rname, sname in SEND_OF_RECV.items():
        if rname not in code:
            continue
        rc = code[rname]
        rmask = op == rc
        is_recv |= rmask
        if sname not in code:
            continue
        peer = (stage - 1) % pp if rname == "forward-recv" else (stage + 1) % pp
        smask = op == code[sname]
        base = [int(k.max()) + 2, dp + 1, pp + 1, int(nth.max()) + 2]
        enc = lambda a, b, c, d: ((a * base[1] + b) * base[2] + c) * base[3] + d  # noqa: E731
        keys = np.where(smask, enc(k, dpr, stage, nth), -1)
        want = enc(k, dpr, peer, nth)
        hit = _lookup(keys, want, rmask)
        xdep = np.where(rmask & (hit >= 0), hit, xdep)
        p2p += int((rmask & (hit >= 0)).sum())
    pipe = 0
    for cname, delta in (("forward-compute", -1), ("backward-compute", +1)):
        if cname not in code:
            continue
        cmask = (op == code[cname]) & (mb >= 0) & (gmc >= 0)
        if not cmask.any():
            continue
        base = [int(k.max()) + 2, dp + 1, int(mb.max()) + 2, int(gmc.max()) + 3]
        enc = lambda a, b, c, d: ((a * base[1] + b) * base[2] + c) * base[3] + d  # noqa: E731
        keys = np.where(cmask, enc(k, dpr, mb, gmc + 1), -1)
        tgt = gmc + delta
        want = enc(k, dpr, mb, tgt + 1)
        hit = _lookup(keys, want, cmask & (tgt >= 0) & (xdep < 0))
        ok = hit >= 0
        xdep = np.where(ok, hit, xdep)
        pipe += int(ok.sum())
    # ---- measured times relative to the step's first start
    origin = _group_reduce(np.minimum, k, start, len(steps_u), np.inf)
    step_end = _group_reduce(np.maximum, k, end, len(steps_u), -np.inf)
    measured = step_end - origin
    rs, re = start - origin[k], end - origin[k]
    # a dependency that ended after its dependant ended is not one (pairing or clocks disagree): dropped
    tol = 1e-6 * max(float(np.median(measured)), 1e-9)
    bad = (xdep >= 0) & (re[np.maximum(xdep, 0)] > re + tol)
    if bad.any():
        warnings.append(f"{int(bad.sum())} cross-worker dependencies contradict the recorded times and were "
                        f"ignored (clock skew, or ops missing from the trace)")
        xdep = np.where(bad, -1, xdep)
    # ---- collectives
    gkey_tag = np.zeros(n, dtype=np.int64)
    ga = np.zeros(n, dtype=np.int64)
    for nm in DP_COLLECTIVES:
        if nm in code:
            m = op == code[nm]
            gkey_tag[m], ga[m] = 1, stage[m]
    for nm in PP_EDGE_COLLECTIVES:
        if nm in code:
            m = (op == code[nm]) & ((stage == 0) | (stage == pp - 1))
            gkey_tag[m], ga[m] = 2, dpr[m]
    for nm in GLOBAL_COLLECTIVES:
        if nm in code:
            m = op == code[nm]
            gkey_tag[m], ga[m] = 3, 0
    grouped = gkey_tag > 0
    uid = np.arange(n, dtype=np.int64)
    ncoll = 0
    if grouped.any():
        idx = np.flatnonzero(grouped)
        _, _, gid = _lex([gkey_tag[idx], k[idx], ga[idx], op[idx], nth[idx]])
        size = np.bincount(gid)
        multi = size[gid] > 1
        rep = _group_reduce(np.minimum, gid, idx, len(size), n)
        uid[idx[multi]] = rep[gid[multi]]
        ncoll = int((size > 1).sum())
    paired = (pair >= 0) & ~grouped
    if paired.any():  # ops that ran as one overlapped pair: one unit, they start and end together
        idx = np.flatnonzero(paired)
        _, _, gid = _lex([k[idx], worker[idx], pair[idx]])
        rep = _group_reduce(np.minimum, gid, idx, int(gid.max()) + 1, n)
        uid[idx] = rep[gid]
    # ---- measured effective durations and gaps
    pe = np.where(prev >= 0, re[np.maximum(prev, 0)], 0.0)
    xe = np.where(xdep >= 0, re[np.maximum(xdep, 0)], 0.0)
    gstart = _group_reduce(np.maximum, uid, rs, n, -np.inf)
    ingroup = np.bincount(uid, minlength=n)[uid] > 1
    dm = np.where(is_recv, np.maximum(0.0, re - np.maximum(rs, xe)),
                  np.where(ingroup, np.maximum(0.0, re - gstart[uid]), re - rs))
    gap = np.where(is_recv, np.maximum(0.0, rs - pe), np.maximum(0.0, rs - np.maximum(pe, xe)))
    # ---- typical durations: per (step, optype) the median over workers of each worker's median (ops of
    # overlapped pairs, whose measured time is the pair's, have their own typical: the paired ones'; so do
    # the variants of one optype a run log tells apart, e.g. B and BW jobs, both backward-compute)
    pk = paired.astype(np.int64) * (int(var.max()) + 1) + var
    _, _, g1 = _lex([k, op, pk, worker])
    n1 = int(g1.max()) + 1
    med1 = group_median(g1, dm, n1)
    first1 = _group_reduce(np.minimum, g1, np.arange(n), n1, n)
    _, _, g2 = _lex([k[first1], op[first1], pk[first1]])
    med2 = group_median(g2, med1, int(g2.max()) + 1)
    dt = med2[g2[g1]]  # g2: the (step, optype) group of each (step, optype, worker) group
    # ---- levels: Kahn over units
    _, unit_new, ucomp = _lex([uid])
    U = int(ucomp.max()) + 1
    src = np.concatenate([ucomp[prev[prev >= 0]], ucomp[xdep[xdep >= 0]]])
    dst = np.concatenate([ucomp[prev >= 0], ucomp[xdep >= 0]])
    keep_e = src != dst
    src, dst = src[keep_e], dst[keep_e]
    level = _kahn(U, src, dst)
    if level is None:
        warnings.append("the dependencies form a cycle (P2P pairs or collectives recorded in an inconsistent "
                        "order); cross-worker pipeline edges dropped")
        xdep[:] = -1
        src, dst = ucomp[prev[prev >= 0]], ucomp[prev >= 0]
        ke = src != dst
        level = _kahn(U, src[ke], dst[ke])
        if level is None:
            raise WhatIfError(f"{tr.path}: the collectives of the trace are recorded in an order no run could "
                              f"have (a dependency cycle); check dp_rank/stage/seq_id")
    # ---- replay order: by (level, unit, time order)
    lev_op = level[ucomp]
    order = np.lexsort((np.arange(n), ucomp, lev_op))
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)

    def remap(a: np.ndarray) -> np.ndarray:
        a = a[order]
        return np.where(a >= 0, pos[np.maximum(a, 0)], n)

    prev_o, xdep_o = remap(prev), remap(xdep)
    uc_o = ucomp[order]
    lev_o = lev_op[order]
    unew = np.ones(n, dtype=bool)
    unew[1:] = uc_o[1:] != uc_o[:-1]
    ustart = np.flatnonzero(unew)
    unit_of = np.cumsum(unew) - 1
    lb = np.flatnonzero(np.r_[True, lev_o[1:] != lev_o[:-1]])
    le = np.r_[lb[1:], n]
    levels = []
    for a, b in zip(lb.tolist(), le.tolist()):
        us = unit_of[a:b]
        if us[-1] - us[0] + 1 == b - a:
            levels.append((a, b, None, None))
        else:
            rel = ustart[us[0]: us[-1] + 1] - a
            levels.append((a, b, rel, us - us[0]))
    k_o = k[order]
    step_perm = np.argsort(k_o, kind="stable")
    step_bounds = np.flatnonzero(np.r_[True, k_o[step_perm][1:] != k_o[step_perm][:-1]])
    if merged:
        warnings.append(f"{merged} rows of further TP ranks merged into their (dp, stage) worker")
    return Model(optypes=list(names), steps=steps_u, dp=dp, pp=pp, n=n, worker=worker[order], stage=stage[order],
                 dpr=dpr[order], k=k_o, op=op[order], mb=mb[order], gmc=gmc[order], prev=prev_o, xdep=xdep_o,
                 is_recv=is_recv[order], gap=gap[order], dm=dm[order], dt=dt[order], ustart=ustart, unit_of=unit_of,
                 levels=levels, step_perm=step_perm, step_bounds=step_bounds, measured=measured,
                 rel_start=rs[order], rel_end=re[order], warnings=warnings, merged_tp_rows=merged,
                 pipeline_edges=pipe, p2p_pairs=p2p, collectives=ncoll)


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


# ------------------------------------------------------------------------------------------ replay
def _collective_durations(model: Model, D: np.ndarray) -> np.ndarray:
    """A collective takes the longest of its members' transfer times (members are contiguous in replay order)."""
    if model.coll_pos is None:
        sizes = np.diff(np.r_[model.ustart, model.n])
        multi = np.flatnonzero(sizes > 1)
        pos = np.concatenate([np.arange(model.ustart[u], model.ustart[u] + sizes[u]) for u in multi]) \
            if len(multi) else np.zeros(0, dtype=np.int64)
        starts = np.r_[0, np.cumsum(sizes[multi])[:-1]] if len(multi) else np.zeros(0, dtype=np.int64)
        model.coll_pos, model.coll_starts = pos, starts
        model.coll_of = np.repeat(np.arange(len(multi)), sizes[multi]) if len(multi) else pos
    if not len(model.coll_pos):
        return D
    D = D.copy()
    D[model.coll_pos] = np.maximum.reduceat(D[model.coll_pos], model.coll_starts, axis=0)[model.coll_of]
    return D


def replay(model: Model, D: np.ndarray, *, gaps: bool = False) -> np.ndarray:
    """Step times (steps x scenarios) of the model replayed with durations ``D`` (ops x scenarios, replay order)."""
    n = model.n
    B = D.shape[1]
    D = _collective_durations(model, D)
    end = np.zeros((n + 1, B))
    gap = model.gap[:, None] if gaps else None
    prev, xdep, rec = model.prev, model.xdep, model.is_recv
    for a, b, urel, uidx in model.levels:
        ep = end[prev[a:b]]
        ex = end[xdep[a:b]]
        r = rec[a:b]
        if gap is not None:
            g = gap[a:b]
            st = np.where(r[:, None], np.maximum(ep + g, ex), np.maximum(ep, ex) + g)
        else:
            st = np.maximum(ep, ex)
        if urel is not None:
            st = np.maximum.reduceat(st, urel, axis=0)[uidx]
        end[a:b] = st + D[a:b]
    return np.maximum.reduceat(end[:n][model.step_perm], model.step_bounds, axis=0)


def replay_times(model: Model, D: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-op (start, end) of one scenario (vector ``D``), for the timeline pictures."""
    n = model.n
    Dm = _collective_durations(model, D[:, None])
    end = np.zeros((n + 1, 1))
    start = np.zeros((n, 1))
    for a, b, urel, uidx in model.levels:
        st = np.maximum(end[model.prev[a:b]], end[model.xdep[a:b]])
        if urel is not None:
            st = np.maximum.reduceat(st, urel, axis=0)[uidx]
        start[a:b] = st
        end[a:b] = st + Dm[a:b]
    return start[:, 0], end[:n, 0]


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
    return WhatIf(steps=[int(s) for s in m.steps], dp=m.dp, pp=m.pp, optypes=m.optypes, t_measured=m.measured,
                  t_replay=ts, t_base=tb, t_ideal=ti, slowdown=S, step_slowdown=tb / ti, by_optype=by_op,
                  by_optype_step=by_op_step, by_stage=st, by_stage_step=st_k, by_dp=dpv, by_dp_step=dp_k,
                  worker_bound=bound, worker_bound_step=bound_k, worker_exact=exact, mw=mw, mw_workers=top, ms=ms,
                  t_fix_workers=float(out["fixw"].mean()), t_fix_last_stage=float(out["fixlast"].mean()),
                  mw_step=mw_k, ms_step=ms_k,
                  compute_ratio=cr, optype_ratio=ratios,
                  replay_error=float(abs(ts.mean() - m.measured.mean()) / m.measured.mean()),
                  replay_error_max_step=float(err.max()), launch_slowdown=float(ts.mean() / tb.mean()),
                  scenarios=3 + len(present) + m.pp + m.dp + len(cand) + 2)


def scenario_count(model: Model) -> int:
    """Scenarios of the first two passes (for a progress bar; the candidate pass adds a few)."""
    return 3 + len(np.unique(model.op)) + model.pp + model.dp
