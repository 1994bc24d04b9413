"""Where a pipeline step's time goes, per rank: pipeloom vs torch.distributed.pipelining, side by side.

Same model, chunks and job order as ``bench/runtime_vs_torch.py`` (multi-stage pairs run torch's
``pipeline_order``); pipeloom and torch steps alternate in one process group. For each rank and
runtime it prints the median step (wall and the main thread's CPU time, ``time.thread_time``) and
the per-step totals of wall (CPU) inside: F, B (BW or B), W, wait (blocking on a peer's message)
and post (issuing isend/irecv, polling sends). Timers wrap pipeloom's job handlers and P2P calls
and torch's ``forward_one_chunk``/``backward_one_chunk``/``backward_weight_one_chunk`` and its
``_batch_p2p``/``_wait_batch_p2p`` (torch's last stage computes the loss outside F; pipeloom's inside).

    python bench/runtime_cpu_split.py [--schedule 1f1b] [--steps 20] [--old PATH/TO/executor.py]

``--old`` adds a third runtime: an older ``pipeloom/runtime/executor.py`` (e.g. from ``git show``),
loaded as a module of the installed package, to compare executors step by step.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _harness import median, round_orders  # noqa: E402

PAIRS = {"fthenb": ("ScheduleGPipe", 1), "1f1b": ("Schedule1F1B", 1),
         "interleaved": ("ScheduleInterleaved1F1B", 2), "zbv": ("ScheduleZBVZeroBubble", 2)}
CATS = ("F", "B", "W", "wait", "post")


def _worker(opts: dict):
    import importlib.util

    import torch
    import torch.distributed as dist
    import torch.distributed.pipelining as tpp
    import torch.distributed.pipelining.schedules as tsch

    import runtime_vs_torch as bench
    from pipeloom import api
    from pipeloom.models.llama import LlamaConfig, build_chunk_modules, even_layer_split, loss_fn, synthetic_batch
    from pipeloom.runtime.executor import PipelineExecutor
    from pipeloom.core.ir import Kind

    rank, pp = dist.get_rank(), dist.get_world_size()
    if opts.get("pin"):
        bench._pin(rank)
    pname = opts["schedule"]
    tname, vpp = PAIRS[pname]
    m = opts["microbatches"]
    sched = api.plan(pname, api.make_spec(pp=pp, microbatches=m, vpp=vpp))
    nc = sched.num_chunks
    cfg = LlamaConfig(n_layers=max(opts["layers"], nc), dim=opts["dim"], max_seq_len=opts["seq"],
                      n_heads=opts["heads"], n_kv_heads=opts["heads"] // 2)
    split, mine = even_layer_split(cfg.layers, nc), sched.chunks_of(rank)
    x, y = synthetic_batch(cfg, m * opts["mbs"], opts["seq"], seed=1)
    xs, ys = list(x.chunk(m)), list(y.chunk(m))
    tmods = build_chunk_modules(cfg, split, 0, chunks=mine)
    stages = [tpp.PipelineStage(mod, k, nc, torch.device("cpu")) for k, mod in zip(mine, tmods)]
    tsched = getattr(tpp, tname)(stages[0] if vpp == 1 else stages, n_microbatches=m, loss_fn=loss_fn)
    if vpp > 1:
        sched = bench._torch_order(tsched.pipeline_order, sched, tname)
    has_first, has_last = 0 in mine, nc - 1 in mine

    acc: dict[tuple[str, str], list[float]] = {}
    current = [None]

    def timed_call(cat: str, fn, *a, **k):
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            if current[0] is not None:
                d = acc.setdefault((current[0], cat), [0.0, 0.0])
                d[0] += time.perf_counter() - w0
                d[1] += time.thread_time() - c0

    def timed(obj, attr: str, cat: str) -> None:
        fn = getattr(obj, attr)
        setattr(obj, attr, functools.wraps(fn)(lambda *a, **k: timed_call(cat, fn, *a, **k)))

    for st in stages:
        timed(st, "forward_one_chunk", "F")
        timed(st, "backward_one_chunk", "B")
        timed(st, "backward_weight_one_chunk", "W")
    timed(tsch, "_wait_batch_p2p", "wait")
    timed(tsch, "_batch_p2p", "post")

    runs = []
    execs = [("pipeloom", PipelineExecutor)]
    if opts["old"]:
        if opts["old_p2p"]:  # the old executor's relative import .p2p picks this module up
            spec = importlib.util.spec_from_file_location("pipeloom.runtime._old_p2p", opts["old_p2p"])
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod
            spec.loader.exec_module(mod)
        spec = importlib.util.spec_from_file_location("pipeloom.runtime._old_executor", opts["old"])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        execs.append(("pipeloom (--old)", mod.PipelineExecutor))
    for name, cls in execs:
        ex = cls(sched, dict(zip(mine, build_chunk_modules(cfg, split, 0, chunks=mine))), loss_fn,
                 pp_rank=rank, pp_ranks=list(range(pp)))
        if hasattr(ex, "on_job"):  # time every job through the executor's public hook
            cats = {Kind.F: "F", Kind.B: "B", Kind.W: "W", Kind.BW: "B"}
            ex.on_job = lambda job, run: timed_call(cats[job.kind], run, job)
        else:  # an --old executor from before on_job
            for attr, cat in (("_run_f", "F"), ("_run_b", "B"), ("_run_w", "W")):
                timed(ex, attr, cat)
            ex._handlers = {Kind.F: ex._run_f, Kind.B: ex._run_b, Kind.W: ex._run_w, Kind.BW: ex._run_b}
        timed(ex.p2p, "recv", "wait")
        timed(ex.p2p, "advance", "post")
        timed(ex.p2p, "poll_sends", "post")
        runs.append((name, functools.partial(lambda e: e.step(xs if has_first else None, ys if has_last else None), ex),
                     list(ex.modules.values())))

    def torch_step():
        if has_first and has_last:
            tsched.step(x, target=y, losses=[])
        elif has_first:
            tsched.step(x)
        elif has_last:
            tsched.step(target=y, losses=[])
        else:
            tsched.step()
    runs.append(("torch", torch_step, tmods))

    steps, warm = opts["steps"], 2
    per_step: dict[str, list[tuple[float, float, float]]] = {}
    entry = {name: (fn, mods) for name, fn, mods in runs}
    for i, order in enumerate(round_orders(list(entry), warm + steps)):
        for name in order:
            fn, mods = entry[name]
            dist.barrier()
            current[0] = name if i >= warm else None
            w0, c0 = time.perf_counter(), time.thread_time()
            fn()
            w1, c1 = time.perf_counter(), time.thread_time()
            current[0] = None
            for mod in mods:
                mod.zero_grad(set_to_none=True)
            dist.barrier()
            if i >= warm:
                per_step.setdefault(name, []).append((w1 - w0, c1 - c0, time.perf_counter() - w0))
    out = [None] * pp
    dist.all_gather_object(out, (acc, per_step))
    return out if rank == 0 else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedule", choices=list(PAIRS), default="1f1b")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--mbs", type=int, default=4)
    ap.add_argument("--pin", action="store_true", help="pin each rank (all its threads) to its own core")
    ap.add_argument("--old", default=None, help="an older pipeloom/runtime/executor.py to run as a third runtime")
    ap.add_argument("--old-p2p", default=None, help="with --old: the p2p.py that executor used")
    a = ap.parse_args(argv)
    from pipeloom.runtime.launch import spawn

    res = spawn(_worker, a.pp, (vars(a),), timeout_s=300)
    names = list(res[0][1])
    print(f"{a.schedule}, pp={a.pp} m={a.microbatches}: ms per step, mean over {a.steps} steps, "
          "wall (main-thread CPU); rest = step - the parts")
    print("| rank | runtime | step | barrier to barrier | " + " | ".join(CATS) + " | rest |")
    print("|---|---|---|---|" + "---|" * (len(CATS) + 1))
    for r, (acc, per_step) in enumerate(res):
        for name in names:
            w, c, b = (1000 * statistics.fmean(col) for col in zip(*per_step[name]))
            parts, sw, sc = [], 0.0, 0.0
            for cat in CATS:
                pw, pc = (1000 * v / a.steps for v in acc.get((name, cat), (0.0, 0.0)))
                sw, sc = sw + pw, sc + pc
                parts.append(f"{pw:.1f} ({pc:.1f})" if (name, cat) in acc else "")
            print(f"| {r} | {name} | {w:.1f} ({c:.1f}) | {b:.1f} | " + " | ".join(parts)
                  + f" | {w - sw:.1f} ({c - sc:.1f}) |")
    slow = {n: median(max(res[r][1][n][i][2] for r in range(len(res))) for i in range(a.steps)) for n in names}
    print("barrier-to-barrier step (slowest rank), ratio to torch: "
          + ", ".join(f"{n} {slow[n] / slow['torch']:.3f}" for n in names if n != "torch"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
