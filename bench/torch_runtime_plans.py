"""pipeloom's plans against torch's built-in schedules, all run by torch's own runtime (gloo, CPU, pp 2).

    python bench/torch_runtime_plans.py [--rounds 9] [--hidden 384] [--profile-steps 3] [--quantile 0.5]
                                        [--cases equal heavy split] [--torch-early]

Per case and m (8 and 16), these schedules step the same model (each on its own copy) in the same two processes:

* torch's ``ScheduleZBVZeroBubble`` (V placement, B/W split) and ``ScheduleInterleaved1F1B`` (looped placement);
* pipeloom's plan for torch's runtime (``zbv``, V placement, or ``zbvpp``, looped placement, whichever simulates
  shorter) loaded with
  :func:`pipeloom.integrations.torch.build_torch_schedule` (every receive posted first);
* the same plan with torch's own send/recv lowering (``recvs="torch"``): what loading its compute-only CSV
  gives (torchtitan's route);
* with ``--torch-early``, also torch's ZBV order with every receive posted first (not a built-in: it tells
  whether a gain comes from the order or from the lowering);
* pipeloom's plan a second time, on its own model copy, stepped like the others (an A/A control: two copies of
  one plan have measured up to 7% apart in one run on the shared 2-core machine, so a difference between
  schedules smaller than the control's is not one this run can resolve).

Cases: ``equal``, 4 chunks of 2 layers (Linear + GELU) and an MSE loss; ``heavy``, the same with a vocabulary
projection and cross-entropy in the last chunk; ``split``, that head on a 16-layer model, where torch's two classes
also run on torchtitan's default split (layers spread evenly, the first and last stage one layer short: 4, 5, 4, 3)
and every other row on pipeloom's split: ``balance`` (objective: ``zbv``'s simulated makespan) from per-layer costs
read off a profile of torch's ZBV on torchtitan's split (a layer: the middle chunks' costs per layer; the head: the
last chunk's less its layers').

Calibration, in the same processes before timing: torch's ZBV steps ``--profile-steps`` times under
``torch.profiler``; :func:`pipeloom.integrations.torch_calibrate.profile_costs` reads the per-action costs as
torch's runtime ran them (stage 0's I a no-op, its W the full backward, sends included, waits excluded) and the
transfer latency; ``zbv`` and ``zbvpp`` are planned from those, with the memory model measured per chunk (``a``: the bytes
autograd saves for one microbatch's forward; ``b``: the part torch's own I frees) and its limit set to the peak
of torch's ZBV order under that model (torch's order read with ``torch_builtin``, simulated by pipeloom; in the
``split`` case, the lower of torch's ZBV on either split). What
each W leaves saved until the step ends (``kept``, measured the same way) is not in that model: where the plan's
peak counted with it (``peak_with_retention``) is above torch's order's, the plan's jobs are moved
(:func:`pipeloom.schedule.search.reorder.reorder`, the peak first, then the makespan) until it is not; failing that, the
limit is tightened and the plan made again.

Step time: median over rounds of the slowest rank's wall time (barrier before and after), the schedules
alternating step by step, in a fresh random order each round (a fixed rotation let each schedule always follow
the same one, and the A/A control, which followed a copy of its own plan, read 1.6-16% faster than the plan it
copies in all 10 case-runs of three runs); "per round": each round's step over pipeloom's step in the same round,
the median and quartiles over rounds (the machine's drift between rounds cancels). In-flight activations: the
peak bytes autograd keeps saved on a rank during one step (saved-tensor hooks), the larger of the two ranks.
"simulated": each order's makespan in pipeloom's simulator under the profiled costs (the model's view of the same
step).
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining import schedules as ts  # noqa: E402
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight  # noqa: E402

from _harness import median, paired_ratios, quartiles, round_orders, timed  # noqa: E402
from pipeloom.core.costs import MemModel  # noqa: E402
from pipeloom.integrations.torch import build_torch_schedule, torch_builtin  # noqa: E402
from pipeloom.core.errors import ScheduleError  # noqa: E402
from pipeloom.integrations.torch_calibrate import peak_with_retention, profile_costs  # noqa: E402
from pipeloom.memory.traced import SavedBytes  # noqa: E402
from pipeloom.partition.balance import balance  # noqa: E402
from pipeloom.partition.layer_costs import LayerCost, LayerCosts  # noqa: E402
from pipeloom.runtime.launch import spawn  # noqa: E402
from pipeloom.schedule import io as schedule_io  # noqa: E402
from pipeloom.schedule.planning import evaluate, make_spec, plan  # noqa: E402
from pipeloom.schedule.search.reorder import fuse_backward, reorder  # noqa: E402
from pipeloom.schedule.validate import validate  # noqa: E402
from pipeloom.sim.simulate import simulate  # noqa: E402

PP, VPP, ROWS, LAYERS_PER_CHUNK, VOCAB = 2, 2, 32, 2, 6144


class Head(nn.Module):
    """The last chunk of the uneven model: its layers, then a vocabulary projection (the loss is the CE)."""

    def __init__(self, body: nn.Module, proj: nn.Module):
        super().__init__()
        self.body, self.proj = body, proj

    def forward(self, x):
        return self.proj(self.body(x))


EVEN = (LAYERS_PER_CHUNK,) * (PP * VPP)


def make_chunks(hidden: int, heavy_last: bool, counts=EVEN) -> list[nn.Module]:
    """The model's chunks, ``counts[c]`` layers (Linear + GELU) in chunk c; the same layers, in the same order and
    with the same weights, whatever the split."""
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(hidden, hidden), nn.GELU()) for _ in range(sum(counts))]
    head = nn.Linear(hidden, VOCAB) if heavy_last else None
    chunks: list[nn.Module] = []
    for c, n in enumerate(counts):
        start = sum(counts[:c])
        body = nn.Sequential(*layers[start:start + n])
        chunks.append(Head(body, head) if head is not None and c == len(counts) - 1 else body)
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


def memory_model(hidden: int, heavy_last: bool, counts=EVEN) -> tuple[MemModel, list[float]]:
    """The memory model of torch's runtime, measured: the bytes (MiB) autograd saves for one microbatch's forward
    of each chunk (``a``), and the part of them torch's own I (``stage_backward_input``) frees (``b``: the saved
    tensors of ops without weights, e.g. the loss's softmax; 0 for the first chunk, whose I torch skips: its W
    runs the whole backward); and what stays saved after torch's W (``stage_backward_weight``), per chunk (the
    memory model has no term for it; see ``peak_with_retention``)."""
    torch.set_num_threads(1)
    chunks = make_chunks(hidden, heavy_last, counts)
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


BUILDERS = ("zbv", "zbvpp")  # V placement and looped placement, both with the B/W split


def torch_peaks(order, costs, mem: MemModel, kept: list) -> tuple[float, float]:
    """(peak under ``mem``, peak counted with what each W leaves held) of one of torch's orders, largest device."""
    spec = make_spec(pp=PP, microbatches=order.microbatches, vpp=VPP, costs=costs, mem=mem)
    return max(evaluate(order, spec)["peak_memory"]), max(peak_with_retention(order, mem, kept))


def plan_for_torch(m: int, costs, mem: MemModel, kept: list, caps=(float("inf"), float("inf")), builders=BUILDERS,
                   against=("ZBVZeroBubble",), fuse: bool = True):
    """(pipeloom's plan, torch's ZBV order) at pp 2: the shortest (simulated) of ``builders``' plans that hold no
    more than each of torch's orders ``against``, both under ``mem`` (the plan's limit) and counted with what each
    W leaves saved until the step ends (``kept``, see ``peak_with_retention``); each at most ``caps`` (those two
    peaks of torch's orders on another split) where lower. Candidates per builder: its plan, moved job by job
    (``reorder``, timed by the simulator) where it holds more than that, its limit tightened if that fails; and
    with ``fuse``, its plan with the backward of every chunk whose W leaves memory fused (``fuse_backward``:
    torch's fused backward leaves nothing), moved the same way."""
    torch_zbv = torch_builtin("ZBVZeroBubble", PP, m, VPP)
    peaks = [torch_peaks(torch_builtin(name, PP, m, VPP), costs, mem, kept) for name in against]
    limit0 = min([caps[0]] + [p for p, _ in peaks])
    target = min([caps[1]] + [p for _, p in peaks])
    retention = lambda sch: peak_with_retention(sch, mem, kept)  # noqa: E731
    held = [c for c, k in enumerate(kept) if k > 0] if fuse else []

    def fitted(cand, limit):
        """``cand``, moved until it holds at most ``target`` with the retention; None where it cannot."""
        if max(retention(cand)) > target + 1e-9:
            moved = reorder(cand, costs, mem, limit=target, peak=retention)
            if not validate(moved, mem=mem, mem_limit=limit):  # (and within the model's limit)
                cand = moved
        return cand if max(retention(cand)) <= target + 1e-9 else None

    found = []
    for builder in builders:
        limit = limit0
        for attempt in range(8):
            try:
                made = plan(builder, make_spec(pp=PP, microbatches=m, vpp=VPP, costs=costs, mem=mem,
                                               mem_limit=limit))
            except ScheduleError:
                break
            if attempt == 0 and held:
                found.append(fitted(fuse_backward(made, held), limit))
            s = fitted(made, limit)
            if s is not None:
                found.append(s)
                break
            limit -= max(max(kept), 0.01 * limit)
    found = [s for s in found if s is not None]
    if not found:
        raise SystemExit(f"none of {', '.join(builders)} fits torch's memory at m {m}")
    return min(found, key=lambda sch: simulate(sch, costs, mem).makespan), torch_zbv


def _stages(chunks, mine):
    return [PipelineStage(chunks[c], c, PP * VPP, torch.device("cpu")) for c in mine]


def _builtin(name: str, m: int, hidden: int, heavy_last: bool, counts):
    """(runtime, first, last, chunks) of one of torch's classes on this rank, on its own model copy."""
    rank = dist.get_rank()
    nst = PP * VPP
    chunks = make_chunks(hidden, heavy_last, counts)
    mine = [rank, nst - 1 - rank] if name == "ZBVZeroBubble" else [rank, rank + PP]  # V / looped placement
    cls = ts.ScheduleZBVZeroBubble if name == "ZBVZeroBubble" else ts.ScheduleInterleaved1F1B
    return cls(_stages(chunks, mine), m, loss_fn=loss_fn(heavy_last)), 0 in mine, nst - 1 in mine, chunks


def _ours(plan_dict: dict, hidden: int, heavy_last: bool, recvs: str, counts):
    """A pipeloom schedule (dict form) loaded into torch's runtime with build_torch_schedule."""
    s = schedule_io.from_dict(plan_dict)
    chunks = make_chunks(hidden, heavy_last, counts)
    mine = list(s.chunks_of(dist.get_rank()))
    rt = build_torch_schedule(s, _stages(chunks, mine), loss_fn(heavy_last), recvs=recvs)
    return rt, 0 in mine, PP * VPP - 1 in mine, chunks


def pipeloom_split(costs, counts, m: int) -> tuple[int, ...]:
    """pipeloom's layer split for the V placement (``balance``, objective: ``zbv``'s simulated makespan), from
    per-layer costs read off a profile of the model split ``counts``: a layer's F, I and W the middle chunks' per
    layer, the head's the last chunk's less its layers'."""
    F, B, W = costs.per_chunk(PP * VPP)
    mid = counts[1] + counts[2]
    layer = LayerCost(F=(F[1] + F[2]) / mid, B=(B[1] + B[2]) / mid, W=(W[1] + W[2]) / mid)
    head = LayerCost(F=max(F[-1] - counts[-1] * layer.F, 0.0), B=max(B[-1] - counts[-1] * layer.B, 0.0),
                     W=max(W[-1] - counts[-1] * layer.W, 0.0))
    r = balance(LayerCosts(layers=[layer] * sum(counts), head=head), PP, VPP, schedule="zbv", objective="makespan",
                microbatches=m, comm=costs.comm)
    return tuple(len(c) for c in r.partition.chunks)


OURS, OURS_CSV = "pipeloom's plan (runtime torch)", "pipeloom's plan, torch's lowering (compute-only CSV)"
TORCH_EARLY = "torch ZBV's order, receives first (not a built-in)"
CONTROL = "pipeloom's plan again, its own model copy (A/A control)"
ZBV, IL = "torch ZBVZeroBubble", "torch Interleaved1F1B"
SPLIT_LAYERS = 16  # the "split" case's model: 16 layers and the vocabulary head
TT = ", torchtitan's split"


def torchtitan_split() -> tuple[int, ...]:
    """Layers per chunk of torchtitan's default split of the ``split`` case's model (its
    ``_generate_llm_fqn_per_model_part``: layers spread evenly with the first and the last stage one layer
    short for the embedding and the output; [4, 5, 4, 3] for 16 layers in 4 stages)."""
    try:
        from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part
    except ImportError as e:
        raise SystemExit(f"the split case takes torchtitan's default split from torchtitan, which is not "
                         f"importable here ({e}); install the extras (make venv) or leave out --cases split")
    parts = _generate_llm_fqn_per_model_part(PP * VPP, SPLIT_LAYERS)
    return tuple(sum(1 for name in part if name.startswith("layers.")) for part in parts)


def _bench_rank(case: str, m: int, hidden: int, rounds: int, profile_steps: int, trace_dir: str, quantile: float,
                with_torch_early: bool):
    torch.set_num_threads(1)
    rank = dist.get_rank()
    heavy_last = case != "equal"
    x, y = data(m, hidden, heavy_last)

    def step(rt, first, last, chunks):
        for mod in chunks:
            mod.zero_grad(set_to_none=True)
        rt.step(*((x,) if first else ()), **({"target": y, "losses": []} if last else {}))

    def profile(run, sub: str):
        """torch's own ZBV order, profiled in torch's runtime on these processes; rank 0 gets the costs."""
        step(*run)
        for it in range(profile_steps):
            dist.barrier()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                step(*run)
            d = os.path.join(trace_dir, sub, f"iteration_{it}")
            os.makedirs(d, exist_ok=True)
            prof.export_chrome_trace(os.path.join(d, f"rank{rank}_trace.json"))
        dist.barrier()
        return profile_costs(os.path.join(trace_dir, sub), quantile=quantile).costs if rank == 0 else None

    runs, sims, box = {}, {}, [None]
    counts, caps = EVEN, (float("inf"), float("inf"))
    if case == "split":  # torch's classes on torchtitan's default split ...
        tt = torchtitan_split()
        runs[ZBV + TT] = _builtin("ZBVZeroBubble", m, hidden, True, tt)
        runs[IL + TT] = _builtin("Interleaved1F1B", m, hidden, True, tt)
        costs_tt = profile(runs[ZBV + TT], "torchtitan")
        if rank == 0:  # ... and pipeloom's split, balanced from that profile; every other row runs on it
            mem_tt, kept_tt = memory_model(hidden, True, tt)
            zbv_tt = torch_builtin("ZBVZeroBubble", PP, m, VPP)
            sims.update({ZBV + TT: simulate(zbv_tt, costs_tt, mem_tt).makespan,
                         IL + TT: simulate(torch_builtin("Interleaved1F1B", PP, m, VPP), costs_tt,
                                           mem_tt).makespan})
            box[0] = pipeloom_split(costs_tt, tt, m), torch_peaks(zbv_tt, costs_tt, mem_tt, kept_tt)
        dist.broadcast_object_list(box, src=0)
        counts, caps = box[0]
    tag = ", pipeloom's split" if case == "split" else ""
    runs[ZBV + tag] = _builtin("ZBVZeroBubble", m, hidden, heavy_last, counts)
    runs[IL + tag] = _builtin("Interleaved1F1B", m, hidden, heavy_last, counts)
    # 1. calibrate: torch's own ZBV order on the split the plan is for
    measured = profile(runs[ZBV + tag], "plan")
    # 2. plan from those costs (rank 0), at torch ZBV's peak under the same memory model
    box = [None]
    if rank == 0:
        mem, kept = memory_model(hidden, heavy_last, counts)
        s, torch_zbv = plan_for_torch(m, measured, mem, kept, caps)
        orders = {ZBV + tag: torch_zbv, IL + tag: torch_builtin("Interleaved1F1B", PP, m, VPP),
                  OURS: s, OURS_CSV: s, TORCH_EARLY: torch_zbv, CONTROL: s}
        sims.update({n: simulate(v, measured, mem).makespan for n, v in orders.items()})
        box[0] = (schedule_io.to_dict(s), schedule_io.to_dict(torch_zbv), measured, sims, mem, kept)
    dist.broadcast_object_list(box, src=0)
    plan_dict, torch_zbv_dict, costs, sim_ms, mem, kept = box[0]
    runs[OURS] = _ours(plan_dict, hidden, heavy_last, "early", counts)
    runs[OURS_CSV] = _ours(plan_dict, hidden, heavy_last, "torch", counts)
    runs[CONTROL] = _ours(plan_dict, hidden, heavy_last, "early", counts)  # the same plan again: the noise floor
    if with_torch_early:  # torch's own ZBV order with pipeloom's lowering: is it the order or the lowering?
        runs[TORCH_EARLY] = _ours(torch_zbv_dict, hidden, heavy_last, "early", counts)
    # 3. measure, alternating step by step
    names = list(runs)
    peaks: dict[str, float] = {}
    for name in names:  # warm-up (shape inference) and the in-flight peak
        step(*runs[name])
        with SavedBytes() as saved:
            step(*runs[name])
        peaks[name] = saved.peak / 2**20
    times: dict[str, list[float]] = {name: [] for name in names}
    # a fresh order each round (no schedule always follows the same one), the same sequence on every rank
    for order in round_orders(names, rounds, shuffle=True, seed=0):
        for name in order:
            dist.barrier()
            times[name].append(timed(lambda: (step(*runs[name]), dist.barrier())))
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, (times, peaks))
    if rank:
        return None
    slowest = {n: [max(o[0][n][i] for o in out) for i in range(rounds)] for n in names}
    step_ms = {n: median(v) * 1e3 for n, v in slowest.items()}
    # the ratio to pipeloom's step within each round (steps next to each other), its median and quartiles
    paired = {n: quartiles(paired_ratios(v, slowest[OURS])) for n, v in slowest.items()}
    peak_mb = {n: max(o[1][n] for o in out) for n in names}
    fused = s.meta.get("fused_backward")  # (rank 0 made the plan)
    return (step_ms, paired, peak_mb, sim_ms, costs, counts, mem, kept,
            s.name + (f", backward of chunk {fused} fused" if fused else ""))


CASES = {"equal": "equal", "heavy": "heavier last chunk (vocab head + CE)",
         "split": f"heavier last chunk, {SPLIT_LAYERS} layers: torchtitan's split or pipeloom's"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--microbatches", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--profile-steps", type=int, default=3, help="profiled steps of torch's ZBV to calibrate from")
    ap.add_argument("--quantile", type=float, default=0.5, help="statistic of the profiled costs (0.5 = median)")
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES),
                    help="chunk costs: equal; a heavier last chunk (vocabulary head + cross-entropy); or that head "
                         f"on a {SPLIT_LAYERS}-layer model, torch's classes on torchtitan's split and on pipeloom's")
    ap.add_argument("--torch-early", action="store_true",
                    help="also time torch's ZBV order with every receive posted first (pipeloom's lowering)")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    print("| chunk costs | m | schedule | step (ms, median) | step / pipeloom's | per round: median [quartiles] "
          "| simulated (ms, profiled costs) | peak in-flight activations (MiB) |")
    print("|---|---:|---|---:|---:|---|---:|---:|")
    notes = []
    fmt = lambda xs: " / ".join(f"{v:.2f}" for v in xs)  # noqa: E731
    for case in args.cases:
        label = CASES[case]
        for m in args.microbatches:
            with tempfile.TemporaryDirectory() as trace_dir:
                step_ms, paired, peak_mb, sim_ms, costs, counts, mem, kept, builder = spawn(
                    _bench_rank, PP, (case, m, args.hidden, args.rounds, args.profile_steps, trace_dir,
                                      args.quantile, args.torch_early),
                    timeout_s=1800)
            ours = step_ms[OURS]
            for name in step_ms:
                q1, q2, q3 = paired[name]
                print(f"| {label} | {m} | {name} | {step_ms[name]:.1f} | {step_ms[name] / ours:.3f} | "
                      f"{q2:.3f} [{q1:.3f}, {q3:.3f}] | {sim_ms[name]:.1f} | {peak_mb[name]:.2f} |", flush=True)
            F, B, W = costs.per_chunk(PP * VPP)
            notes.append(f"{label}, m {m}: pipeloom's plan {builder}; layers per chunk {list(counts)}; "
                         f"F = {fmt(F)}, I = {fmt(B)}, "
                         f"W = {fmt(W)}, comm = {costs.comm:.2f} ms; saved MiB per microbatch and chunk "
                         f"{fmt(mem.a)}, freed by torch's I {fmt(mem.b)}, left saved after W until the step ends "
                         f"{fmt(kept)}")
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")
    print("\nprofiled costs (ms per microbatch and chunk, from torch's ZBV step in torch's runtime, on the split the "
          "plan is for) and the measured memory model:")
    for n in notes:
        print(f"* {n}")


if __name__ == "__main__":
    main()
