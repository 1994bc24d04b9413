"""Overlapped data-parallel gradient reduction: measured step time with and without overlap (pp 2 x dp 2,
gloo on CPU, the two settings alternating in ONE process group), and the simulator's predicted hidden
share (pipeloom.sim.dp) for that run and for Llama-2 7B pp 4 x dp 8 on a 100 Gb/s link.

    python bench/dp_overlap.py [--reps 5] [--steps 4] [--dim 256] [--out TABLE.md]

For the local prediction the costs are fitted from a logged run of the same config
(pipeloom.trace.check.fit_chunk_costs, ms) and the link from a timed all-reduce of one stage's
gradient buffer over the dp group (effective bandwidth, ring formula inverted).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

SCHEDULES = ("1f1b", "zbv")


def bench_worker(args_d: dict) -> dict:
    import torch
    import torch.distributed as dist

    from pipeloom.runtime.driver import RunConfig, _groups, model_config, prepare, worker
    from pipeloom.models.llama import build_chunk_modules
    from pipeloom.models.slicing import even_layer_split

    out: dict = {"times": {}, "logs": {}}
    base = dict(pp=2, dp=2, microbatches=args_d["m"], microbatch_size=2, seq_len=32, dim=args_d["dim"],
                n_layers=8, steps=args_d["steps"])
    for sched in SCHEDULES:
        for rep in range(args_d["reps"]):
            for ov in ((True, False) if rep % 2 == 0 else (False, True)):  # alternate which goes first
                r = worker(RunConfig(schedule=sched, overlap_grad_reduce=ov, **base))
                if r is not None:
                    out["times"].setdefault((sched, ov), []).append(r["step_time_s"])
        # one logged run (no overlap) to fit per-chunk costs for the simulator
        box = [tempfile.mkdtemp(prefix="pipeloom-dpbench-") if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        worker(RunConfig(schedule=sched, overlap_grad_reduce=False, log_dir=box[0], profile_steps="1:3",
                         **dict(base, steps=3)))
        out["logs"][sched] = box[0]
    # effective dp bandwidth: all-reduce of one stage's fp32 gradient buffer over the dp group
    cfg = prepare(RunConfig(schedule="1f1b", **base))
    mcfg = model_config(cfg, cfg.schedule.num_chunks)
    split = even_layer_split(mcfg.layers, cfg.schedule.num_chunks)
    _, dp_group, pp_rank, _ = _groups(2, 2)
    mods = build_chunk_modules(mcfg, split, 0, chunks=[pp_rank])
    n = sum(p.numel() for m in mods for p in m.parameters())
    buf = torch.zeros(n)
    ts = []
    for _ in range(7):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf, group=dp_group)
        ts.append(time.perf_counter() - t0)
    t = torch.tensor([statistics.median(ts), float(n)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["allreduce_s"], out["stage_params_max"] = t[0].item(), int(t[1].item())
    out["chunk_params"] = [sum(p.numel() for p in m.parameters()) for m in
                           build_chunk_modules(mcfg, split, 0)]
    return out if dist.get_rank() == 0 else None


def local_prediction(res: dict, sched_name: str, args) -> dict:
    from pipeloom import api
    from pipeloom.trace.check import fit_chunk_costs
    from pipeloom.trace.reader import read_logs
    from pipeloom.runtime.driver import RunConfig, prepare
    from pipeloom.sim.dp import DPLink, simulate_dp
    from pipeloom.sim.simulate import simulate

    costs = fit_chunk_costs(read_logs(res["logs"][sched_name]))
    cfg = prepare(RunConfig(schedule=sched_name, pp=2, dp=2, microbatches=args.m))
    sched = cfg.schedule
    sim = simulate(sched, costs)
    # ring all-reduce of B bytes over 2 ranks moves 2(n-1)/n B = B: effective bandwidth = B / t
    nbytes = 4.0 * res["stage_params_max"]
    bw = nbytes / res["allreduce_s"]
    per_chunk = [4.0 * p for p in res["chunk_params"]]
    per_chunk = per_chunk if len(per_chunk) == sched.num_chunks else [sum(per_chunk) / sched.num_chunks] * sched.num_chunks
    link = DPLink(bandwidth=bw, latency=0.0, unit_s=1e-3)
    on = simulate_dp(sim, per_chunk, 2, link, overlap=True)
    off = simulate_dp(sim, per_chunk, 2, link, overlap=False)
    return {"on": on, "off": off, "bw": bw, "makespan": sim.makespan}


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
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("-m", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from pipeloom.runtime.launch import spawn

    res = spawn(bench_worker, 4, (dict(reps=args.reps, steps=args.steps, dim=args.dim, m=args.m),), timeout_s=300)
    lines = ["| schedule | overlap | step time (median of reps, ms) | ratio on/off | predicted hidden share | "
             "predicted step on/off |", "|---|---|---|---|---|---|"]
    for sched in SCHEDULES:
        on, off = (statistics.median(res["times"][(sched, v)]) for v in (True, False))
        pred = local_prediction(res, sched, args)
        ratio_pred = pred["on"].step_time / pred["off"].step_time
        lines.append(f"| {sched} | on | {1e3 * on:.1f} | {on / off:.3f} | "
                     f"{pred['on'].dp_hidden_share:.1%} | {ratio_pred:.3f} |")
        lines.append(f"| {sched} | off | {1e3 * off:.1f} | | {pred['off'].dp_hidden_share:.1%} | |")
    lines.append("")
    lines.append(f"Measured dp all-reduce of one stage's gradients: {1e3 * res['allreduce_s']:.2f} ms for "
                 f"{4 * res['stage_params_max'] / 1e6:.2f} MB (effective {pred['bw'] / 1e9:.2f} GB/s), "
                 f"used as the simulator's link.")
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
        with open(args.out, "w") as fh:
            fh.write(f"<!-- {cmd.strip()} -->\n{text}")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
