"""Run a pipeloom plan in torch's own pipeline runtime (torch.distributed.pipelining) on CPU/gloo ranks.

    python examples/torch_plan.py                  # plans ZB-V for 2 ranks, 8 microbatches; spawns 2 ranks
    python examples/torch_plan.py plan.torch.csv   # any saved plan (pipeloom JSON/CSV or torch's CSV)
    torchrun --nproc-per-node 2 examples/torch_plan.py plan.torch.csv

Every rank builds only the chunks the plan places on it (build_stages_from_csv), runs one step, and rank 0
checks the losses and every gradient against the same model run in one process.
"""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

from pipeloom.integrations.torch import build_stages_from_csv
from pipeloom.schedule import io as schedule_io

DIM, ROWS = 16, 2  # hidden width; rows (sequences) per microbatch


def make_chunk(c: int, num_chunks: int) -> nn.Module:
    """Chunk c of a small MLP; the same weights on every rank (seeded by the chunk's index)."""
    torch.manual_seed(100 + c)
    return nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) if c < num_chunks - 1 else nn.Linear(DIM, DIM)


def loss_fn(out, target):
    return nn.functional.mse_loss(out, target)


def data(m: int):
    g = torch.Generator().manual_seed(0)
    return torch.randn(m * ROWS, DIM, generator=g), torch.randn(m * ROWS, DIM, generator=g)


def rank_main(plan_path: str) -> dict | None:
    """One rank: build its stages from the plan, run one step, gather losses and gradients on rank 0."""
    part = build_stages_from_csv(plan_path, make_chunk, loss_fn)
    x, y = data(part.schedule.microbatches)
    losses = part.step(x, y)
    # plain lists: what a rank returns travels back through a pipe, where tensors would need shared memory
    grads = {f"{c}.{n}": p.grad.tolist() for c, mod in zip(part.chunks, part.modules) for n, p in mod.named_parameters()}
    mine = {"rank": dist.get_rank(), "chunks": part.chunks, "losses": [float(v.detach()) for v in losses], "grads": grads}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every if dist.get_rank() == 0 else None


def reference(m: int, num_chunks: int):
    """The same step in one process: per-microbatch losses and the gradients of the mean loss."""
    chunks = [make_chunk(c, num_chunks) for c in range(num_chunks)]
    x, y = data(m)
    losses = []
    for xm, ym in zip(x.chunk(m), y.chunk(m)):
        h = xm
        for c in chunks:
            h = c(h)
        losses.append(loss_fn(h, ym))
    (torch.stack(losses).sum() / m).backward()
    return [float(v.detach()) for v in losses], {f"{c}.{n}": p.grad for c, mod in enumerate(chunks)
                                        for n, p in mod.named_parameters()}


def check(every: list, m: int, num_chunks: int) -> float:
    """The largest difference to one process (losses and gradients); prints what each rank ran."""
    ref_losses, ref_grads = reference(m, num_chunks)
    for r in every:
        print(f"rank {r['rank']}: chunks {r['chunks']}")
    losses = [v for r in every for v in r["losses"]]
    grads = {k: torch.tensor(g) for r in every for k, g in r["grads"].items()}
    assert set(grads) == set(ref_grads), "every chunk is built on exactly one rank"
    diff = max([abs(a - b) for a, b in zip(losses, ref_losses)] +
               [float((grads[k] - ref_grads[k]).abs().max()) for k in ref_grads])
    print(f"losses {[round(v, 4) for v in losses]}")
    print(f"largest difference to one process (losses, gradients): {diff:.2e}")
    return diff


def main(argv: list[str]) -> int:
    if argv:
        path = argv[0]
    else:  # plan one: ZB-V, 2 ranks x 2 chunks, 8 microbatches, torch runtime's memory model at 1p
        from pipeloom.core.costs import runtime_mem_model
        from pipeloom.schedule.planning import make_spec, plan

        import tempfile

        path = os.path.join(tempfile.mkdtemp(prefix="pipeloom-example-"), "zbv.torch.csv")
        spec = make_spec(pp=2, microbatches=8, vpp=2, mem=runtime_mem_model("torch"), mem_limit="1p")
        schedule_io.save(plan("zbv", spec), path, "torch")
        print(f"planned zbv pp=2 vpp=2 m=8 into {path}")
    s = schedule_io.load(path)
    from pipeloom.runtime.launch import init_process_group, under_torchrun, spawn

    if under_torchrun():
        init_process_group()
        every = rank_main(path)
        if every is not None:
            diff = check(every, s.microbatches, s.num_chunks)
            return 0 if diff < 1e-5 else 1
        return 0
    every = spawn(rank_main, s.pp, (path,), timeout_s=120)
    diff = check(every, s.microbatches, s.num_chunks)
    return 0 if diff < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
