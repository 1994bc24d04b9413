"""pipeloom's plans against torch's built-in schedules, all run by torch's own runtime (gloo, CPU, pp 2).

    python bench/torch_runtime_plans.py [--rounds 7] [--hidden 384]

Per case (m = 8 and 16; chunks of equal cost, or a last chunk made heavier by a vocabulary head with the
loss), three schedules step the same model in the same two processes, alternating step by step:

* torch's ``ScheduleZBVZeroBubble`` (V placement, B/W split),
* torch's ``ScheduleInterleaved1F1B`` (looped placement),
* pipeloom's ``zbv`` planned for torch (``runtime torch``: B frees nothing), from per-chunk F / I / W costs
  measured on this machine before the run (each chunk's forward, input-gradient and weight-gradient backward,
  median of repeats), each chunk's saved-activation bytes per microbatch as the memory model's ``a`` and the part
  of them torch's I frees as ``b``, loaded
  with :func:`pipeloom.integrations.torch.build_torch_schedule`. Its memory limit is the peak of torch's own
  ZBVZeroBubble order under that model (torch's order, read with ``torch_builtin``, simulated by pipeloom).

Step time: median over rounds of the slowest rank's wall time (barrier before and after). In-flight
activations: the peak bytes autograd keeps saved on a rank during one step (saved-tensor hooks), the larger
of the two ranks. The table gives each schedule's step time relative to pipeloom's.
"""
from __future__ import annotations

import argparse
import copy
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining import schedules as ts  # noqa: E402
from torch.distributed.pipelining._backward import stage_backward_input  # noqa: E402

from pipeloom.core.costs import Costs, MemModel  # noqa: E402
from pipeloom.integrations.torch import build_torch_schedule, torch_builtin  # noqa: E402
from pipeloom.memory.traced import SavedBytes  # noqa: E402
from pipeloom.runtime.launch import spawn  # noqa: E402
from pipeloom.schedule import io as schedule_io  # noqa: E402
from pipeloom.schedule.planning import evaluate, make_spec, plan  # noqa: E402

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


def calibrate(hidden: int, heavy_last: bool, repeats: int = 15) -> tuple[Costs, list[float], list[float]]:
    """Per-chunk F, I (input gradient) and W (weight gradient) in ms, one thread, median of ``repeats``; the bytes
    (MiB) autograd saves for one microbatch's forward of each chunk (the memory model's ``a``), and the part of them
    torch's own I (``stage_backward_input``) frees (``b``: the saved tensors of ops without weights, e.g. the loss's
    softmax; 0 for the first chunk, whose I torch skips: its W runs the whole backward)."""
    torch.set_num_threads(1)
    chunks = make_chunks(hidden, heavy_last)
    x, y = data(1, hidden, heavy_last)
    lf = loss_fn(heavy_last)
    f, b, w, act, freed = [], [], [], [], []
    for c, mod in enumerate(chunks):
        last = c == len(chunks) - 1
        with SavedBytes() as saved:
            inp = x.clone().requires_grad_(True)
            out = mod(inp)
            if last:
                out = lf(out, y)
            act.append(saved.now / 2**20)
        kept = stage_backward_input([out], None if last else [torch.ones_like(out)], [inp], mod.parameters())
        del out
        gc.collect()
        freed.append(0.0 if c == 0 else act[-1] - saved.now / 2**20)
        del kept
        gc.collect()
        last = c == len(chunks) - 1
        tf, tb, tw = [], [], []
        for _ in range(repeats):
            inp = x.clone().requires_grad_(True)
            t0 = time.perf_counter()
            out = mod(inp)
            if last:
                out = lf(out, y)
            t1 = time.perf_counter()
            grad_out = None if last else torch.ones_like(out)
            (gi,) = torch.autograd.grad(out, inp, grad_out, retain_graph=True)
            t2 = time.perf_counter()
            torch.autograd.grad(out, list(mod.parameters()), grad_out)
            t3 = time.perf_counter()
            tf.append(t1 - t0), tb.append(t2 - t1), tw.append(t3 - t2)
        f.append(statistics.median(tf) * 1e3), b.append(statistics.median(tb) * 1e3), w.append(statistics.median(tw) * 1e3)
    fmt = lambda xs: ":".join(f"{v:.4f}" for v in xs)  # noqa: E731
    return Costs.parse(f"F={fmt(f)},B={fmt(b)},W={fmt(w)},comm=0"), act, freed


def _runtimes(plan_dict: dict, m: int, hidden: int, heavy_last: bool):
    """(name, runtime, my first/last flags) for the three schedules on this rank, each on its own model copy."""
    rank = dist.get_rank()
    base = make_chunks(hidden, heavy_last)
    lf = loss_fn(heavy_last)
    nst = PP * VPP
    out = []
    v_mine = [rank, nst - 1 - rank]                 # V placement: rank r holds chunks r and 2pp-1-r
    looped_mine = [rank, rank + PP]                 # looped: rank r holds r, r+pp
    for name, mine in (("torch ZBVZeroBubble", v_mine), ("torch Interleaved1F1B", looped_mine),
                       ("pipeloom zbv (runtime torch)", None)):
        chunks = copy.deepcopy(base)
        if mine is None:
            s = schedule_io.from_dict(plan_dict)
            mine = list(s.chunks_of(rank))
            stages = [PipelineStage(chunks[c], c, nst, torch.device("cpu")) for c in mine]
            rt = build_torch_schedule(s, stages, lf)
        else:
            stages = [PipelineStage(chunks[c], c, nst, torch.device("cpu")) for c in mine]
            cls = ts.ScheduleZBVZeroBubble if "ZBV" in name else ts.ScheduleInterleaved1F1B
            rt = cls(stages, m, loss_fn=lf)
        out.append((name, rt, 0 in mine, nst - 1 in mine, chunks))
    return out


def _bench_rank(plan_dict: dict, m: int, hidden: int, heavy_last: bool, rounds: int):
    torch.set_num_threads(1)
    x, y = data(m, hidden, heavy_last)
    runs = _runtimes(plan_dict, m, hidden, heavy_last)

    def step(rt, first, last, chunks):
        for mod in chunks:
            mod.zero_grad(set_to_none=True)
        rt.step(*((x,) if first else ()), **({"target": y, "losses": []} if last else {}))

    times: dict[str, list[float]] = {name: [] for name, *_ in runs}
    peaks: dict[str, float] = {}
    for name, rt, first, last, chunks in runs:  # warm-up (shape inference) and the in-flight peak
        step(rt, first, last, chunks)
        with SavedBytes() as saved:
            step(rt, first, last, chunks)
        peaks[name] = saved.peak / 2**20
    for r in range(rounds):  # alternating, the order rotated each round
        order = runs[r % len(runs):] + runs[: r % len(runs)]
        for name, rt, first, last, chunks in order:
            dist.barrier()
            t0 = time.perf_counter()
            step(rt, first, last, chunks)
            dist.barrier()
            times[name].append(time.perf_counter() - t0)
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, (times, peaks))
    if dist.get_rank():
        return None
    names = [name for name, *_ in runs]
    step_ms = {n: statistics.median(max(o[0][n][i] for o in out) for i in range(rounds)) * 1e3 for n in names}
    peak_mb = {n: max(o[1][n] for o in out) for n in names}
    return step_ms, peak_mb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--microbatches", type=int, nargs="+", default=[8, 16])
    args = ap.parse_args()
    print("| chunk costs | m | schedule | step (ms, median) | step / pipeloom's | peak in-flight activations (MiB) |")
    print("|---|---:|---|---:|---:|---:|")
    for heavy_last in (False, True):
        costs, act, freed = calibrate(args.hidden, heavy_last)
        label = "heavier last chunk (vocab head + CE)" if heavy_last else "equal"
        for m in args.microbatches:
            mem = MemModel(a=tuple(act), b=tuple(freed))  # torch's runtime, measured (runtime_mem_model: b=0)
            # the limit: the peak of torch's own ZBVZeroBubble order under the same memory model (its 1p)
            torch_zbv = evaluate(torch_builtin("ZBVZeroBubble", PP, m, VPP), make_spec(pp=PP, microbatches=m, vpp=VPP,
                                                                                       costs=costs, mem=mem))
            limit = max(torch_zbv["peak_memory"])
            s = plan("zbv", make_spec(pp=PP, microbatches=m, vpp=VPP, costs=costs, mem=mem, mem_limit=limit))
            step_ms, peak_mb = spawn(_bench_rank, PP, (schedule_io.to_dict(s), m, args.hidden, heavy_last,
                                                        args.rounds), timeout_s=600)
            ours = step_ms["pipeloom zbv (runtime torch)"]
            for name in step_ms:
                print(f"| {label} | {m} | {name} | {step_ms[name]:.1f} | {step_ms[name] / ours:.3f} | "
                      f"{peak_mb[name]:.2f} |", flush=True)
        f, b, w = (getattr(costs, k) for k in ("F", "B", "W"))
        print(f"<!-- calibrated ({label}): F={f} B={b} W={w} ms; saved MiB per microbatch and chunk "
              f"{[round(v, 3) for v in act]}, freed by torch's I {[round(v, 3) for v in freed]} -->", flush=True)


if __name__ == "__main__":
    main()
