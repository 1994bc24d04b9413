"""Overlapped data-parallel gradient reduction: measured step time with and without overlap (pp 2 x dp 2,
gloo on CPU), next to the simulator's prediction (pipeloom.sim.dp) for the same configuration, and the
simulator's prediction for Llama-2 7B pp 4 x dp 8 on a 100 Gb/s link.

    python bench/dp_overlap.py [--pairs 10] [--schedules 1f1b,interleaved,zbv] [--dim 768] [--layers 8] [--seq 8] [-m 4] [--out TABLE.md]

The local configuration is chosen so that the gradient reduction is a visible part of the step: wide
layers (many parameters per chunk) and few tokens per microbatch. Per schedule, ONE executor is built
and its gradient reducer swapped between steps: the overlapped per-chunk all-reduce (``on``) and one
all-reduce after the last job (``off``), alternating step by step (on/off, then off/on, ...), a world
barrier before every step, the step time of a step = the slowest rank's. Reported: the medians, the
median of the per-pair ratios on/off, and the reduction wait left at the end of the step (time in the
reducer's ``finish``, slowest rank; with ``off`` that is the whole reduction).

The prediction for the same configuration is fed with measurements of this run: per-chunk F/B/W
(and the P2P latency) fitted from the job logs of the timed steps without overlap
(pipeloom.trace.check.fit_chunk_costs, ms), and a gloo all-reduce link fitted from timed all-reduces
over the dp groups of the sizes the run reduces (both stages' groups at once, as in a step: time =
bytes / bandwidth + 2 * latency for dp 2).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from _harness import median, paired_ratios, round_orders, write_text  # noqa: E402

SCHEDULES = ("1f1b", "interleaved", "zbv")


def _timed_allreduces(dp_group, sizes: list[int], reps: int) -> list[float]:
    """Median seconds (slowest rank) of an all-reduce of ``n`` fp32 elements over ``dp_group``, per size;
    every size runs on all dp groups at once (as the step's reductions do)."""
    import torch
    import torch.distributed as dist

    out = []
    for n in sizes:
        buf = torch.zeros(n)
        dist.all_reduce(buf, group=dp_group)  # warm-up (connection, allocation)
        ts = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf, group=dp_group)
            ts.append(time.perf_counter() - t0)
        t = torch.tensor(ts, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out.append(median(t.tolist()))
    return out


def bench_worker(a: dict) -> dict:
    import torch
    import torch.distributed as dist

    from pipeloom.models.llama import build_chunk_modules, loss_fn
    from pipeloom.runtime.driver import RunConfig, _batch, _groups, _split, model_config, prepare
    from pipeloom.runtime.executor import PipelineExecutor
    from pipeloom.runtime.grads import AllReduceAfterAccumulation, OverlappedAllReduce
    from pipeloom.schedule.io import to_dict
    from pipeloom.trace.writer import JobLog

    rank = dist.get_rank()
    pp_ranks, dp_group, pp_rank, dp_rank = _groups(2, 2, 300.0)
    out: dict = {"times": {}, "finish": {}, "compute": {}, "off_steps": {}, "ratios": {}, "logs": {}, "chunk_params": {}, "stage_params": {}}
    t_start = time.perf_counter()
    for name in a["schedules"]:
        cfg = prepare(RunConfig(schedule=name, pp=2, dp=2, microbatches=a["m"], microbatch_size=1,
                                seq_len=a["seq"], dim=a["dim"], n_layers=a["layers"]))
        sched = cfg.schedule
        mcfg = model_config(cfg, sched.num_chunks)
        mine = sched.chunks_of(pp_rank)
        mods = build_chunk_modules(mcfg, _split(cfg, mcfg, sched.num_chunks), 0, chunks=mine)
        box = [tempfile.mkdtemp(prefix="pipeloom-dpbench-") if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        timed = (1, 1 + 2 * a["pairs"])  # step 0 negotiates shapes; every timed step is logged
        log = JobLog(box[0], rank=rank, local_rank=rank, world_size=4, pp=2, dp=2, pp_rank=pp_rank,
                     dp_rank=dp_rank, schedule=to_dict(sched), costs=None, profile_steps=timed)
        red = {True: OverlappedAllReduce(dp_group, timeout_s=300.0),
               False: AllReduceAfterAccumulation(dp_group, timeout_s=300.0)}
        waits: dict = {True: [], False: []}
        computes: dict = {True: [], False: []}  # time in the job handlers (the compute) per step
        for ov, r in red.items():  # time left in finish(): the reduction not hidden behind the jobs
            def finish(_f=r.finish, _w=waits[ov]):
                t0 = time.perf_counter()
                _f()
                _w.append(time.perf_counter() - t0)
            r.finish = finish
        ex = PipelineExecutor(sched, dict(zip(mine, mods)), loss_fn, pp_rank=pp_rank, pp_ranks=pp_ranks,
                              dp_group=dp_group, timeout_s=300.0, log=log, check=False, reducer=red[False])
        x, y = _batch(mcfg, cfg, sched, 0, dp_rank)

        def step(ov: bool) -> float:
            ex.reducer = red[ov]
            dist.barrier()
            t0 = time.perf_counter()
            ex.step(x, y)
            t = time.perf_counter() - t0
            for p in ex._allp:
                p.grad = None
            computes[ov].append(ex.last_stats.compute_s)
            return t

        step(False)
        for w in (*waits.values(), *computes.values()):
            w.clear()
        seq = []  # on off, off on, on off, ...
        for order in round_orders((True, False), a["pairs"], mirror=True):
            for ov in order:
                seq.append((ov, step(ov)))
        log.close(timed[1] - 1)
        t = torch.tensor([s for _, s in seq], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        ordered = {True: [], False: []}
        for (ov, _), s in zip(seq, t.tolist()):
            ordered[ov].append(s)
        for ov in (True, False):
            w = torch.tensor(waits[ov], dtype=torch.float64)
            dist.all_reduce(w, op=dist.ReduceOp.MAX)
            out["finish"][(name, ov)] = w.tolist()
            c = torch.tensor(computes[ov], dtype=torch.float64)
            dist.all_reduce(c, op=dist.ReduceOp.MAX)
            out["compute"][(name, ov)] = c.tolist()
            out["times"][(name, ov)] = ordered[ov]
        out["ratios"][name] = paired_ratios(ordered[True], ordered[False])
        out["logs"][name] = box[0]
        out["off_steps"][name] = [timed[0] + i for i, (ov, _) in enumerate(seq) if not ov]
        sizes = [0] * sched.num_chunks
        for k, m in zip(mine, mods):
            sizes[k] = sum(p.numel() for p in m.parameters())
        every = [None] * 4
        dist.all_gather_object(every, sizes)
        out["chunk_params"][name] = [max(s[k] for s in every) for k in range(sched.num_chunks)]
        out["stage_params"][name] = max(sum(s) for s in every)
        ex.close()
    # the gloo link: all-reduces of the sizes the runs reduce (a chunk, a stage) and a small one
    chunks = {n for v in out["chunk_params"].values() for n in v}
    sizes = sorted({max(1, min(chunks) // 16), *chunks, max(out["stage_params"].values())})
    out["link_sizes"] = sizes
    out["link_times"] = _timed_allreduces(dp_group, sizes, a["link_reps"])
    out["wall_s"] = time.perf_counter() - t_start
    return out if rank == 0 else None


def fit_link(sizes: list[int], times: list[float]):
    """Fit ``t = bytes / bw + c`` to the timed all-reduces robustly (Theil-Sen: the median of the slopes
    between every two sizes, then the median intercept; one all-reduce slowed by another process on a
    shared machine moves it little). dp 2: a ring all-reduce moves 2 (n-1)/n = 1 x the bytes and takes
    2 (n-1) = 2 latency steps, so latency = c / 2."""
    from pipeloom.sim.dp import DPLink

    b = [4.0 * n for n in sizes]
    slopes = [(times[j] - times[i]) / (b[j] - b[i]) for i in range(len(b)) for j in range(i + 1, len(b))
              if b[j] > 1.05 * b[i]]
    slope = statistics.median(slopes) if slopes else 0.0
    if slope <= 0:  # noise swamped the size dependence: the largest transfer alone
        slope = times[-1] / b[-1]
    c = max(0.0, statistics.median(t - slope * x for x, t in zip(b, times)))
    return DPLink(bandwidth=1.0 / slope, latency=c / 2, unit_s=1e-3)


def local_prediction(res: dict, name: str, link) -> dict:
    from pipeloom.sim.dp import simulate_dp
    from pipeloom.sim.simulate import simulate
    from pipeloom.trace.check import fit_chunk_costs, step_runs
    from pipeloom.trace.reader import read_logs

    run = read_logs(res["logs"][name])
    off = set(res["off_steps"][name])  # the job times of the steps without overlap (compute undisturbed)
    costs = fit_chunk_costs(run, [r for r in step_runs(run, []) if r.step in off])
    sim = simulate(run.schedule, costs)
    nbytes = [4.0 * p for p in res["chunk_params"][name]]
    on = simulate_dp(sim, nbytes, 2, link, overlap=True)
    off = simulate_dp(sim, nbytes, 2, link, overlap=False)
    return {"on": on, "off": off, "makespan": sim.makespan, "costs": costs}


def llama7b_rows() -> list[tuple]:
    """Llama-2 7B, pp 4 x dp 8, 100 Gb/s and 5 us per ring step, fp32 gradients (the runtime's),
    seq 4096, 1 sequence per microbatch, 32 microbatches; F = B = W per layer from FLOPs at 400 TFLOP/s."""
    from pipeloom import api
    from pipeloom.core.costs import Costs
    from pipeloom.memory.analytic import TrainConfig, chunk_memory, layer_params, preset, split_layers
    from pipeloom.sim.dp import DPLink, simulate_dp
    from pipeloom.sim.simulate import simulate

    model = preset("llama2-7b")
    s = 4096
    f_layer_ms = (2 * s * layer_params(model) + 4 * s * s * model.hidden) / 400e12 * 1e3
    rows = []
    for name, vpp in (("1f1b", 1), ("interleaved", 2), ("zbv", 2)):
        nc = 4 * vpp
        per = model.layers / nc * f_layer_ms
        costs = f"F={per:.3f},B={per:.3f},W={per:.3f}"
        sched = api.plan(name, api.make_spec(pp=4, microbatches=32, vpp=vpp, costs=costs))
        sim = simulate(sched, Costs.parse(costs))
        chunks = chunk_memory(model, TrainConfig(dtype="fp32"), split_layers(model.layers, nc))
        nbytes = [4.0 * c.params for c in chunks]
        link = DPLink(bandwidth=100e9 / 8, latency=5e-6, unit_s=1e-3)
        for ov in (False, True):
            r = simulate_dp(sim, nbytes, 8, link, overlap=ov)
            rows.append((name, vpp, ov, sim.makespan, r.dp_time, r.step_time, r.dp_exposed, r.dp_hidden_share))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=10, help="timed on/off step pairs per schedule")
    ap.add_argument("--link-reps", type=int, default=7, help="timed all-reduces per size for the link")
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seq", type=int, default=8, help="tokens per microbatch (1 sequence)")
    ap.add_argument("-m", type=int, default=4, help="microbatches per step")
    ap.add_argument("--schedules", default=",".join(SCHEDULES),
                    help="comma-separated, from: " + ", ".join(SCHEDULES) + " (default: all)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.schedules = [x.strip() for x in args.schedules.split(",") if x.strip()]
    bad = [x for x in args.schedules if x not in SCHEDULES]
    if bad or not args.schedules:
        ap.error(f"--schedules {','.join(bad) or '(none)'}: choose from {', '.join(SCHEDULES)}")
    from pipeloom.runtime.launch import spawn

    load0 = os.getloadavg()[0]
    res = spawn(bench_worker, 4, (dict(schedules=args.schedules, pairs=args.pairs, link_reps=args.link_reps, dim=args.dim,
                                       layers=args.layers, seq=args.seq, m=args.m),), timeout_s=600)
    res["args"] = vars(args)
    load1 = os.getloadavg()[0]
    link = fit_link(res["link_sizes"], res["link_times"])
    ms = lambda v: f"{1e3 * v:.1f}"  # noqa: E731
    lines = ["| schedule | step off (ms) | step on (ms) | on/off (median of pairs) | compute off / on (ms) | "
             "reduction wait off / on (ms) | "
             "measured hidden share | predicted reduction (ms) | predicted step off / on (ms) | predicted on/off | "
             "predicted hidden share |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in args.schedules:
        on, off = (median(res["times"][(name, v)]) for v in (True, False))
        pred = local_prediction(res, name, link)
        pair = median(res["ratios"][name])
        w_on, w_off = (median(res["finish"][(name, v)]) for v in (True, False))
        c_on, c_off = (median(res["compute"][(name, v)]) for v in (True, False))
        p_on, p_off = pred["on"], pred["off"]
        lines.append(f"| {name} | {ms(off)} | {ms(on)} | {pair:.3f} | {ms(c_off)} / {ms(c_on)} | {ms(w_off)} / {ms(w_on)} | "
                     f"{1 - w_on / w_off:.1%} | {p_off.dp_time:.1f} | {p_off.step_time:.1f} / {p_on.step_time:.1f} | "
                     f"{p_on.step_time / p_off.step_time:.3f} | {p_on.dp_hidden_share:.1%} |")
    lines.append("")
    stage = max(res["stage_params"].values())
    lines.append(f"Model: dim {args.dim}, {args.layers} layers, {args.m} microbatches of 1 x {args.seq} tokens; "
                 f"{stage / 1e6:.1f} M parameters per pp stage ({4 * stage / 1e6:.0f} MB of fp32 gradients). "
                 f"Link fitted from all-reduces of "
                 + ", ".join(f"{4 * n / 1e6:.2f} MB: {1e3 * t:.1f} ms" for n, t in zip(res["link_sizes"], res["link_times"]))
                 + f" -> {link.bandwidth / 1e9:.2f} GB/s, latency {1e3 * link.latency:.2f} ms per ring step. "
                 f"{2 * args.pairs} timed steps per schedule; load average {load0:.1f} before, {load1:.1f} after "
                 f"({os.cpu_count()} CPUs); bench wall time {res['wall_s']:.0f} s in the ranks.")
    big = ["| schedule | vpp | overlap | pipeline (ms) | dp reduction (ms) | step (ms) | exposed (ms) | hidden share |",
           "|---|---|---|---|---|---|---|---|"]
    for name, vpp, ov, mk, dpt, st, ex, hs in llama7b_rows():
        big.append(f"| {name} | {vpp} | {'on' if ov else 'off'} | {mk:.0f} | {dpt:.0f} | {st:.0f} | {ex:.0f} | "
                   f"{'-' if hs is None else f'{hs:.1%}'} |")
    cmd = "python bench/dp_overlap.py " + " ".join(sys.argv[1:])
    text = "\n".join(["## pp 2 x dp 2, gloo on CPU (this machine)", "", *lines, "",
                      "## Llama-2 7B, pp 4 x dp 8, 100 Gb/s (simulated)", "", *big, ""])
    print(text)
    if args.out:  # the tables only (docs/bench/dp_overlap.md has them with the reading around them)
        write_text(args.out, f"<!-- {cmd.strip()} -->\n{text}")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
