"""pipeloom's plans against torch's built-in schedules, all run by torch's own runtime (gloo, CPU, pp 2).

    python bench/torch_runtime_plans.py [--rounds 9] [--hidden 384] [--profile-steps 3] [--quantile 0.5]

Per case (m = 8 and 16; chunks of equal cost, or a last chunk made heavier by a vocabulary head with the
loss), these schedules step the same model (each on its own copy) in the same two processes:

* torch's ``ScheduleZBVZeroBubble`` (V placement, B/W split) and ``ScheduleInterleaved1F1B`` (looped placement);
* pipeloom's ``zbv`` planned for torch's runtime and loaded with
  :func:`pipeloom.integrations.torch.build_torch_schedule` (every receive posted first);
* the same plan with torch's own send/recv lowering (``recvs="torch"``): what loading its compute-only CSV
  gives (torchtitan's route);
* with ``--torch-early``, also torch's ZBV order with every receive posted first (not a built-in: it tells
  whether a gain comes from the order or from the lowering);
* pipeloom's plan a second time, on its own model copy, stepped like the others (an A/A control: two copies of
  one plan have measured up to 7% apart in one run on the shared 2-core machine, so a difference between
  schedules smaller than the control's is not one this run can resolve).

Calibration, in the same processes before timing: torch's ZBV steps ``--profile-steps`` times under
``torch.profiler``; :func:`pipeloom.integrations.torch_calibrate.profile_costs` reads the per-action costs as
torch's runtime ran them (stage 0's I a no-op, its W the full backward, sends included, waits excluded) and the
transfer latency; ``zbv`` is planned from those, with the memory model measured per chunk (``a``: the bytes
autograd saves for one microbatch's forward; ``b``: the part torch's own I frees) and its limit set to the peak
of torch's ZBV order under that model (torch's order read with ``torch_builtin``, simulated by pipeloom). What
each W leaves saved until the step ends (``kept``, measured the same way) is not in that model: where the plan's
peak counted with it (``peak_with_retention``) is above torch's order's, the plan's jobs are moved
(:func:`pipeloom.schedule.search.reorder.reorder`, the peak first, then the makespan) until it is not; failing that, the
limit is tightened and the plan made again.

Step time: median over rounds of the slowest rank's wall time (barrier before and after), the schedules
alternating step by step, the order rotated each round. In-flight activations: the peak bytes autograd keeps
saved on a rank during one step (saved-tensor hooks), the larger of the two ranks. "simulated": each order's
makespan in pipeloom's simulator under the profiled costs (the model's view of the same step).
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining import schedules as ts  # noqa: E402
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight  # noqa: E402

from pipeloom.core.costs import MemModel  # noqa: E402
from pipeloom.integrations.torch import build_torch_schedule, torch_builtin  # noqa: E402
from pipeloom.core.errors import ScheduleError  # noqa: E402
from pipeloom.integrations.torch_calibrate import peak_with_retention, profile_costs  # noqa: E402
from pipeloom.memory.traced import SavedBytes  # noqa: E402
from pipeloom.runtime.launch import spawn  # noqa: E402
from pipeloom.schedule import io as schedule_io  # noqa: E402
from pipeloom.schedule.planning import evaluate, make_spec, plan  # noqa: E402
from pipeloom.schedule.search.reorder import reorder  # noqa: E402
from pipeloom.schedule.validate import validate  # noqa: E402
from pipeloom.sim.simulate import simulate  # noqa: E402

PP, VPP, ROWS, LAYERS_PER_CHUNK, VOCAB = 2, 2, 32, 2, 6144


class Head(nn.Module):
    """The last chunk of the uneven model: its layers, then a vocabulary projection (the loss is the CE)."""

    def __init__(self, body: nn.Module, hidden: int):
        super().__init__()
        self.body, self.proj = body, nn.Linear(hidden, VOCAB)

    def forward(self, x):
        return self.proj(self.body(x))


def make_chunks(hidden: int, heavy_last: bool) -> list[nn.Module]:
    torch.manual_seed(0)
    chunks: list[nn.Module] = []
    for c in range(PP * VPP):
        body = nn.Sequential(*[m for _ in range(LAYERS_PER_CHUNK) for m in (nn.Linear(hidden, hidden), nn.GELU())])
        chunks.append(Head(body, hidden) if heavy_last and c == PP * VPP - 1 else body)
    return chunks


def loss_fn(heavy_last: bool):
    if heavy_last:
        return lambda out, target: nn.functional.cross_entropy(out, target)
    return lambda out, target: nn.functional.mse_loss(out, target)


def data(m: int, hidden: int, heavy_last: bool):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(m * ROWS, hidden, generator=g)
    y = torch.randint(0, VOCAB, (m * ROWS,), generator=g) if heavy_last else torch.randn(m * ROWS, hidden, generator=g)
    return x, y


def memory_model(hidden: int, heavy_last: bool) -> tuple[MemModel, list[float]]:
    """The memory model of torch's runtime, measured: the bytes (MiB) autograd saves for one microbatch's forward
    of each chunk (``a``), and the part of them torch's own I (``stage_backward_input``) frees (``b``: the saved
    tensors of ops without weights, e.g. the loss's softmax; 0 for the first chunk, whose I torch skips: its W
    runs the whole backward); and what stays saved after torch's W (``stage_backward_weight``), per chunk (the
    memory model has no term for it; see ``peak_with_retention``)."""
    torch.set_num_threads(1)
    chunks = make_chunks(hidden, heavy_last)
    x, y = data(1, hidden, heavy_last)
    lf = loss_fn(heavy_last)
    act, freed, kept = [], [], []
    for c, mod in enumerate(chunks):
        last = c == len(chunks) - 1
        with SavedBytes() as saved:
            inp = x.clone().requires_grad_(True)
            out = mod(inp)
            if last:
                out = lf(out, y)
            act.append(saved.now / 2**20)
            grads, groups = stage_backward_input([out], None if last else [torch.ones_like(out)], [inp],
                                                 mod.parameters())
            del out
            gc.collect()
            freed.append(0.0 if c == 0 else act[-1] - saved.now / 2**20)
            stage_backward_weight(mod.parameters(), groups)
            del grads, groups
            gc.collect()
            kept.append(saved.now / 2**20)
    return MemModel(a=tuple(act), b=tuple(freed)), kept


def plan_for_torch(m: int, costs, mem: MemModel, kept: list):
    """(pipeloom's ``zbv`` plan, torch's ZBV order) at pp 2: the plan at torch's ZBV peak under ``mem``, and no
    more than torch's order holds counted with what the W's leave saved until the step ends (``kept``). A plan
    over that is moved job by job (``reorder``, timed by the simulator) until it is not; failing that, its limit
    is tightened and it is made again."""
    torch_zbv = torch_builtin("ZBVZeroBubble", PP, m, VPP)
    limit = max(evaluate(torch_zbv, make_spec(pp=PP, microbatches=m, vpp=VPP, costs=costs, mem=mem))["peak_memory"])
    target = max(peak_with_retention(torch_zbv, mem, kept))
    retention = lambda sch: peak_with_retention(sch, mem, kept)  # noqa: E731
    step_down = max(max(kept), 0.01 * limit)
    s = None
    for _ in range(8):
        try:
            cand = plan("zbv", make_spec(pp=PP, microbatches=m, vpp=VPP, costs=costs, mem=mem, mem_limit=limit))
        except ScheduleError:
            break
        if max(retention(cand)) > target + 1e-9:
            moved = reorder(cand, costs, mem, limit=target, peak=retention)
            if not validate(moved, mem=mem, mem_limit=limit):  # (and within the model's limit)
                cand = moved
        s = cand
        if max(retention(cand)) <= target + 1e-9:
            break
        limit -= step_down
    return s, torch_zbv


def _stages(chunks, mine):
    return [PipelineStage(chunks[c], c, PP * VPP, torch.device("cpu")) for c in mine]


def _builtin(name: str, m: int, hidden: int, heavy_last: bool):
    """(runtime, first, last, chunks) of one of torch's classes on this rank, on its own model copy."""
    rank = dist.get_rank()
    nst = PP * VPP
    chunks = make_chunks(hidden, heavy_last)
    mine = [rank, nst - 1 - rank] if name == "ZBVZeroBubble" else [rank, rank + PP]  # V / looped placement
    cls = ts.ScheduleZBVZeroBubble if name == "ZBVZeroBubble" else ts.ScheduleInterleaved1F1B
    return cls(_stages(chunks, mine), m, loss_fn=loss_fn(heavy_last)), 0 in mine, nst - 1 in mine, chunks


def _ours(plan_dict: dict, hidden: int, heavy_last: bool, recvs: str):
    """A pipeloom schedule (dict form) loaded into torch's runtime with build_torch_schedule."""
    s = schedule_io.from_dict(plan_dict)
    chunks = make_chunks(hidden, heavy_last)
    mine = list(s.chunks_of(dist.get_rank()))
    rt = build_torch_schedule(s, _stages(chunks, mine), loss_fn(heavy_last), recvs=recvs)
    return rt, 0 in mine, PP * VPP - 1 in mine, chunks


OURS, OURS_CSV = "pipeloom zbv (runtime torch)", "pipeloom zbv, torch's lowering (compute-only CSV)"
TORCH_EARLY = "torch ZBV's order, receives first (not a built-in)"
CONTROL = "pipeloom zbv again, its own model copy (A/A control)"


def _bench_rank(m: int, hidden: int, heavy_last: bool, rounds: int, mem: MemModel, kept: list, profile_steps: int,
                trace_dir: str, quantile: float, with_torch_early: bool):
    torch.set_num_threads(1)
    rank = dist.get_rank()
    x, y = data(m, hidden, heavy_last)

    def step(rt, first, last, chunks):
        for mod in chunks:
            mod.zero_grad(set_to_none=True)
        rt.step(*((x,) if first else ()), **({"target": y, "losses": []} if last else {}))

    runs = {"torch ZBVZeroBubble": _builtin("ZBVZeroBubble", m, hidden, heavy_last),
            "torch Interleaved1F1B": _builtin("Interleaved1F1B", m, hidden, heavy_last)}
    # 1. calibrate: torch's own ZBV order, profiled in torch's runtime on these processes
    zbv = runs["torch ZBVZeroBubble"]
    step(*zbv)
    for it in range(profile_steps):
        dist.barrier()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step(*zbv)
        d = os.path.join(trace_dir, f"iteration_{it}")
        os.makedirs(d, exist_ok=True)
        prof.export_chrome_trace(os.path.join(d, f"rank{rank}_trace.json"))
    dist.barrier()
    # 2. plan zbv from those costs (rank 0), at torch ZBV's peak under the same memory model
    box = [None]
    if rank == 0:
        measured = profile_costs(trace_dir, quantile=quantile)
        s, torch_zbv = plan_for_torch(m, measured.costs, mem, kept)
        sims = {"torch ZBVZeroBubble": torch_zbv, "torch Interleaved1F1B": torch_builtin("Interleaved1F1B", PP, m, VPP),
                OURS: s, OURS_CSV: s, TORCH_EARLY: torch_zbv, CONTROL: s}
        sim_ms = {n: simulate(v, measured.costs, mem).makespan for n, v in sims.items()}
        box[0] = (schedule_io.to_dict(s), schedule_io.to_dict(torch_zbv), measured.costs, sim_ms)
    dist.broadcast_object_list(box, src=0)
    plan_dict, torch_zbv_dict, costs, sim_ms = box[0]
    runs[OURS] = _ours(plan_dict, hidden, heavy_last, "early")
    runs[OURS_CSV] = _ours(plan_dict, hidden, heavy_last, "torch")
    runs[CONTROL] = _ours(plan_dict, hidden, heavy_last, "early")  # the same plan again: the run's noise floor
    if with_torch_early:  # torch's own ZBV order with pipeloom's lowering: is it the order or the lowering?
        runs[TORCH_EARLY] = _ours(torch_zbv_dict, hidden, heavy_last, "early")
    # 3. measure, alternating step by step
    names = list(runs)
    peaks: dict[str, float] = {}
    for name in names:  # warm-up (shape inference) and the in-flight peak
        step(*runs[name])
        with SavedBytes() as saved:
            step(*runs[name])
        peaks[name] = saved.peak / 2**20
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):  # the order rotated each round
        for name in names[r % len(names):] + names[: r % len(names)]:
            dist.barrier()
            t0 = time.perf_counter()
            step(*runs[name])
            dist.barrier()
            times[name].append(time.perf_counter() - t0)
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, (times, peaks))
    if rank:
        return None
    step_ms = {n: statistics.median(max(o[0][n][i] for o in out) for i in range(rounds)) * 1e3 for n in names}
    peak_mb = {n: max(o[1][n] for o in out) for n in names}
    return step_ms, peak_mb, sim_ms, costs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--microbatches", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--profile-steps", type=int, default=3, help="profiled steps of torch's ZBV to calibrate from")
    ap.add_argument("--quantile", type=float, default=0.5, help="statistic of the profiled costs (0.5 = median)")
    ap.add_argument("--cases", nargs="+", choices=["equal", "heavy"], default=["equal", "heavy"],
                    help="chunk costs: equal, or a heavier last chunk (vocabulary head + cross-entropy)")
    ap.add_argument("--torch-early", action="store_true",
                    help="also time torch's ZBV order with every receive posted first (pipeloom's lowering)")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    print("| chunk costs | m | schedule | step (ms, median) | step / pipeloom's | simulated (ms, profiled costs) "
          "| peak in-flight activations (MiB) |")
    print("|---|---:|---|---:|---:|---:|---:|")
    notes = []
    for heavy_last in [c == "heavy" for c in args.cases]:
        mem, kept = memory_model(args.hidden, heavy_last)
        label = "heavier last chunk (vocab head + CE)" if heavy_last else "equal"
        for m in args.microbatches:
            with tempfile.TemporaryDirectory() as trace_dir:
                step_ms, peak_mb, sim_ms, costs = spawn(
                    _bench_rank, PP, (m, args.hidden, heavy_last, args.rounds, mem, kept, args.profile_steps,
                                      trace_dir, args.quantile, args.torch_early),
                    timeout_s=900)
            ours = step_ms[OURS]
            for name in step_ms:
                print(f"| {label} | {m} | {name} | {step_ms[name]:.1f} | {step_ms[name] / ours:.3f} | "
                      f"{sim_ms[name]:.1f} | {peak_mb[name]:.2f} |", flush=True)
            fmt = lambda xs: " / ".join(f"{v:.2f}" for v in xs)  # noqa: E731
            notes.append(f"{label}, m {m}: F = {fmt(costs.F)}, I = {fmt(costs.B)}, W = {fmt(costs.W)}, "
                         f"comm = {costs.comm:.2f} ms")
        a, b = mem.a, mem.b
        notes.append(f"{label}: saved MiB per microbatch and chunk {[round(v, 2) for v in a]}, freed by torch's I "
                     f"{[round(v, 2) for v in b]}, left saved after W until the step ends {[round(v, 2) for v in kept]}")
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")
    print("\nprofiled costs (ms per microbatch and chunk, from torch's ZBV step in torch's runtime):")
    for n in notes:
        print(f"* {n}")


if __name__ == "__main__":
    main()
