"""Synthetic op traces of a dp x tp x pp (x vpp) trainer with one planted cause (no torch).

Two formats: :func:`generate` (here: a pipeloom schedule with non-blocking sends, the format the what-if
analysis was first built on) and :func:`~pipeloom.trace.ops.synth_real.generate_real`
(:class:`~pipeloom.trace.ops.synth_real.RealSynthConfig`: what a Megatron-style trainer's profiler writes, with
blocking P2P pairs, no-op records, an overlapped gradient reduce-scatter, a context dimension and skewed clocks;
causes also ``slow_link``). Both configurations share :class:`SynthBase`; :func:`write` writes either result.

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

    python -m pipeloom.trace.ops.synth_cli OUT.parquet --dp 4 --pp 8 --tp 4 --steps 40 --cause slow_worker
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import numpy as np

from ...core.files import atomic_write
from ...schedule.planning import make_spec, plan

CAUSES = ("none", "slow_worker", "heavy_stage", "random_slow", "slow_collective")


@dataclass(kw_only=True)
class SynthBase:
    """What both synthetic formats share: the trainer's shape, the base durations in ms (per op, before jitter and
    the planted cause), the jitter, the seed and the cause with its factor and place."""

    dp: int = 2
    pp: int = 4
    vpp: int = 1
    microbatches: int | None = None
    """default: 2 * pp"""
    steps: int = 20
    fwd: float = 1.0
    bwd: float = 2.0
    p2p: float = 0.05
    reduce_scatter: float = 0.6
    all_gather: float = 0.4
    embedding: float = 0.1
    layernorm: float = 0.03
    clip: float = 0.05
    optimizer: float = 0.3
    jitter: float = 0.02
    """relative standard deviation of every duration"""
    seed: int = 0
    cause: str = "none"
    factor: float = 2.0
    """the cause's duration multiplier"""
    where: tuple[int, int] = (0, 0)
    """slow_worker: (dp_rank, stage); heavy_stage / slow_collective: (-, stage) (-1 = last stage)"""
    t0: float = 1.0e6
    """the clock at the first step's start"""


@dataclass(kw_only=True)
class OpSynthConfig(SynthBase):
    """What to generate in pipeloom's own format (non-blocking sends)."""

    tp: int = 1
    send: float = 0.02
    step_gap: float = 1.0
    collective: str = "grads-reduce-scatter"
    """slow_collective: the optype whose transfer is slower"""
    all_tp_ranks: bool = False
    """write a row for every tp rank (else only tp rank 0 of each worker, as traces often do)"""


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
    with atomic_write(path, "wb") as fh:
        if csv:
            import pyarrow.csv as pcsv

            pcsv.write_csv(table, fh)
        else:
            import pyarrow.parquet as pq

            pq.write_table(table, fh)
    if meta_path:
        with atomic_write(meta_path) as fh:
            if meta_path.lower().endswith(".json"):
                json.dump(res.meta, fh)
            else:
                fh.write("".join(f"{k}: {v}\n" for k, v in res.meta.items()))
    return path
