"""Device 0's compute alone, in pipeloom's order and in torch's ZBV order: is the order itself faster?

    python bench/torch_order_compute.py [--rounds 30]

The heavier-last-chunk case of ``torch_runtime_plans.py`` (pp 2, V placement, m 8: device 0 holds chunk 0 and
the vocabulary head with the loss). pipeloom's ``zbv`` plan is made as that benchmark makes it (``plan_for_torch``; the profiled
costs and measured memory of one of its runs, the limit at torch's ZBV peak, jobs moved to meet the peak with
what each W leaves saved); then device 0's job list alone runs in ONE process on one thread with torch's own
``stage_backward_input`` / ``stage_backward_weight`` (stage 0's I a no-op, its W the whole backward), inputs
and received gradients made up, no communication. Three entries alternate round by round, in a fresh random
order each round: pipeloom's order, torch's order, and torch's order again on its own model copy (an A/A
control). If the order changed the compute (e.g. through the cache), the first two would differ by more than the
last two.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight  # noqa: E402

import torch_runtime_plans as trp  # noqa: E402
from _harness import alternate, median  # noqa: E402
from pipeloom.core.costs import Costs, MemModel  # noqa: E402
from pipeloom.core.ir import Kind  # noqa: E402

M = 8
HIDDEN = 384
#: measured by torch_runtime_plans.py (heavier last chunk, m 8, 2026-11-25): MiB per microbatch and chunk
MEM = MemModel(a=(1.31, 1.31, 1.31, 11.86), b=(0.0, 0.05, 0.05, 0.75))
KEPT = [0.0, 0.0, 0.0, 0.84]
#: and ms per microbatch and chunk
COSTS = Costs(F=(1.15, 1.12, 1.11, 5.13), B=(0.08, 1.38, 1.49, 4.66), W=(1.16, 1.24, 1.31, 5.44))


def orders() -> dict[str, list]:
    """Device 0's job list: pipeloom's plan (made as the runtime benchmark makes it) and torch's ZBV order."""
    ours, tz = trp.plan_for_torch(M, COSTS, MEM, KEPT, builders=("zbv",), fuse=False)
    return {"pipeloom": list(ours.devices[0]), "torch": list(tz.devices[0]), "torch again": list(tz.devices[0])}


def run(order, chunks, xs, ys, loss) -> None:
    """Device 0's jobs in ``order``: F, torch's I (stage_backward_input), torch's W (stage_backward_weight)."""
    held: dict = {}
    for kind, mb, c in order:
        mod = chunks[c]
        if kind is Kind.F:
            inp = xs[mb] if c == 0 else torch.randn(xs[mb].shape).requires_grad_(True)
            out = mod(inp)
            held[(mb, c)] = (inp, loss(out, ys[mb]) if c == len(chunks) - 1 else out)
        elif kind is Kind.B:
            inp, out = held[(mb, c)]
            if c == 0:  # torch: stage 0's I is a no-op, its W runs the whole backward
                held[(mb, c, "groups")] = None
                continue
            grads = None if c == len(chunks) - 1 else [torch.ones_like(out)]
            _, held[(mb, c, "groups")] = stage_backward_input([out], grads, [inp], mod.parameters())
        elif kind is Kind.W:
            _, out = held.pop((mb, c))
            groups = held.pop((mb, c, "groups"))
            if c == 0:
                torch.autograd.backward([out], [torch.ones_like(out)])
            else:
                stage_backward_weight(mod.parameters(), groups)
    for mod in chunks:
        mod.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    jobs = orders()
    for name in ("pipeloom", "torch"):
        print(f"{name:9s} device 0: " + " ".join(f"{k.value}{mb}.{c}" for k, mb, c in jobs[name][:16]) + " ...")
    chunks = {name: trp.make_chunks(HIDDEN, True) for name in jobs}  # each entry on its own model copy
    x, y = trp.data(M, HIDDEN, True)
    xs, ys, loss = x.chunk(M), y.chunk(M), trp.loss_fn(True)
    # one warm-up round, then a fresh order each round (as torch_runtime_plans.py: a fixed rotation made the
    # control always follow the order it copies)
    entries = {name: (lambda name=name: run(jobs[name], chunks[name], xs, ys, loss)) for name in jobs}
    times = alternate(entries, args.rounds, shuffle=True, seed=0, warmup=1)
    med = {name: median(v) * 1e3 for name, v in times.items()}
    print("median ms: " + ", ".join(f"{name} {v:.1f}" for name, v in med.items()))
    print(f"pipeloom / torch {med['pipeloom'] / med['torch']:.3f}; "
          f"A/A (torch again / torch) {med['torch again'] / med['torch']:.3f}")


if __name__ == "__main__":
    main()
