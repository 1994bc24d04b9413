"""The dependency model of an op trace (no torch; its replay is :mod:`.replay`).

What a real trainer's trace holds (Megatron-style, the format of :mod:`.optrace`) and how each rule becomes
an edge of the graph (rules learnt from the published analyzer of Lin et al., OSDI 2025, and checked
against its real trace; the code is this project's own):

* **worker** = one (dp_rank, stage); rows of further TP ranks of a worker are merged into it (latest start,
  latest end per (worker, step, optype, n-th of that type)). Ranks may carry a sequence/context dimension
  (``world = dp * pp * tp * cp``, :mod:`.optrace`): its ranks are not separate workers either.
* **lanes**: a worker's compute ops (forward, backward, backward-weight) run one at a time on its compute
  stream. A communication or other op that overlaps one of its compute ops ran on another stream: it is
  *asynchronous*, and so is every op of an op type that overlaps compute in more than :data:`ASYNC_SHARE` of
  its ops. Every other op is on the worker's *main lane* with the compute, in recorded order: the
  trainer launched it there and waited for it (blocking P2P, a non-overlapped DP reduction). Ops of the main
  lane whose intervals overlap each other (a combined ``send_forward_recv_backward``: a forward-send and a
  backward-recv launched together) form one *segment*; every op of a segment starts after every op of the
  previous segment ended (edge kind ``worker order``).
* **asynchronous ops** start after the main-lane op that last ended before they started (``launch``: a send
  starts after the compute that produced it), follow the previous async op of their optype on the worker
  (``comm stream``), and are waited for by the op that needs them: an async forward/backward-recv by the
  first forward/backward compute that starts after it ended (``recv -> compute``), an async
  params-all-gather by the next forward compute (a chunk's first forward), an async gradient reduction
  (overlapped with the backward) by the next main-lane op that is not compute (the optimizer part of the
  step) (``dp collective -> compute``).
* **no-op P2P records** (a send/recv the profiler recorded but the trainer never launched): a recv that starts
  after the last compute of its direction started, a send that ends before the first one ended (the start
  and end of a step), and, where a worker records one P2P op per compute op (or one fewer recv), the op of the
  first/last chunk of the model (a forward-recv of global chunk 0, a forward-send of the last chunk, the
  reverse for the backward). They are kept, off the lanes, waited for by nothing, and counted.
* **P2P pairs**: the n-th (launched) forward-send of stage s pairs with the n-th forward-recv of stage
  (s + 1) mod pp of the same dp rank and step (backward: s - 1). Where sends block (no pair shows a send that
  ended before its recv was posted, beyond clock noise: :data:`EAGER_SHARE`) a pair is a rendezvous: it starts
  when both sides are posted and each side ends its own transfer time later (transfer = end - the later post);
  where they do not, the recv waits for its send (``send -> recv``) and then takes its transfer time.
  Unpaired sends/recvs are counted and stay the worker's own time.
* **pipeline edges** F(mb, g-1) -> F(mb, g) and B(mb, g+1) -> B(mb, g) over global chunks g (the same dp rank
  and step), for traces without P2P records and as a floor where they are recorded.
* **collectives** synchronise their members: grads-reduce-scatter, params-all-gather and
  separate-grads-all-reduce over the dp ranks of a stage, embedding-grads-all-reduce over the first and last
  stage of a dp rank, optimizer-clip-main-grad over all workers (the n-th of each); a collective starts when
  its last member arrives and each member ends its own transfer time later (as P2P pairs). Whether a DP
  reduction overlaps the backward or follows it is read from the trace (the lanes above).
* ops with one ``pair`` id (an overlapped pair of one worker in a run log) are one unit that starts when
  both are ready and ends after the longer of the two.
* **clocks**: a collective ends at about the same time for all its members, so each worker's clock offset is
  estimated from the collectives it takes part in (median deviation of its ends from the group's, refined
  three times); when an offset exceeds the timing tolerance the worker's times are shifted by it.
* other optypes (optimizer, gc, layernorm-grads-all-reduce inside the TP/SP group, unknown ones) are opaque
  ops of their worker, on the main lane unless they overlap its compute.

Replay: units (single ops, P2P pairs, collectives, pairs) get levels by a vectorised Kahn sort; each level is
one numpy step over a batch of scenarios (a column each): an op is ready when all its incoming edges' ops
ended (plus its launch gap when gaps are replayed), a unit starts when all its members are ready, each member
ends its duration later. Steps are replayed independently, each from t = 0.
"""
from __future__ import annotations

import numpy as np

from .arrays import (_cumcount, _first_after, _group_reduce, _kahn, _key, _last_before, _lex, _match,
                     _segment_edges, _take, group_median)
from .optrace import (COMPUTE_OPS, DP_COLLECTIVES, GLOBAL_COLLECTIVES, KNOWN_OPS, P2P_OPS,  # noqa: F401
                      PP_EDGE_COLLECTIVES, SEND_OF_RECV, WEIGHT_GRAD_OP, OpTrace)
from .replay import Level, Model

#: dependency kinds (edges) and the waits that are not edges (unit synchronisation, the step start)
ORDER, PIPELINE, RECV, LAUNCH, STREAM, DPCOLL, EAGER, P2P_SYNC, COLL_SYNC, START = range(10)
KIND_NAMES = ("worker order", "pipeline", "recv -> compute", "launch", "comm stream", "dp collective -> compute",
              "send -> recv", "p2p pair", "collective", "step start")
CROSS_KINDS = (PIPELINE, EAGER)
"""edge kinds between workers (their clocks may disagree): dropped when the source ended after the dependant"""
ASYNC_SHARE = 0.1
"""an op type whose ops overlap their worker's compute more often than this is asynchronous throughout"""
EAGER_SHARE = 0.01
"""a trace whose sends ended before their recv was posted in more pairs than this has non-blocking sends"""
CLOCK_TOL = 1e-5
"""timing tolerance, relative to the median step time (the trace's float precision and launch jitter)"""


class WhatIfError(ValueError):
    pass


def build_model(tr: OpTrace, steps: list[int] | None = None, *, align: bool = True) -> Model:
    """Rebuild every analysed step's dependency graph from the op table (see the module docstring); ``align``:
    estimate and remove the clock offsets of the workers from their collectives."""
    warnings: list[str] = []
    keep = np.ones(len(tr), dtype=bool) if steps is None else np.isin(tr.step, np.asarray(steps, dtype=np.int64))
    if not keep.any():
        have = tr.steps
        raise WhatIfError(f"none of the steps {steps} are in {tr.path} (it has steps {have[0]}..{have[-1]})")
    dpr, stage, step, op = tr.dp[keep], tr.stage[keep], tr.step[keep], tr.op[keep]
    # the analysed extent comes from the rows (a meta size beyond them would only add empty workers)
    pp = int(min(tr.sizes["pp_size"], int(stage.max()) + 1))
    dp = int(min(tr.sizes["dp_size"], int(dpr.max()) + 1))
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
        _, _, gid = _lex([worker, step, op, nth])
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
    steps_u, k = np.unique(step, return_inverse=True)
    k = k.astype(np.int64).reshape(-1)
    K = len(steps_u)
    W = dp * pp
    # ---- time order within (step, worker)
    o1 = np.lexsort((seq, start))
    torder = o1[np.argsort(_key([k, worker])[o1], kind="stable")]
    dpr, stage, k, op, worker, mb, gmc, mc, pair, var = (a[torder] for a in (dpr, stage, k, op, worker, mb, gmc,
                                                                              mc, pair, var))
    start, end = start[torder].astype(np.float64), end[torder].astype(np.float64)
    gw = k * W + worker  # (step, worker) group
    nth = _cumcount([k, worker, op], np.arange(n))
    gmc = np.where((gmc < 0) & (mc >= 0), mc * pp + stage, gmc)
    names = list(tr.optypes)
    code = {nm: i for i, nm in enumerate(names)}

    def is_op(*nms: str) -> np.ndarray:
        cs = [code[x] for x in nms if x in code]
        return np.isin(op, cs) if cs else np.zeros(n, dtype=bool)

    compute = is_op(*COMPUTE_OPS)
    fwd_c, bwd_c = is_op("forward-compute"), is_op("backward-compute")
    span0 = _group_reduce(np.maximum, k, end, K, -np.inf) - _group_reduce(np.minimum, k, start, K, np.inf)
    tol = max(CLOCK_TOL * float(np.median(span0)), 1e-12)
    # ---- collectives: (kind tag, group attribute) per op
    gtag = np.zeros(n, dtype=np.int64)
    ga = np.zeros(n, dtype=np.int64)
    m_ = is_op(*DP_COLLECTIVES)
    gtag[m_], ga[m_] = 1, stage[m_]
    m_ = is_op(*PP_EDGE_COLLECTIVES) & ((stage == 0) | (stage == pp - 1))
    gtag[m_], ga[m_] = 2, dpr[m_]
    m_ = is_op(*GLOBAL_COLLECTIVES)
    gtag[m_], ga[m_] = 3, 0
    grouped = gtag > 0
    cgid = np.full(n, -1, dtype=np.int64)
    csize = np.zeros(0, dtype=np.int64)
    if grouped.any():
        idx = np.flatnonzero(grouped)
        _, _, g = _lex([gtag[idx], k[idx], ga[idx], op[idx], nth[idx]])
        cgid[idx] = g
        csize = np.bincount(g)
    coll = grouped & (csize[np.maximum(cgid, 0)] > 1 if csize.size else False)
    # ---- clock alignment from the collectives
    clock = {"workers_shifted": 0, "max_offset": 0.0}
    if coll.any() and align:
        # each worker's offset from the widest collectives it takes part in (the global grad-norm all-reduce
        # relates every clock; a dp group on one machine relates none)
        pref = np.zeros(W, dtype=np.int64)
        for tag in (2, 1, 3):
            has = np.zeros(W, dtype=bool)
            has[worker[coll & (gtag == tag)]] = True
            pref[has] = tag
        idx = np.flatnonzero(coll & (gtag == pref[worker]))
        g = cgid[idx]
        off = np.zeros(W)
        for _ in range(3):
            e = end[idx] - off[worker[idx]]
            dev = e - group_median(g, e, int(g.max()) + 1)[g]
            off += np.nan_to_num(group_median(worker[idx], dev, W))
        off -= np.median(off[np.unique(worker[idx])])
        shift = np.abs(off) > 10 * tol
        if shift.any():
            start = start - np.where(shift[worker], off[worker], 0.0)
            end = end - np.where(shift[worker], off[worker], 0.0)
            clock = {"workers_shifted": int(shift.sum()), "max_offset": float(np.abs(off).max())}
            warnings.append(f"the clocks of {int(shift.sum())} worker(s) were aligned by their collectives (largest "
                            f"offset {float(np.abs(off).max()):.4g} {tr.time_unit})")
    # ---- lanes: an op that overlaps a compute op of its worker ran on another stream (asynchronous)
    cidx = np.flatnonzero(compute)
    q = np.flatnonzero(~compute)
    hit = _last_before(gw[cidx], start[cidx], gw[q], end[q] - tol)
    ov = np.zeros(n, dtype=bool)
    h = hit >= 0
    ov[q[h]] = end[cidx[hit[h]]] > start[q[h]] + tol
    asyn = ov & ~compute
    # ---- P2P: no-op records, pairing
    p2p = is_op(*P2P_OPS)
    noop = np.zeros(n, dtype=bool)
    G = max(int(tr.sizes.get("vpp_size", 1)) * pp, int(gmc.max()) + 1 if n else 1)
    ppeer = np.full(n, -1, dtype=np.int64)
    eager_s = np.zeros(0, dtype=np.int64)
    eager_r = np.zeros(0, dtype=np.int64)
    unpaired: dict[str, int] = {}
    one_sided: dict[str, int] = {}
    npairs = 0
    if p2p.any():
        for direction, cmask in (("forward", fwd_c), ("backward", bwd_c)):
            ci = np.flatnonzero(cmask)
            first_end = _group_reduce(np.minimum, gw[ci], end[ci], K * W, np.inf)
            last_start = _group_reduce(np.maximum, gw[ci], start[ci], K * W, -np.inf)
            crank = _cumcount([gw[ci]], start[ci])
            ccount = np.bincount(gw[ci], minlength=K * W)
            for kind in ("send", "recv"):
                nm = f"{direction}-{kind}"
                if nm not in code:
                    continue
                pm = op == code[nm]
                pi = np.flatnonzero(pm)
                if kind == "recv":
                    t1 = start[pi] > last_start[gw[pi]] + tol
                else:
                    t1 = end[pi] < first_end[gw[pi]] - tol
                noop[pi[t1]] = True
                vi = pi[~t1]
                if not len(vi) or not len(ci):
                    continue
                r = _cumcount([gw[vi]], start[vi])
                cnt = np.bincount(gw[vi], minlength=K * W)[gw[vi]]
                cc = ccount[gw[vi]]
                shift = np.where(cnt == cc, 0, np.where((kind == "recv") & (cnt == cc - 1), 1, -1))
                ok = shift >= 0
                j = _match([gw[ci], crank], [gw[vi], r + np.maximum(shift, 0)], ok)
                gm = np.where(j >= 0, gmc[np.maximum(_take(ci, j), 0)] if n else -1, -1)
                first_chunk, last_chunk = gm == 0, gm == G - 1
                t2 = (j >= 0) & (gm >= 0) & ((first_chunk if (direction == "forward") == (kind == "recv")
                                              else last_chunk))
                noop[vi[t2]] = True
        live = p2p & ~noop
        for rname, sname in SEND_OF_RECV.items():
            if rname not in code or sname not in code:  # the trace records one side only (a run log's sends)
                for nm in (rname, sname):
                    if nm in code and (live & (op == code[nm])).any():
                        one_sided[nm] = one_sided.get(nm, 0) + int((live & (op == code[nm])).sum())
                continue
            ri = np.flatnonzero(live & (op == code[rname]))
            si = np.flatnonzero(live & (op == code[sname]))
            rn = _cumcount([gw[ri]], start[ri])
            sn = _cumcount([gw[si]], start[si])
            peer = (stage[si] + 1) % pp if sname == "forward-send" else (stage[si] - 1) % pp
            j = _match([k[ri], dpr[ri], stage[ri], rn], [k[si], dpr[si], peer, sn])
            ok = j >= 0
            sp, rp = si[ok], ri[j[ok]]
            npairs += int(ok.sum())
            eager_s, eager_r = np.r_[eager_s, sp], np.r_[eager_r, rp]
            paired = np.zeros(n, dtype=bool)
            paired[sp] = paired[rp] = True
            for nm, ii in ((sname, si), (rname, ri)):
                lone = int((~paired[ii]).sum())
                if lone:
                    unpaired[nm] = unpaired.get(nm, 0) + lone
        # a send that ended before its recv was posted did not wait for it: where the trace shows that (beyond
        # clock noise), its sends do not block and every recv waits for its send; otherwise each pair is a
        # rendezvous (a send that still looks eager is replayed as one)
        eg = end[eager_s] <= start[eager_r] + tol
        blocking = bool(eg.mean() <= EAGER_SHARE) if eg.size else True
        rv = ~eg if blocking else np.zeros(eg.size, dtype=bool)
        ppeer[eager_s[rv]] = eager_r[rv]
        ppeer[eager_r[rv]] = eager_s[rv]
        eager_s, eager_r = eager_s[~rv], eager_r[~rv]
    # an op type that often overlaps compute runs on its own stream: all its ops are asynchronous (one that
    # happened to fall between two computes did not block either); no-op records do not count
    for c in np.unique(op[asyn & ~noop]).tolist():
        m_ = (op == c) & ~noop
        if ov[m_].mean() > ASYNC_SHARE:
            asyn |= m_
    asyn |= noop
    main = ~asyn
    # ---- edges
    esrc: list[np.ndarray] = []
    edst: list[np.ndarray] = []
    ekind: list[np.ndarray] = []

    def add(s: np.ndarray, d: np.ndarray, kind: int) -> None:
        ok = (s >= 0) & (d >= 0)
        if ok.any():
            esrc.append(s[ok])
            edst.append(d[ok])
            ekind.append(np.full(int(ok.sum()), kind, dtype=np.int8))

    # worker order: segments of the main lane (ops that overlap each other run together)
    mi = np.flatnonzero(main)
    if len(mi):
        org = _group_reduce(np.minimum, k, start, K, np.inf)[k[mi]]
        s_idx, d_idx = _segment_edges(gw[mi], start[mi] - org, end[mi] - org, tol)
        add(mi[s_idx], mi[d_idx], ORDER)
    # asynchronous ops: launch point, comm stream, who waits for them
    ai = np.flatnonzero(asyn)
    if len(ai):
        lp = _last_before(gw[mi], end[mi], gw[ai], start[ai] + tol)
        add(_take(mi, lp), ai, LAUNCH)
        live_a = ai[~noop[ai]]
        key = gw[live_a] * (len(names) + 1) + op[live_a]
        so = np.lexsort((live_a, key))
        live_a, key = live_a[so], key[so]
        same = np.zeros(len(live_a), dtype=bool)
        same[1:] = key[1:] == key[:-1]
        prev_a = np.r_[-1, live_a[:-1]]
        chain = same & (end[np.maximum(prev_a, 0)] <= start[live_a] + tol)
        add(np.where(chain, prev_a, -1), live_a, STREAM)
        for rname, cm in (("forward-recv", fwd_c), ("backward-recv", bwd_c)):
            if rname not in code:
                continue
            rr = live_a[op[live_a] == code[rname]]
            ci = np.flatnonzero(cm & main)
            j = _first_after(gw[ci], start[ci], gw[rr], end[rr] - tol)
            add(rr, _take(ci, j), RECV)
        if "params-all-gather" in code:
            ag = live_a[op[live_a] == code["params-all-gather"]]
            ci = np.flatnonzero(fwd_c & main)
            j = _first_after(gw[ci], start[ci], gw[ag], end[ag] - tol)
            add(ag, _take(ci, j), DPCOLL)
        red = live_a[np.isin(op[live_a], [code[x] for x in DP_COLLECTIVES + PP_EDGE_COLLECTIVES + GLOBAL_COLLECTIVES
                                          if x in code and x != "params-all-gather"])]
        tail = np.flatnonzero(main & ~compute & ~p2p)
        j = _first_after(gw[tail], start[tail], gw[red], end[red] - tol)
        add(red, _take(tail, j), DPCOLL)
    add(eager_s, eager_r, EAGER)
    # pipeline edges over global chunks (same dp rank and step)
    pipe = 0
    for cm, delta in ((fwd_c, -1), (bwd_c, +1)):
        ci = np.flatnonzero(cm & (mb >= 0) & (gmc >= 0))
        if not len(ci):
            continue
        tgt = gmc[ci] + delta
        j = _match([k[ci], dpr[ci], mb[ci], gmc[ci]], [k[ci], dpr[ci], mb[ci], tgt], tgt >= 0)
        ok = j >= 0
        add(ci[j[ok]], ci[ok], PIPELINE)
        pipe += int(ok.sum())
    src = np.concatenate(esrc) if esrc else np.zeros(0, dtype=np.int64)
    dst = np.concatenate(edst) if edst else np.zeros(0, dtype=np.int64)
    kind = np.concatenate(ekind) if ekind else np.zeros(0, dtype=np.int8)
    # a cross-worker dependency that ended after its dependant ended is not one (clocks or pairing disagree)
    bad = np.isin(kind, CROSS_KINDS) & (end[src] > end[dst] + tol)
    dropped = int(bad.sum())
    if dropped:
        warnings.append(f"{dropped} cross-worker dependencies contradict the recorded times and were ignored "
                        f"(clock skew, or ops missing from the trace)")
        src, dst, kind = src[~bad], dst[~bad], kind[~bad]
    # ---- units: P2P pairs and collectives (each member its own transfer), run-log pairs (end together)
    uid = np.arange(n, dtype=np.int64)
    ncoll = 0
    if coll.any():
        idx = np.flatnonzero(coll)
        rep = _group_reduce(np.minimum, cgid[idx], idx, int(cgid[idx].max()) + 1, n)
        uid[idx] = rep[cgid[idx]]
        ncoll = int((csize > 1).sum())
    pr = ppeer >= 0
    uid[pr] = np.minimum(np.arange(n)[pr], ppeer[pr])
    runpair = (pair >= 0) & ~coll & ~pr
    if runpair.any():
        idx = np.flatnonzero(runpair)
        _, _, g = _lex([k[idx], worker[idx], pair[idx]])
        rep = _group_reduce(np.minimum, g, idx, int(g.max()) + 1, n)
        uid[idx] = rep[g]
    sync = coll | pr
    # ---- measured durations, launch gaps and the dependency that bound each op
    ready = np.full(n, -np.inf)
    bind = np.full(n, START, dtype=np.int8)
    late = np.zeros(len(src), dtype=bool)
    if len(src):
        o = np.lexsort((end[src], dst))  # per dependant, its latest-ending dependency last
        last = np.r_[dst[o][1:] != dst[o][:-1], True]
        ready[dst[o][last]] = end[src[o][last]]
        bind[dst[o][last]] = kind[o][last]
        late = (end[src] > start[dst] + tol) & (kind != EAGER)  # a recv is posted before its send ends
    origin = _group_reduce(np.minimum, k, start, K, np.inf)
    step_end = _group_reduce(np.maximum, k, end, K, -np.inf)
    measured = step_end - origin
    ready = np.where(np.isfinite(ready), ready, origin[k])
    ustart = _group_reduce(np.maximum, uid, start, n, -np.inf)[uid]
    together = runpair | (np.bincount(uid, minlength=n)[uid] > 1) & ~sync
    dm = np.where(sync, np.maximum(0.0, end - ustart), np.where(together, end - ustart, end - start))
    dm[eager_r] = np.maximum(0.0, end[eager_r] - np.maximum(start[eager_r], end[eager_s]))
    neg_transfer = int((sync & (end < ustart - tol)).sum())
    gap = np.maximum(0.0, start - ready)
    # ---- typical durations: per (step, optype) the median over workers of each worker's median (ops of
    # run-log pairs, whose measured time is the pair's, have their own typical: the paired ones'; so do
    # the variants of one optype a run log tells apart, e.g. B and BW jobs, both backward-compute)
    pk = runpair.astype(np.int64) * (int(var.max()) + 1) + var
    _, _, g1 = _lex([k, op, pk, worker])
    n1 = int(g1.max()) + 1
    med1 = group_median(g1, dm, n1)
    first1 = _group_reduce(np.minimum, g1, np.arange(n), n1, n)
    _, _, g2 = _lex([k[first1], op[first1], pk[first1]])
    med2 = group_median(g2, med1, int(g2.max()) + 1)
    dt = med2[g2[g1]]
    # ---- levels: Kahn over units (no edge inside a unit)
    _, _, ucomp = _lex([uid])
    U = int(ucomp.max()) + 1
    inside = ucomp[src] == ucomp[dst]
    src, dst, kind, late = src[~inside], dst[~inside], kind[~inside], late[~inside]
    level = _kahn(U, ucomp[src], ucomp[dst])
    if level is None:
        # P2P pairs recorded in an order no run could have: replay them as each side's own time
        warnings.append("the dependencies form a cycle (P2P pairs or collectives recorded in an inconsistent "
                        "order); P2P pairs and pipeline edges dropped")
        uid = np.where(pr, np.arange(n), uid)
        sync = coll
        dm = np.where(pr, end - start, dm)
        npairs = 0
        keep_e = kind != PIPELINE
        src, dst, kind, late = src[keep_e], dst[keep_e], kind[keep_e], late[keep_e]
        pipe = 0
        _, _, ucomp = _lex([uid])
        U = int(ucomp.max()) + 1
        level = _kahn(U, ucomp[src], ucomp[dst])
        if level is None:
            raise WhatIfError(f"{tr.path}: the collectives of the trace are recorded in an order no run could "
                              f"have (a dependency cycle); check dp_rank/stage/seq_id")
    # ---- what each dependency kind explains and contradicts (measured)
    deps = {}
    for kd in range(len(KIND_NAMES)):
        ne = int((kind == kd).sum())
        gsum = float(gap[bind == kd].sum())
        if ne or gsum > 0:
            deps[KIND_NAMES[kd]] = {"edges": ne, "contradicted": int(late[kind == kd].sum()), "launch_gap": gsum}
    for kd, mem in ((P2P_SYNC, pr & sync), (COLL_SYNC, coll)):
        if mem.any():
            deps[KIND_NAMES[kd]] = {"units": int(len(np.unique(uid[mem]))), "members": int(mem.sum()),
                                    "contradicted": int((mem & (end < ustart - tol)).sum()), "launch_gap": 0.0}
    # ---- replay order: by (level, unit, time order)
    lev_op = level[ucomp]
    order = np.lexsort((np.arange(n), ucomp, lev_op))
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    psrc, pdst = pos[src], pos[dst]
    eo = np.lexsort((psrc, pdst))
    psrc, pdst, kind = psrc[eo], pdst[eo], kind[eo]
    e_ptr = np.searchsorted(pdst, np.arange(n + 1))
    uc_o = ucomp[order]
    lev_o = lev_op[order]
    unew = np.ones(n, dtype=bool)
    unew[1:] = uc_o[1:] != uc_o[:-1]
    ustart_o = np.flatnonzero(unew)
    unit_of = np.cumsum(unew) - 1
    lb = np.flatnonzero(np.r_[True, lev_o[1:] != lev_o[:-1]])
    le = np.r_[lb[1:], n]
    levels = []
    cnt = np.diff(e_ptr)
    for a, b in zip(lb.tolist(), le.tolist()):
        ea, eb = int(e_ptr[a]), int(e_ptr[b])
        c = cnt[a:b]
        hs = c > 0
        has = None if hs.all() else np.flatnonzero(hs)
        seg = (e_ptr[a:b][hs] - ea).astype(np.int64)
        us = unit_of[a:b]
        if us[-1] - us[0] + 1 == b - a:
            urel = uidx = None
        else:
            urel, uidx = ustart_o[us[0]: us[-1] + 1] - a, us - us[0]
        levels.append(Level(a, b, ea, eb, has, seg, urel, uidx))
    tog = together[order]
    tog_info = None
    if tog.any():
        tpos = np.flatnonzero(tog)
        tu = unit_of[tpos]
        tnew = np.r_[True, tu[1:] != tu[:-1]]
        tog_info = (tpos, np.flatnonzero(tnew), np.cumsum(tnew) - 1)
    k_o = k[order]
    step_perm = np.argsort(k_o, kind="stable")
    step_bounds = np.flatnonzero(np.r_[True, k_o[step_perm][1:] != k_o[step_perm][:-1]])
    if merged:
        warnings.append(f"{merged} rows of further TP ranks merged into their (dp, stage) worker")
    placement = {"main_lane": int(main.sum()), "async": int((asyn & ~noop).sum()), "p2p_no_op": int(noop.sum()),
                 "p2p_unpaired": unpaired, "p2p_one_sided": one_sided, "collective_alone": {}, "opaque": {}}
    alone = grouped & ~coll
    for c in np.unique(op[alone]).tolist():
        placement["collective_alone"][names[c]] = int((alone & (op == c)).sum())
    opaque = ~np.isin(op, [code[x] for x in KNOWN_OPS if x in code])
    for c in np.unique(op[opaque]).tolist():
        placement["opaque"][names[c]] = int((opaque & (op == c)).sum())
    if unpaired:
        warnings.append("send/recv rows with no peer to pair with (replayed as their worker's own time): "
                        + ", ".join(f"{v} {nm}" for nm, v in sorted(unpaired.items())))
    if placement["collective_alone"] and W > 1:
        warnings.append("collective rows with no other member in the trace (replayed as their worker's own time): "
                        + ", ".join(f"{v} {nm}" for nm, v in sorted(placement["collective_alone"].items())))
    if neg_transfer:
        warnings.append(f"{neg_transfer} members of P2P pairs or collectives ended before their last peer was "
                        f"posted (clocks off, or a pairing the trace does not support): transfer time set to 0")
    return Model(optypes=names, steps=steps_u, dp=dp, pp=pp, n=n, worker=worker[order], stage=stage[order],
                 dpr=dpr[order], k=k_o, op=op[order], mb=mb[order], gmc=gmc[order], e_src=psrc, e_ptr=e_ptr,
                 e_kind=kind, gap=gap[order], bind=bind[order], dm=dm[order], dt=dt[order], levels=levels,
                 step_perm=step_perm, step_bounds=step_bounds, measured=measured, rel_start=(start - origin[k])[order],
                 rel_end=(end - origin[k])[order], warnings=warnings, merged_tp_rows=merged, pipeline_edges=pipe,
                 p2p_pairs=npairs, collectives=ncoll, together=tog_info, placement=placement, dependencies=deps,
                 clock=clock, tol=tol)
