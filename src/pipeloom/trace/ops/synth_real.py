"""Synthetic op traces as a Megatron-style trainer's profiler writes them, with one planted cause (no torch).

:func:`generate_real` (:class:`RealSynthConfig`): blocking P2P pairs, no-op records, an overlapped gradient
reduce-scatter, a context dimension and skewed clocks; causes as in :mod:`.synth` plus ``slow_link``. The
pipeline order, the step's tail, the independent sequential timing and the planted truth
(``planted_slowdown``) follow :mod:`.synth`; :func:`~pipeloom.trace.ops.synth.write` writes either.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from ...schedule.planning import make_spec, plan
from .synth import SynthBase, SynthResult

REAL_CAUSES = ("none", "slow_worker", "heavy_stage", "random_slow", "slow_link")


@dataclass(kw_only=True)
class RealSynthConfig(SynthBase):
    """A trace in the format a Megatron-style trainer's profiler writes (1F1B; interleaved for vpp > 1), with its
    quirks: P2P calls
    that block until their peer is there (send_forward_recv_backward and send_backward_recv_forward as two records
    over one interval), no-op records of the calls with no peer (the first stage's forward-recv, the last stage's
    forward-send, ...) and of records never launched at the start/end of a step, the gradient reduce-scatter
    bucketed and overlapped with the last backward on a communication stream, a sequence/context dimension in the
    rank layout (only the first rank of each context group recorded), and machines whose clocks are off.
    Durations in ms; the fields it shares with pipeloom's format are :class:`~pipeloom.trace.ops.synth.SynthBase`'s
    (with other defaults below)."""

    dp: int = 4
    cp: int = 2
    vpp: int = 1
    """> 1: the interleaved schedule (pipeloom's plan), every job's P2P launched one job ahead on its own stream"""
    reduce_scatter: float = 0.3
    """per bucket (two buckets: the first overlaps the last backward)"""
    all_gather: float = 0.3
    noop: float = 0.002
    """the duration recorded for a call that launched nothing"""
    launch: float = 0.002
    """CPU launch time before each op of the main lane (the replay's launch gaps)"""
    overlap_grad_reduce: bool = True
    overlap_p2p: bool = False
    """every P2P op launched asynchronously on its own stream (a recv prefetched one compute ahead), waited for
    right before the compute that needs it (the recv's data) or at the end of the step (sends)"""
    skew: float = 0.0
    """each machine's clock is off by a uniform draw from [-skew, skew] ms"""
    gpus_per_machine: int = 8
    where: tuple[int, int] = (0, 0)
    """slow_worker: (dp_rank, stage); heavy_stage: (-, stage), -1 = last; slow_link: (-, s): the link s <-> s+1"""


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
