"""pipeloom runtime vs torch.distributed.pipelining: step time side by side, and measured vs simulated bubble.

Same model (the llama example decoder, same weights), same schedule, same microbatches, same
ranks: every pair is measured in ONE process group, alternating a pipeloom step and a torch step
so machine noise hits both alike. Reported: median step time of each (slowest rank, barrier to
barrier) and their ratio. The timed steps run with pipeloom's job log off (torch has none); the
bubble columns come from ``--log-steps`` further steps, same alternation, with the log on. For the
multi-stage pairs pipeloom executes torch's own ``pipeline_order`` (``--builder-orders``: pipeloom's
builders of the same name instead, whose orders can differ, e.g. zbv), so both run one schedule.

Bubble check: from pipeloom's own job log, where every job has its share of its rank's time
``[ready, done]`` (input in hand .. outputs handed to the transport; gaps between them are waits
for a peer, see docs/bench/runtime.md), the measured bubble of a step is
``1 - sum(done - ready) / (pp * (last done - first ready))``; the simulated bubble is what
:func:`pipeloom.sim.simulate.simulate` predicts for the same schedule with per-chunk F, B, W
costs set to the measured means of ``done - ready`` (BW split half/half into B and W), once with
comm = 0 and once with comm = the fitted edge latency (mean of consumer ready - producer done
over the cross-device edges where the consumer really waited). The compute-only bubble (jobs
as ``[start, end]``) is printed too.

    python bench/runtime_vs_torch.py [--pp 2] [--microbatches 8] [--steps 6] [--log-steps 10]
                                     [--builder-orders [--calibrate]] [--only NAME ...] [--json]

``--calibrate``: before timing, run pipeloom on torch's order for a few logged steps, measure every
chunk's F, B, W and the comm latency, and plan pipeloom's cost-aware builders (zbv) with them at a
memory limit equal to the simulated peak of torch's order.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

from _harness import median, round_orders, timed
from pipeloom.schedule import io as schedule_io

PAIRS = [  # (torch schedule class, pipeloom registry name, vpp)
    ("ScheduleGPipe", "fthenb", 1),
    ("Schedule1F1B", "1f1b", 1),
    ("ScheduleInterleaved1F1B", "interleaved", 2),
    ("ScheduleZBVZeroBubble", "zbv", 2),
]


def _worker(opts: dict) -> list[dict] | None:
    import torch
    import torch.distributed as dist
    import torch.distributed.pipelining as tpp

    from pipeloom import api
    from pipeloom.models.llama import LlamaConfig, build_chunk_modules, even_layer_split, loss_fn, synthetic_batch
    from pipeloom.runtime.executor import PipelineExecutor
    from pipeloom.trace.writer import JobLog

    rank, pp = dist.get_rank(), dist.get_world_size()
    if opts.get("pin"):
        _pin(rank)
    m, steps, warm, logged = opts["microbatches"], opts["steps"], 2, opts["log_steps"]
    rows = []
    for tname, pname, vpp in PAIRS:
        if opts["only"] and pname not in opts["only"]:
            continue
        sched = api.plan(pname, api.make_spec(pp=pp, microbatches=m, vpp=vpp))
        nc = sched.num_chunks
        cfg = LlamaConfig(n_layers=max(opts["layers"], nc), dim=opts["dim"], max_seq_len=opts["seq"],
                          n_heads=opts["heads"], n_kv_heads=opts["heads"] // 2)
        split = even_layer_split(cfg.layers, nc)
        mine = sched.chunks_of(rank)
        x, y = synthetic_batch(cfg, m * opts["mbs"], opts["seq"], seed=1)
        xs, ys = list(x.chunk(m)), list(y.chunk(m))
        # torch.distributed.pipelining on the same chunks (stage index = global chunk id)
        tmods = build_chunk_modules(cfg, split, 0, chunks=mine)
        stages = [tpp.PipelineStage(mod, k, nc, torch.device("cpu")) for k, mod in zip(mine, tmods)]
        cls = getattr(tpp, tname)
        tsched = cls(stages[0] if vpp == 1 else stages, n_microbatches=m, loss_fn=loss_fn)
        has_first, has_last = 0 in mine, nc - 1 in mine
        order = "pipeloom builder"
        calib = None
        if opts["calibrate"] and opts["builder_orders"] and pname in COST_AWARE:
            # measure per-chunk F, B, W and the comm latency on torch's own order, then plan
            # pipeloom's builder with them at a memory limit no higher than torch's order's peak
            sched, calib = _calibrated_plan(pname, tsched.pipeline_order, sched, tname, cfg, split, mine, xs, ys,
                                            os.path.join(opts["log_root"], pname + "-calibrate"), opts)
            order = "pipeloom builder, planned with measured costs"
        elif vpp > 1 and not opts["builder_orders"]:
            # multi-stage torch schedules execute their own pipeline_order, which need not equal
            # pipeloom's builder of the same name (ZBV does not): run exactly torch's order here
            sched = _torch_order(tsched.pipeline_order, sched, tname)
            order = "torch's pipeline_order"
        # pipeloom
        log_dir = os.path.join(opts["log_root"], pname)
        log = JobLog(log_dir, rank=rank, local_rank=rank, world_size=pp, pp=pp, dp=1, pp_rank=rank, dp_rank=0,
                     schedule=schedule_io.to_dict(sched), costs=None,
                     profile_steps=(warm + steps, warm + steps + logged))
        ex = PipelineExecutor(sched, dict(zip(mine, build_chunk_modules(cfg, split, 0, chunks=mine))), loss_fn,
                              pp_rank=rank, pp_ranks=list(range(pp)), log=log)

        def torch_step():
            losses = []
            if has_first and has_last:
                tsched.step(x, target=y, losses=losses)
            elif has_first:
                tsched.step(x)
            elif has_last:
                tsched.step(target=y, losses=losses)
            else:
                tsched.step()
            for mod in tmods:
                mod.zero_grad(set_to_none=True)

        def pl_step():
            ex.step(xs if has_first else None, ys if has_last else None)
            for mod in ex.modules.values():
                mod.zero_grad(set_to_none=True)

        tp, tt = [], []
        # timed steps with the job log off (torch runs without one); then `logged` more steps, same
        # alternation, with pipeloom's job log on, for the bubble columns
        fns, acc = {"pipeloom": pl_step, "torch": torch_step}, {"pipeloom": tp, "torch": tt}
        for i, order in enumerate(round_orders(list(fns), warm + steps + logged)):
            for name in order:
                dist.barrier()
                t = timed(lambda: (fns[name](), dist.barrier()))
                if warm <= i < warm + steps:
                    acc[name].append(t)
        log.close(warm + steps + logged - 1)
        dist.barrier()
        if rank == 0:
            meas, sim0, sim, comm, meas_c, rep = _bubbles(log_dir, pp, sched, warm + steps, logged)
            rows.append({"schedule": pname, "torch_schedule": tname, "pp": pp, "vpp": vpp, "microbatches": m,
                         "order": order,
                         "pipeloom_s": median(tp), "torch_s": median(tt), "ratio": median(tp) / median(tt),
                         "bubble_measured": meas, "bubble_measured_compute_only": meas_c, "bubble_replayed": rep,
                         "bubble_simulated": sim, "bubble_simulated_comm0": sim0,
                         "comm_fitted_s": comm} | ({"calibration": calib} if calib else {}))
        del ex, tsched, stages
    return rows if rank == 0 else None


def _pin(rank: int) -> None:
    """Pin every thread of this rank's process (the compute thread and gloo's I/O threads, which
    exist already) to one core, rank r on core r mod ncpu; threads started later inherit it."""
    cpus = sorted(os.sched_getaffinity(0))
    core = {cpus[rank % len(cpus)]}
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), core)
        except OSError:
            pass


COST_AWARE = ("zbv",)  # pipeloom builders whose order depends on the costs (interleaved's does not)


def _calibrated_plan(pname: str, pipeline_order: dict, like, tname: str, cfg, split, mine, xs, ys, log_dir: str,
                     opts: dict):
    """Run pipeloom on torch's order (its F, B, W jobs) for a few logged steps, take every chunk's
    mean F, B, W (job spans ``[ready, done]``, as the bubble check) and the fitted comm latency,
    and plan pipeloom's ``pname`` with them at a memory limit equal to the simulated peak of torch's
    order (pipeloom's memory model, same units). Rank 0 plans; every rank gets the schedule."""
    import torch.distributed as dist

    from pipeloom import api
    from pipeloom.models.llama import build_chunk_modules, loss_fn
    from pipeloom.runtime.executor import PipelineExecutor
    from pipeloom.trace.writer import JobLog
    from pipeloom.core.costs import Costs
    from pipeloom.sim.simulate import simulate

    rank, pp = dist.get_rank(), dist.get_world_size()
    torder = _torch_order(pipeline_order, like, tname)
    warm, steps = 2, opts["calibrate_steps"]
    log = JobLog(log_dir, rank=rank, local_rank=rank, world_size=pp, pp=pp, dp=1, pp_rank=rank, dp_rank=0,
                 schedule=schedule_io.to_dict(torder), costs=None, profile_steps=(warm, warm + steps))
    ex = PipelineExecutor(torder, dict(zip(mine, build_chunk_modules(cfg, split, 0, chunks=mine))), loss_fn,
                          pp_rank=rank, pp_ranks=list(range(pp)), log=log)
    nc = torder.num_chunks
    for _ in range(warm + steps):
        ex.step(xs if 0 in mine else None, ys if nc - 1 in mine else None)
        for mod in ex.modules.values():
            mod.zero_grad(set_to_none=True)
    log.close(warm + steps - 1)
    dist.barrier()
    box = [None]
    if rank == 0:
        F, B, W, comm = _chunk_costs(log_dir, pp, torder, warm, steps)
        costs = Costs(F=F, B=B, W=W, comm=comm)
        unit = 1e-3  # plan in ms
        costs_ms = Costs(F=[f / unit for f in F], B=[b / unit for b in B], W=[w / unit for w in W], comm=comm / unit)
        tres = simulate(torder, costs)
        limit = max(tres.peak_memory)
        planned = api.plan(pname, api.make_spec(pp=like.pp, microbatches=like.microbatches, vpp=like.vpp,
                                                costs=costs_ms, mem_limit=float(limit)))
        pres = simulate(planned, costs)
        default = simulate(like, costs)  # the builder's order with its default (unit) costs
        box[0] = {"schedule": schedule_io.to_dict(planned),
                  "info": {"F_ms": [round(f / unit, 3) for f in F], "B_ms": [round(b / unit, 3) for b in B],
                           "W_ms": [round(w / unit, 3) for w in W], "comm_ms": round(comm / unit, 3),
                           "mem_limit_units": limit, "peak_planned": max(pres.peak_memory),
                           "sim_torch_order_s": tres.makespan, "sim_planned_s": pres.makespan,
                           "sim_default_costs_order_s": default.makespan}}
    dist.broadcast_object_list(box, src=0)
    del ex
    return schedule_io.from_dict(box[0]["schedule"]), box[0]["info"]


def _chunk_costs(log_dir: str, pp: int, sched, warm: int, steps: int):
    """Per-chunk mean F, B, W (seconds, jobs as [ready, done]; a BW split half/half) and the
    fitted comm latency from pipeloom's job logs of steps warm..warm+steps-1."""
    jobs = []
    for r in range(pp):
        with open(os.path.join(log_dir, f"workerlog.{r}")) as f:
            jobs += [j for j in map(json.loads, f) if j["event"] == "job"]
    jobs = [j for j in jobs if warm <= j["step"] < warm + steps]
    dur: dict[tuple[str, int], list[float]] = {}
    for j in jobs:
        a, b = _span(j)
        dur.setdefault((j["kind"], j["chunk"]), []).append(b - a)
    mean = {k: statistics.fmean(v) for k, v in dur.items()}
    nc = sched.num_chunks
    F = tuple(mean[("F", k)] for k in range(nc))
    B = tuple(mean.get(("B", k), mean.get(("BW", k), 0.0) / 2) for k in range(nc))
    W = tuple(mean.get(("W", k), mean.get(("BW", k), 0.0) / 2) for k in range(nc))
    return F, B, W, _fit_comm(jobs, sched, warm, steps)


def _torch_order(pipeline_order: dict, like, tname: str):
    """torch's per-rank action lists as a pipeloom Schedule (same placement as ``like``):
    F -> F, I (input grad) -> B, W -> W, B (full backward) -> BW; stage index = global chunk."""
    from pipeloom.core.torch_kinds import KIND_OF_LETTER
    from pipeloom.schedule.validate import validate

    kinds = {letter: kind.value for letter, kind in KIND_OF_LETTER.items()}
    devices = []
    for r in range(like.pp):
        seq = []
        for a in pipeline_order[r]:
            if a is None or a.computation_type.value not in kinds:
                continue
            seq.append(f"{kinds[a.computation_type.value]}{a.microbatch_index}.{a.stage_index}")
        devices.append(seq)
    sched = schedule_io.from_dict({"name": f"torch-{tname}", "pp": like.pp, "vpp": like.vpp,
                                "microbatches": like.microbatches, "placement": like.placement.value,
                                "devices": devices})
    bad = validate(sched)
    if bad:
        raise ValueError(f"torch's {tname} order is not a valid pipeloom schedule: {bad[0]}")
    return sched


def _span(j: dict) -> tuple[float, float]:
    """A job's share of its rank's time: [ready, done] (input in hand .. outputs handed over),
    falling back to the compute-only [start, end] for logs without them (GPU timers)."""
    return j.get("ready", j["start"]), j.get("done", j["end"])


def _bubbles(log_dir: str, pp: int, sched, warm: int, steps: int) -> tuple[float, ...]:
    """Median measured bubble over the logged steps (jobs as [ready, done], and compute-only for
    reference) and the simulated bubble with the measured per-chunk costs (comm 0 and fitted)."""
    from pipeloom.core.costs import Costs
    from pipeloom.sim.simulate import simulate

    jobs = []
    for r in range(pp):
        with open(os.path.join(log_dir, f"workerlog.{r}")) as f:
            jobs += [j for j in map(json.loads, f) if j["event"] == "job"]
    per_step, per_step_compute = [], []
    for s in range(warm, warm + steps):
        js = [j for j in jobs if j["step"] == s]
        span = max(_span(j)[1] for j in js) - min(_span(j)[0] for j in js)
        busy = sum(_span(j)[1] - _span(j)[0] for j in js)
        per_step.append(1 - busy / (pp * span))
        span_c = max(j["end"] for j in js) - min(j["start"] for j in js)
        per_step_compute.append(1 - sum(j["end"] - j["start"] for j in js) / (pp * span_c))
    F, B, W, comm = _chunk_costs(log_dir, pp, sched, warm, steps)  # per chunk (so per rank), and the latency
    # diagnostic: the same steps replayed with each job's OWN measured duration (not the per-chunk
    # mean); the difference to the mean-cost simulation is what job-to-job variation costs
    from pipeloom.sim.replay import replay

    replayed = []
    for s in range(warm, warm + steps):
        by = {(j["kind"], j["mb"], j["chunk"]): j for j in jobs if j["step"] == s}
        durs = [[_span(by[(jb.kind.value, jb.mb, jb.chunk)])[1] - _span(by[(jb.kind.value, jb.mb, jb.chunk)])[0]
                 for jb in seq] for seq in sched.devices]
        rp = replay(sched, durs, comm=comm)
        replayed.append(1 - sum(map(sum, durs)) / (pp * rp.makespan))
    res0 = simulate(sched, Costs(F=F, B=B, W=W))
    res = simulate(sched, Costs(F=F, B=B, W=W, comm=comm))
    return (median(per_step), res0.bubble, res.bubble, comm, median(per_step_compute), median(replayed))


def _fit_comm(jobs: list[dict], sched, warm: int, steps: int) -> float:
    """Mean latency of the cross-device edges where the consumer really waited for its producer:
    consumer ready - producer done (clipped at 0), over the jobs whose ready came after their rank's
    previous done (the only blocking call between two jobs is the wait for the job's own network
    input). The mean, not the median: the simulator adds this one constant on every cross-device
    edge, so it must stand for the expected delay, and on a shared CPU the delay is heavy-tailed
    (most hand-offs ~0.01 ms, one in ten 0.4-1.5 ms: a sleeping consumer thread is woken late)."""
    from pipeloom.runtime.commplan import needed
    from pipeloom.core.ir import Job, Kind

    lat = []
    for s in range(warm, warm + steps):
        js = [j for j in jobs if j["step"] == s]
        by = {(j["kind"], j["mb"], j["chunk"]): j for j in js}
        for d in range(sched.pp):
            prev = None
            for j in sorted((j for j in js if j["device"] == d), key=lambda j: _span(j)[0]):
                job = Job(Kind(j["kind"]), j["mb"], j["chunk"])
                n = needed(job, sched)
                if n is not None and n[1] != d:
                    msg = n[0]
                    src = by.get(("F", msg.mb, msg.chunk)) if msg.kind == "act" else (
                        by.get(("B", msg.mb, msg.chunk)) or by.get(("BW", msg.mb, msg.chunk)))
                    if src is not None and (prev is None or _span(src)[1] > prev):
                        lat.append(max(0.0, _span(j)[0] - _span(src)[1]))
                prev = _span(j)[1]
    return statistics.fmean(lat) if lat else 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6, help="timed steps per schedule (after 2 warm-up)")
    ap.add_argument("--log-steps", type=int, default=10,
                    help="further steps with pipeloom's job log on, for the bubble columns (not timed)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--mbs", type=int, default=4, help="sequences per microbatch")
    ap.add_argument("--only", nargs="*", default=None, help="pipeloom schedule names to run (default: all)")
    ap.add_argument("--builder-orders", action="store_true",
                    help="run pipeloom's own builders (interleaved, zbv) instead of torch's exact order")
    ap.add_argument("--calibrate", action="store_true",
                    help="with --builder-orders: plan pipeloom's cost-aware builders (zbv) with per-chunk costs "
                         "measured on torch's order, at a memory limit no higher than that order's peak")
    ap.add_argument("--calibrate-steps", type=int, default=6, help="logged pipeloom steps for --calibrate")
    ap.add_argument("--pin", action="store_true",
                    help="pin each rank (all its threads) to its own core: rank r on core r mod ncpu")
    ap.add_argument("--keep-logs", metavar="DIR", default=None,
                    help="write pipeloom's per-rank job logs under DIR/<schedule>/ and keep them (default: a "
                         "temporary directory); `pipeloom show`/`pipeloom check` read them")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.calibrate and not a.builder_orders:
        ap.error("--calibrate plans pipeloom's own builders: use it with --builder-orders")
    from pipeloom.runtime.launch import spawn

    with tempfile.TemporaryDirectory() as tmp:
        root = a.keep_logs or tmp
        os.makedirs(root, exist_ok=True)
        opts = dict(vars(a), log_root=os.path.abspath(root))
        rows = spawn(_worker, a.pp, (opts,), timeout_s=300)
    if a.json:
        print(json.dumps([{k: r[k] for k in ("schedule", "pp", "microbatches", "pipeloom_s", "torch_s")} | r
                          for r in rows], indent=1))
        return 0
    print(f"pp={a.pp} microbatches={a.microbatches} dim={a.dim} layers={a.layers} seq={a.seq} "
          f"mbs={a.mbs} steps={a.steps} log-steps={a.log_steps} (CPU, gloo, 1 thread per rank); pipeloom runs "
          + (("its own builders' orders" + (" (cost-aware ones planned with measured costs)" if a.calibrate else ""))
             if a.builder_orders else "torch's exact order (vpp > 1: its pipeline_order)"))
    print("| pipeloom | torch.distributed.pipelining | pipeloom s | torch s | ratio | bubble measured | "
          "bubble simulated (comm 0) | fitted comm ms | bubble simulated (fitted comm) | |meas - sim| / meas | "
          "bubble replayed (per-job durations) | bubble measured (compute only) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "calibration" in r:
            c = r["calibration"]
            print(f"<!-- {r['schedule']}: planned with per-chunk F {c['F_ms']} B {c['B_ms']} W {c['W_ms']} ms, comm "
                  f"{c['comm_ms']} ms, memory limit {c['mem_limit_units']:g} units (torch order's peak), planned peak "
                  f"{c['peak_planned']:g}; simulated step: torch's order {1000 * c['sim_torch_order_s']:.1f} ms, planned "
                  f"{1000 * c['sim_planned_s']:.1f} ms, default-cost build {1000 * c['sim_default_costs_order_s']:.1f} ms -->")
    for r in rows:
        rel = abs(r["bubble_measured"] - r["bubble_simulated"]) / r["bubble_measured"] if r["bubble_measured"] else 0.0
        print(f"| {r['schedule']} (vpp {r['vpp']}) | {r['torch_schedule']} | {r['pipeloom_s']:.4f} | "
              f"{r['torch_s']:.4f} | {r['ratio']:.2f} | {100 * r['bubble_measured']:.1f}% | "
              f"{100 * r['bubble_simulated_comm0']:.1f}% | {1000 * r['comm_fitted_s']:.2f} | "
              f"{100 * r['bubble_simulated']:.1f}% | {100 * rel:.0f}% | {100 * r['bubble_replayed']:.1f}% | "
              f"{100 * r['bubble_measured_compute_only']:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
