"""Synthetic op traces of a dp x tp x pp (x vpp) trainer with one planted cause (no torch).

Two formats: :func:`generate` (below: a pipeloom schedule with non-blocking sends, the format the what-if
analysis was first built on) and :func:`generate_real` (:class:`RealSynthConfig`: what a Megatron-style
trainer's profiler writes, with blocking P2P pairs, no-op records, an overlapped gradient reduce-scatter, a
context dimension and skewed clocks; causes also ``slow_link``).

The pipeline order of every stage is a pipeloom schedule (``1f1b``, or ``interleaved`` for vpp > 1,
from :mod:`pipeloom.schedule.planning`); around each job the generator puts the ops a Megatron-style
trainer records (forward/backward recv before, send after), and after the pipeline the step's tail:
embedding-grads-all-reduce (first and last stage), layernorm-grads-all-reduce, grads-reduce-scatter
(dp group of the stage), optimizer-clip-main-grad (all workers), optimizer, params-all-gather.

Timing is a small sequential event simulation written independently of :mod:`.whatif`'s vectorised
replay (so a test comparing the two is not the code checking itself): a send is non-blocking, a recv
ends ``p2p`` after both it was posted and its send ended, a collective starts when its last member
arrives and ends for every member together. Every duration gets its own jitter draw; the planted cause
multiplies durations on top, and the same draws are simulated once more without it, so
``planted_slowdown`` = mean step time with the cause / mean step time without it is the truth a
diagnosis must recover.

Causes: ``slow_worker`` (one (dp, stage) worker's compute slower), ``heavy_stage`` (one stage's compute
heavier on every dp rank, e.g. the last one with the loss head), ``random_slow`` (each step a random
worker's compute slower: no fixed straggler), ``slow_collective`` (one optype's transfer slower on the
dp group of one stage).

    python -m pipeloom.trace.optrace_synth OUT.parquet --dp 4 --pp 8 --tp 4 --steps 40 --cause slow_worker
"""
from __future__ import annotations

import argparse
import json
import os
import random
from dataclasses import asdict, dataclass, field

import numpy as np

from ..core.files import atomic_write
from ..schedule.planning import make_spec, plan

CAUSES = ("none", "slow_worker", "heavy_stage", "random_slow", "slow_collective")


@dataclass(kw_only=True)
class OpSynthConfig:
    """What to generate. Durations in ms (base values per op before jitter and the planted cause)."""

    dp: int = 2
    pp: int = 4
    tp: int = 1
    vpp: int = 1
    microbatches: int | None = None
    """default: 2 * pp"""
    steps: int = 20
    fwd: float = 1.0
    bwd: float = 2.0
    send: float = 0.02
    p2p: float = 0.05
    reduce_scatter: float = 0.6
    all_gather: float = 0.4
    embedding: float = 0.1
    layernorm: float = 0.03
    clip: float = 0.05
    optimizer: float = 0.3
    jitter: float = 0.02
    """relative standard deviation of every duration"""
    step_gap: float = 1.0
    seed: int = 0
    cause: str = "none"
    factor: float = 2.0
    """the cause's duration multiplier"""
    where: tuple[int, int] = (0, 0)
    """slow_worker: (dp_rank, stage); heavy_stage / slow_collective: (-, stage) (-1 = last stage)"""
    collective: str = "grads-reduce-scatter"
    all_tp_ranks: bool = False
    """write a row for every tp rank (else only tp rank 0 of each worker, as traces often do)"""
    t0: float = 1.0e6


@dataclass
class SynthResult:
    columns: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    step_ms: list = field(default_factory=list)
    clean_step_ms: list = field(default_factory=list)
    planted_slowdown: float = 1.0
    slow_by_step: dict = field(default_factory=dict)
    """random_slow: step -> (dp_rank, stage) slowed"""
    noop_rows: int = 0
    """real format: rows of calls that launched nothing (no-op send/recv records)"""


def _stage_of(cfg: OpSynthConfig, s: int) -> int:
    return cfg.pp - 1 if s == -1 else s


def _worker_ops(cfg: OpSynthConfig, sched, d: int, s: int) -> list[tuple]:
    """(optype, kind, key, mc, gmc, mb) in execution order; kind: compute/local/send/recv/coll."""
    nc = sched.num_chunks
    local = {c: i for i, c in enumerate(sched.chunks_of(s))}
    ops = []
    for job in sched.devices[s]:
        g, mb, k = job.chunk, job.mb, job.kind.value
        mc = local[g]
        if k == "F":
            if g > 0:
                ops.append(("forward-recv", "recv", ("F", d, mb, g - 1), mc, g, -1))
            ops.append(("forward-compute", "compute", None, mc, g, mb))
            if g < nc - 1:
                ops.append(("forward-send", "send", ("F", d, mb, g), mc, g, -1))
        else:
            if g < nc - 1:
                ops.append(("backward-recv", "recv", ("B", d, mb, g + 1), mc, g, -1))
            ops.append(("backward-compute", "compute", None, mc, g, mb))
            if g > 0:
                ops.append(("backward-send", "send", ("B", d, mb, g), mc, g, -1))
    if cfg.pp > 1 and s in (0, cfg.pp - 1):
        ops.append(("embedding-grads-all-reduce", "coll", ("emb", d), -1, -1, -1))
    ops.append(("layernorm-grads-all-reduce", "local", None, -1, -1, -1))
    ops.append(("grads-reduce-scatter", "coll", ("rs", s), -1, -1, -1))
    ops.append(("optimizer-clip-main-grad", "coll", ("clip",), -1, -1, -1))
    ops.append(("optimizer", "local", None, -1, -1, -1))
    ops.append(("params-all-gather", "coll", ("ag", s), -1, -1, -1))
    return ops


def _base(cfg: OpSynthConfig, name: str) -> float:
    return {"forward-compute": cfg.fwd, "backward-compute": cfg.bwd, "forward-send": cfg.send,
            "backward-send": cfg.send, "forward-recv": cfg.p2p, "backward-recv": cfg.p2p,
            "embedding-grads-all-reduce": cfg.embedding, "layernorm-grads-all-reduce": cfg.layernorm,
            "grads-reduce-scatter": cfg.reduce_scatter, "optimizer-clip-main-grad": cfg.clip,
            "optimizer": cfg.optimizer, "params-all-gather": cfg.all_gather}[name]


def _simulate(oplists: list[list[tuple]], durs: list[list[float]], gdur: dict, gsize: dict):
    """Per worker the (start, duration) of each op, times from 0 (the step start); sequential sweeps."""
    W = len(oplists)
    t = [0.0] * W
    ptr = [0] * W
    waiting = [False] * W
    starts = [[0.0] * len(o) for o in oplists]
    lens = [[0.0] * len(o) for o in oplists]
    send_end: dict = {}
    arrived: dict = {}
    left = sum(len(o) for o in oplists)
    while left:
        progress = False
        for w in range(W):
            ops = oplists[w]
            while ptr[w] < len(ops) and not waiting[w]:
                i = ptr[w]
                kind, key = ops[i][1], ops[i][2]
                if kind == "recv":
                    if key not in send_end:
                        break
                    st = t[w]
                    en = max(st, send_end[key]) + durs[w][i]
                elif kind == "coll":
                    arr = arrived.setdefault(key, [])
                    arr.append((w, i, t[w]))
                    waiting[w] = True
                    progress = True
                    if len(arr) == gsize[key]:
                        en = max(a[2] for a in arr) + gdur[key]
                        for w2, i2, ta in arr:
                            starts[w2][i2], lens[w2][i2] = ta, en - ta
                            t[w2] = en
                            ptr[w2] += 1
                            waiting[w2] = False
                            left -= 1
                        del arrived[key]
                    continue
                else:
                    st = t[w]
                    en = st + durs[w][i]
                    if kind == "send":
                        send_end[key] = en
                starts[w][i], lens[w][i] = st, en - st
                t[w] = en
                ptr[w] += 1
                left -= 1
                progress = True
        if not progress:
            raise RuntimeError("synthetic trace deadlocked (an op order the generator cannot time)")
    return starts, lens


def generate(cfg: OpSynthConfig | None = None) -> SynthResult:
    """Build the op table (numpy columns in the trace schema) and the planted truth."""
    cfg = cfg or OpSynthConfig()
    if cfg.cause not in CAUSES:
        raise ValueError(f"cause {cfg.cause!r}: use one of {', '.join(CAUSES)}")
    m = cfg.microbatches or 2 * cfg.pp
    name = "1f1b" if cfg.vpp == 1 else "interleaved"
    sched = plan(name, make_spec(pp=cfg.pp, microbatches=m, vpp=cfg.vpp))
    rng = random.Random(cfg.seed)
    W = cfg.dp * cfg.pp
    workers = [(d, s) for d in range(cfg.dp) for s in range(cfg.pp)]
    oplists = [_worker_ops(cfg, sched, d, s) for d, s in workers]
    gsize: dict = {}
    for ops in oplists:
        for o in ops:
            if o[1] == "coll":
                gsize[o[2]] = gsize.get(o[2], 0) + 1
    stage = _stage_of(cfg, cfg.where[1])
    cols = {k: [] for k in ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id", "mc",
                            "gmc", "mb_id")}
    res = SynthResult()
    t0 = cfg.t0
    for step in range(cfg.steps):
        slow = None
        if cfg.cause == "slow_worker":
            slow = (cfg.where[0], stage)
        elif cfg.cause == "random_slow":
            slow = workers[rng.randrange(W)]
            res.slow_by_step[step] = slow
        jit = [[max(0.05, 1.0 + cfg.jitter * rng.gauss(0.0, 1.0)) for _ in ops] for ops in oplists]
        gjit = {k: max(0.05, 1.0 + cfg.jitter * rng.gauss(0.0, 1.0)) for k in sorted(gsize, key=str)}
        clean = [[_base(cfg, o[0]) * j for o, j in zip(ops, js)] for ops, js in zip(oplists, jit)]
        gclean = {}
        for ops in oplists:
            for o in ops:
                if o[1] == "coll":
                    gclean[o[2]] = _base(cfg, o[0]) * gjit[o[2]]
        planted = [row[:] for row in clean]
        gplanted = dict(gclean)
        for w, (d, s) in enumerate(workers):
            f = 1.0
            if cfg.cause in ("slow_worker", "random_slow") and (d, s) == slow:
                f = cfg.factor
            elif cfg.cause == "heavy_stage" and s == stage:
                f = cfg.factor
            if f != 1.0:
                planted[w] = [x * f if o[1] == "compute" else x for o, x in zip(oplists[w], planted[w])]
        if cfg.cause == "slow_collective":
            for k in gplanted:
                if k[0] == {"grads-reduce-scatter": "rs", "params-all-gather": "ag"}.get(cfg.collective) \
                        and k[1] == stage:
                    gplanted[k] *= cfg.factor
        starts, lens = _simulate(oplists, planted, gplanted, gsize)
        if cfg.cause == "none":
            c_end = max(s_ + l_ for st, ln in zip(starts, lens) for s_, l_ in zip(st, ln))
        else:
            cs, cl = _simulate(oplists, clean, gclean, gsize)
            c_end = max(s_ + l_ for st, ln in zip(cs, cl) for s_, l_ in zip(st, ln))
        end = max(s_ + l_ for st, ln in zip(starts, lens) for s_, l_ in zip(st, ln))
        res.step_ms.append(end)
        res.clean_step_ms.append(c_end)
        for w, (d, s) in enumerate(workers):
            seq: dict = {}
            tps = range(cfg.tp) if cfg.all_tp_ranks else range(1)
            for i, o in enumerate(oplists[w]):
                n = seq.get(o[0], 0)
                seq[o[0]] = n + 1
                for tpr in tps:
                    cols["dp_rank"].append(d)
                    cols["stage"].append(s)
                    cols["rank"].append((s * cfg.dp + d) * cfg.tp + tpr)
                    cols["step"].append(step)
                    cols["optype"].append(o[0])
                    cols["start_ts"].append(t0 + starts[w][i])
                    cols["duration"].append(lens[w][i])
                    cols["seq_id"].append(n)
                    cols["mc"].append(o[3])
                    cols["gmc"].append(o[4])
                    cols["mb_id"].append(o[5])
        t0 += end + cfg.step_gap
    res.columns = {k: (np.asarray(v, dtype=object) if k == "optype" else np.asarray(v)) for k, v in cols.items()}
    res.meta = {"dp_size": cfg.dp, "pp_size": cfg.pp, "tp_size": cfg.tp, "vpp_size": cfg.vpp,
                "world_size": cfg.dp * cfg.pp * cfg.tp, "time_unit": "ms"}
    res.planted_slowdown = float(np.mean(res.step_ms) / np.mean(res.clean_step_ms))
    return res


# ------------------------------------------------------------------------- the real (Megatron) format
REAL_CAUSES = ("none", "slow_worker", "heavy_stage", "random_slow", "slow_link")


@dataclass(kw_only=True)
class RealSynthConfig:
    """A trace in the format a Megatron-style trainer's profiler writes (1F1B; interleaved for vpp > 1), with its
    quirks: P2P calls
    that block until their peer is there (send_forward_recv_backward and send_backward_recv_forward as two records
    over one interval), no-op records of the calls with no peer (the first stage's forward-recv, the last stage's
    forward-send, ...) and of records never launched at the start/end of a step, the gradient reduce-scatter
    bucketed and overlapped with the last backward on a communication stream, a sequence/context dimension in the
    rank layout (only the first rank of each context group recorded), and machines whose clocks are off.
    Durations in ms."""

    dp: int = 4
    pp: int = 4
    cp: int = 2
    vpp: int = 1
    """> 1: the interleaved schedule (pipeloom's plan), every job's P2P launched one job ahead on its own stream"""
    microbatches: int | None = None
    """default: 2 * pp"""
    steps: int = 20
    fwd: float = 1.0
    bwd: float = 2.0
    p2p: float = 0.05
    reduce_scatter: float = 0.3
    """per bucket (two buckets: the first overlaps the last backward)"""
    all_gather: float = 0.3
    embedding: float = 0.1
    layernorm: float = 0.03
    clip: float = 0.05
    optimizer: float = 0.3
    noop: float = 0.002
    """the duration recorded for a call that launched nothing"""
    jitter: float = 0.02
    launch: float = 0.002
    """CPU launch time before each op of the main lane (the replay's launch gaps)"""
    overlap_grad_reduce: bool = True
    overlap_p2p: bool = False
    """every P2P op launched asynchronously on its own stream (a recv prefetched one compute ahead), waited for
    right before the compute that needs it (the recv's data) or at the end of the step (sends)"""
    skew: float = 0.0
    """each machine's clock is off by a uniform draw from [-skew, skew] ms"""
    gpus_per_machine: int = 8
    seed: int = 0
    cause: str = "none"
    factor: float = 2.0
    where: tuple[int, int] = (0, 0)
    """slow_worker: (dp_rank, stage); heavy_stage: (-, stage), -1 = last; slow_link: (-, s): the link s <-> s+1"""
    t0: float = 1.0e6


def _real_program(cfg: RealSynthConfig, d: int, s: int, m: int, sched=None) -> list[list[tuple]]:
    """The main lane of worker (d, s) as launch groups; part: (optype, kind, key, base, mb, launch_comm) with
    kind compute/local/rv (rendezvous: P2P pair or collective)/noop/wait (wait for the comm stream)."""
    pp = cfg.pp
    prog: list[list[tuple]] = [[("params-all-gather", "rv", ("ag", s), cfg.all_gather, -1)]]
    if s < pp - 1:
        prog.append([("forward-send", "noop", None, 0.0, -1)])  # recorded at the start, never launched

    def recv_f(i):
        return ("forward-recv", "rv", ("F", d, s - 1, i), cfg.p2p, -1) if s > 0 else ("forward-recv", "noop", None,
                                                                                      0.0, -1)

    def send_f(i):
        return ("forward-send", "rv", ("F", d, s, i), cfg.p2p, -1) if s < pp - 1 else ("forward-send", "noop", None,
                                                                                      0.0, -1)

    def recv_b(i):
        return ("backward-recv", "rv", ("B", d, s + 1, i), cfg.p2p, -1) if s < pp - 1 else ("backward-recv", "noop",
                                                                                           None, 0.0, -1)

    def send_b(i):
        return ("backward-send", "rv", ("B", d, s, i), cfg.p2p, -1) if s > 0 else ("backward-send", "noop", None,
                                                                                   0.0, -1)

    def F(i):
        return [("forward-compute", "compute", None, cfg.fwd, i)]

    def B(i):
        out = [[("backward-compute", "compute", None, cfg.bwd, i)]]
        if cfg.overlap_grad_reduce and i in (m - 2, m - 1):  # bucket b launched on the comm stream
            out.append([("grads-reduce-scatter", "launch", ("rs", s, i - m + 2), cfg.reduce_scatter, -1)])
        return out

    def launch(part):
        return [(part[0], "launch", part[2], part[3], -1)] if part[1] == "rv" else [part]

    def wait(part):  # (a call with no peer is recorded once, when launched)
        return [("waitfor", "waitfor", part[2], 0.0, -1)] if part[1] == "rv" else []

    if sched is not None:  # interleaved: P2P of every job launched one job ahead on its own stream (Megatron's
        G = pp * cfg.vpp  # overlap_p2p_comm); a call for the model's first/last chunk has no peer (a no-op)
        jobs = list(sched.devices[s])
        nb = sum(1 for j in jobs if j.kind.value != "F")

        def recv(j):
            if j.kind.value == "F":
                return (("forward-recv", "rv", ("F", d, j.chunk - 1, j.mb), cfg.p2p, -1) if j.chunk > 0
                        else ("forward-recv", "noop", None, 0.0, -1))
            return (("backward-recv", "rv", ("B", d, j.chunk + 1, j.mb), cfg.p2p, -1) if j.chunk < G - 1
                    else ("backward-recv", "noop", None, 0.0, -1))

        def send(j):
            if j.kind.value == "F":
                return (("forward-send", "rv", ("F", d, j.chunk, j.mb), cfg.p2p, -1) if j.chunk < G - 1
                        else ("forward-send", "noop", None, 0.0, -1))
            return (("backward-send", "rv", ("B", d, j.chunk, j.mb), cfg.p2p, -1) if j.chunk > 0
                    else ("backward-send", "noop", None, 0.0, -1))

        prog.append(launch(recv(jobs[0])))
        ib = 0
        for i, j in enumerate(jobs):
            prog += [g for g in (wait(recv(j)),) if g]
            fwd = j.kind.value == "F"
            prog.append([("forward-compute" if fwd else "backward-compute", "compute", None,
                          cfg.fwd if fwd else cfg.bwd, j.mb, j.chunk)])
            if not fwd:
                ib += 1
                if cfg.overlap_grad_reduce and ib > nb - 2:
                    prog.append([("grads-reduce-scatter", "launch", ("rs", s, ib - nb + 1), cfg.reduce_scatter, -1)])
            prog.append(launch(send(j)))
            if i + 1 < len(jobs):
                prog.append(launch(recv(jobs[i + 1])))
    elif cfg.overlap_p2p:  # every P2P op launched on its own stream, waited for right before the compute needing it
        if s < pp - 1:
            prog.append(launch(recv_b(0)))
        prog.append(launch(recv_f(0)))
        order = []
        w = min(pp - s - 1, m)
        order += [("F", i) for i in range(w)]
        for j in range(m - w):
            order += [("F", w + j), ("B", j)]
        order += [("B", j) for j in range(m - w, m)]
        for kd, i in order:
            if kd == "F":
                prog += [g for g in (wait(recv_f(i)), F(i), launch(send_f(i))) if g]
                if i + 1 < m:
                    prog.append(launch(recv_f(i + 1)))
            else:
                prog += [g for g in (wait(recv_b(i)),) if g]
                prog += B(i)
                prog.append(launch(send_b(i)))
                if i + 1 < m:
                    prog.append(launch(recv_b(i + 1)))
        order = None
    w = min(pp - s - 1, m)
    blocking = sched is None and not cfg.overlap_p2p
    for i in range(w if blocking else 0):
        prog += [[recv_f(i)], F(i), [send_f(i)]]
    if m > w and blocking:
        prog.append([recv_f(w)])
    for j in range(m - w if blocking else 0):
        prog += [F(w + j), [send_f(w + j), recv_b(j)]]
        prog += B(j)
        prog.append([send_b(j)] if j == m - w - 1 else [send_b(j), recv_f(w + j + 1)])
    for j in range(m - w, m) if blocking else ():
        prog += [[recv_b(j)]]
        prog += B(j)
        prog += [[send_b(j)]]
    if s < pp - 1 and sched is None:
        prog.append([("backward-recv", "noop", None, 0.0, -1)])  # recorded at the end, never launched
    prog.append([("layernorm-grads-all-reduce", "local", None, cfg.layernorm, -1)])
    if pp > 1 and s in (0, pp - 1):
        prog.append([("embedding-grads-all-reduce", "rv", ("emb", d), cfg.embedding, -1)])
    if cfg.overlap_grad_reduce:
        prog.append([("wait", "wait", None, 0.0, -1)])
    else:
        prog.append([("grads-reduce-scatter", "rv", ("rs", s, 0), 2 * cfg.reduce_scatter, -1)])
    prog.append([("optimizer-clip-main-grad", "rv", ("clip",), cfg.clip, -1)])
    prog.append([("optimizer", "local", None, cfg.optimizer, -1)])
    return prog


def _simulate_real(progs: list[list[list[tuple]]], dur: dict, gsize: dict, launch: float) -> list[list[tuple]]:
    """Event sweep over the workers' lanes; returns per worker the records (optype, start, duration, mb, kind).
    A rendezvous starts when its last member is posted; each member ends its own duration later."""
    W = len(progs)
    t = [0.0] * W
    ptr = [0] * W
    posted: dict = {}  # key -> [(w, part id, arrival)]
    ends: dict = {}  # (w, part id) -> end
    comm: list[list] = [[] for _ in range(W)]  # per worker: [key, part id, launch time, posted?]
    tcomm = [0.0] * W
    recs: list[list[tuple]] = [[] for _ in range(W)]
    waiting: list[set | None] = [None] * W

    def post(w, pid, key, at):
        lst = posted.setdefault(key, [])
        lst.append((w, pid, at))
        if len(lst) == gsize[key]:
            st = max(a for _, _, a in lst)
            for w2, p2, a2 in lst:
                ends[(w2, p2)] = st + dur[(w2, p2)]

    left = True
    while left:
        progress = False
        left = False
        for w in range(W):
            q = [c for c in comm[w] if c[4] == "grads-reduce-scatter"]  # the reduction stream: one at a time
            for c in q:
                if c[3] is None:
                    c[3] = max(c[2], tcomm[w])
                    post(w, c[1], c[0], c[3])
                    progress = True
                if (w, c[1]) not in ends:
                    break
                tcomm[w] = max(tcomm[w], ends[(w, c[1])])
            for c in comm[w]:  # P2P launched asynchronously: each posted at once (a batched isend/irecv)
                if c[3] is None and c[4] != "grads-reduce-scatter":
                    c[3] = c[2]
                    post(w, c[1], c[0], c[3])
                    progress = True
            prog = progs[w]
            while ptr[w] < len(prog):
                grp = prog[ptr[w]]
                i = ptr[w]
                if waiting[w] is None:
                    waiting[w] = set()
                    for j, part in enumerate(grp):
                        pid = (i, j)
                        name, kind, key = part[0], part[1], part[2]
                        if kind == "rv":
                            post(w, pid, key, t[w] + launch)
                            waiting[w].add((w, pid))
                        elif kind == "launch":
                            comm[w].append([key, pid, t[w] + launch, None, name])
                    progress = True
                if any(p not in ends for p in waiting[w]):
                    break
                if grp[0][1] == "wait" and any((w, c[1]) not in ends for c in comm[w]):
                    break
                if grp[0][1] == "waitfor" and any(c[0] == grp[0][2] and (w, c[1]) not in ends for c in comm[w]):
                    break
                t0 = t[w]
                for j, part in enumerate(grp):
                    name, kind = part[0], part[1]
                    pid = (i, j)
                    if kind in ("compute", "local"):
                        st = t[w] + launch
                        t[w] = st + dur[(w, pid)]
                        recs[w].append((name, st, dur[(w, pid)], part[4], kind, part[5] if len(part) > 5 else None))
                    elif kind == "noop":
                        recs[w].append((name, t0 + launch, dur[(w, pid)], -1, kind, None))
                    elif kind == "rv":
                        a = next(x[2] for x in posted[part[2]] if x[0] == w and x[1] == pid)
                        recs[w].append((name, a, ends[(w, pid)] - a, -1, kind, None))
                        t[w] = max(t[w], ends[(w, pid)])
                    elif kind == "wait":
                        t[w] = max([t[w]] + [ends[(w, c[1])] for c in comm[w]])
                    elif kind == "waitfor":
                        t[w] = max([t[w]] + [ends[(w, c[1])] for c in comm[w] if c[0] == part[2]])
                waiting[w] = None
                ptr[w] += 1
                progress = True
            if ptr[w] < len(prog) or any(c[3] is None or (w, c[1]) not in ends for c in comm[w]):
                left = True
        if left and not progress:
            raise RuntimeError("synthetic real-format trace deadlocked (an op order the generator cannot time)")
    for w in range(W):  # the comm stream's records
        for c in comm[w]:
            recs[w].append((c[4], c[3], ends[(w, c[1])] - c[3], -1, "rv", None))
    return recs


def generate_real(cfg: RealSynthConfig | None = None) -> SynthResult:
    """A trace in the real trainer format (see :class:`RealSynthConfig`) with one planted cause and its truth."""
    cfg = cfg or RealSynthConfig()
    if cfg.cause not in REAL_CAUSES:
        raise ValueError(f"cause {cfg.cause!r}: use one of {', '.join(REAL_CAUSES)}")
    m = cfg.microbatches or 2 * cfg.pp
    rng = random.Random(cfg.seed)
    workers = [(d, s) for d in range(cfg.dp) for s in range(cfg.pp)]
    sched = plan("interleaved", make_spec(pp=cfg.pp, microbatches=m, vpp=cfg.vpp)) if cfg.vpp > 1 else None
    progs = [_real_program(cfg, d, s, m, sched) for d, s in workers]
    gsize: dict = {}
    for prog in progs:
        for grp in prog:
            for part in grp:
                if part[1] in ("rv", "launch"):
                    gsize[part[2]] = gsize.get(part[2], 0) + 1
    stage = cfg.pp - 1 if cfg.where[1] == -1 else cfg.where[1]
    machines = (cfg.dp * cfg.pp * cfg.cp + cfg.gpus_per_machine - 1) // cfg.gpus_per_machine
    offset = [rng.uniform(-cfg.skew, cfg.skew) for _ in range(machines)]
    cols = {k: [] for k in ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id", "mc",
                            "gmc", "mb_id")}
    res = SynthResult()
    t0 = cfg.t0
    for step in range(cfg.steps):
        slow = (cfg.where[0], stage) if cfg.cause == "slow_worker" else None
        if cfg.cause == "random_slow":
            slow = workers[rng.randrange(len(workers))]
            res.slow_by_step[step] = slow
        clean: dict = {}
        planted: dict = {}
        for w, (d, s) in enumerate(workers):
            for i, grp in enumerate(progs[w]):
                for j, part in enumerate(grp):
                    name, kind, key, base = part[0], part[1], part[2], part[3]
                    x = (cfg.noop if kind == "noop" else base) * max(0.05, 1.0 + cfg.jitter * rng.gauss(0.0, 1.0))
                    clean[(w, (i, j))] = x
                    f = 1.0
                    if kind == "compute" and ((d, s) == slow or (cfg.cause == "heavy_stage" and s == stage)):
                        f = cfg.factor
                    link = key is not None and key[0] in ("F", "B") and \
                        key[2] % cfg.pp == (stage if key[0] == "F" else stage + 1)
                    if cfg.cause == "slow_link" and kind == "rv" and link:
                        f = cfg.factor
                    planted[(w, (i, j))] = x * f
        recs = _simulate_real(progs, planted, gsize, cfg.launch)
        end = max(x[1] + x[2] for r in recs for x in r)
        if cfg.cause == "none":
            c_end = end
        else:
            crecs = _simulate_real(progs, clean, gsize, cfg.launch)
            c_end = max(x[1] + x[2] for r in crecs for x in r)
        res.step_ms.append(end)
        res.clean_step_ms.append(c_end)
        for w, (d, s) in enumerate(workers):
            rank = (s * cfg.dp + d) * cfg.cp
            off = offset[rank // cfg.gpus_per_machine]
            seq: dict = {}
            local = {c: i for i, c in enumerate(sched.chunks_of(s))} if sched is not None else {s: 0}
            for name, st, du, mbi, kind, chunk in sorted(recs[w], key=lambda r: r[1]):
                res.noop_rows += kind == "noop"
                n = seq.get(name, 0)
                seq[name] = n + 1
                compute = name.endswith("-compute")
                cols["dp_rank"].append(d)
                cols["stage"].append(s)
                cols["rank"].append(rank)
                cols["step"].append(step)
                cols["optype"].append(name)
                cols["start_ts"].append(t0 + st + off)
                cols["duration"].append(du)
                cols["seq_id"].append(n)
                g = s if chunk is None else chunk
                cols["mc"].append(local[g] if compute else 0 if name in ("params-all-gather", "grads-reduce-scatter")
                                  else -1)
                cols["gmc"].append(g if compute else -1)
                cols["mb_id"].append(mbi if compute else -1)
        t0 += end + 1.0
    res.columns = {k: (np.asarray(v, dtype=object) if k == "optype" else np.asarray(v)) for k, v in cols.items()}
    res.meta = {"dp_size": cfg.dp, "pp_size": cfg.pp, "tp_size": 1, "vpp_size": cfg.vpp, "cp_size": cfg.cp,
                "world_size": cfg.dp * cfg.pp * cfg.cp, "time_unit": "ms"}
    res.planted_slowdown = float(np.mean(res.step_ms) / np.mean(res.clean_step_ms))
    return res


def write(path: str, res: SynthResult, *, meta_path: str | None = None, malformed: int = 0, seed: int = 0) -> str:
    """Write the table as Parquet or CSV (by extension) and, with ``meta_path``, the sizes as YAML/JSON.

    ``malformed`` > 0 appends that many broken rows (missing / negative / non-numeric values)."""
    import pyarrow as pa

    cols = {k: list(v) for k, v in res.columns.items()} if malformed else dict(res.columns)
    csv = path.lower().endswith((".csv", ".csv.gz"))
    if malformed:
        rng = random.Random(seed)
        for i in range(malformed):
            row = {k: v[rng.randrange(len(v))] for k, v in cols.items()}
            bad = ["duration", "stage", "start_ts", "optype", "dp_rank"][i % 5]
            row[bad] = {"duration": -1.0, "stage": None, "start_ts": float("nan"), "optype": None,
                        "dp_rank": None}[bad]
            for k in cols:
                cols[k].append(row[k])
    table = pa.table({k: pa.array(list(v) if not isinstance(v, np.ndarray) or v.dtype == object else v,
                                  from_pandas=True) for k, v in cols.items()})
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if csv:
        import pyarrow.csv as pcsv

        pcsv.write_csv(table, path)
    else:
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    if meta_path:
        with atomic_write(meta_path) as fh:
            if meta_path.lower().endswith(".json"):
                json.dump(res.meta, fh)
            else:
                fh.write("".join(f"{k}: {v}\n" for k, v in res.meta.items()))
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeloom.trace.optrace_synth",
                                description="Write a synthetic op trace (Parquet/CSV) and its meta YAML.")
    p.add_argument("out", help="OUT.parquet or OUT.csv; the meta goes to OUT.meta.yaml")
    for k in ("dp", "pp", "tp", "vpp", "steps", "seed"):
        p.add_argument(f"--{k}", type=int, default=getattr(OpSynthConfig(), k))
    p.add_argument("--microbatches", "-m", type=int, default=None)
    p.add_argument("--real", action="store_true",
                   help="the real trainer format (blocking P2P pairs, no-op records, overlapped reduce-scatter, "
                        "--cp context ranks, --skew ms clock offsets per machine); causes also slow_link")
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--skew", type=float, default=0.0)
    p.add_argument("--cause", choices=sorted(set(CAUSES) | set(REAL_CAUSES)), default="none")
    p.add_argument("--factor", type=float, default=2.0)
    p.add_argument("--where", default="0,0", help="dp_rank,stage of the cause (stage -1 = last)")
    p.add_argument("--jitter", type=float, default=0.02)
    p.add_argument("--all-tp-ranks", action="store_true")
    a = p.parse_args(argv)
    d, s = (int(x) for x in a.where.split(","))
    if a.real:
        if a.cause not in REAL_CAUSES or a.tp != 1:
            p.error(f"--real takes tp 1 and a cause of {', '.join(REAL_CAUSES)}")
        rcfg = RealSynthConfig(dp=a.dp, pp=a.pp, cp=a.cp, vpp=a.vpp, steps=a.steps, seed=a.seed,
                               microbatches=a.microbatches,
                               cause=a.cause, factor=a.factor, where=(d, s), jitter=a.jitter, skew=a.skew)
        res = generate_real(rcfg)
        stem = a.out[: -len(".csv.gz")] if a.out.endswith(".csv.gz") else os.path.splitext(a.out)[0]
        write(a.out, res, meta_path=stem + ".meta.yaml")
        print(json.dumps({"out": a.out, "meta": stem + ".meta.yaml", "ops": int(len(res.columns["step"])),
                          "planted_slowdown": round(res.planted_slowdown, 4), "config": asdict(rcfg)}))
        return 0
    if a.cause not in CAUSES:
        p.error(f"cause {a.cause} needs --real")
    cfg = OpSynthConfig(dp=a.dp, pp=a.pp, tp=a.tp, vpp=a.vpp, steps=a.steps, seed=a.seed, microbatches=a.microbatches,
                        cause=a.cause, factor=a.factor, where=(d, s), jitter=a.jitter, all_tp_ranks=a.all_tp_ranks)
    res = generate(cfg)
    stem = a.out[: -len(".csv.gz")] if a.out.endswith(".csv.gz") else os.path.splitext(a.out)[0]
    write(a.out, res, meta_path=stem + ".meta.yaml")
    print(json.dumps({"out": a.out, "meta": stem + ".meta.yaml", "ops": int(len(res.columns["step"])),
                      "planted_slowdown": round(res.planted_slowdown, 4), "config": asdict(cfg)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
