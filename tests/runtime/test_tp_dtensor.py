"""Chunks that a user tensor-parallelized with torch's own ``parallelize_module`` (DTensor parameters,
``ColwiseParallel`` / ``RowwiseParallel``) run in pipeloom's executor (gloo, pp 2 x tp 2 on one (pp, tp)
DeviceMesh): the split backward's W computes the weight gradients on the local shards into the local shards of
DTensor gradients (it failed with ``aten.addmm_.default got mixed torch.Tensor and DTensor`` before), and the
loss and every gradient (gathered with ``full_tensor``) equal one process, for zbv (split backward) and 1f1b."""
from __future__ import annotations

import pytest

from pipeloom.runtime.launch import spawn

pytestmark = [pytest.mark.dist, pytest.mark.slow]

TOL = 1e-5


def _chunk():
    from torch import nn

    class Chunk(nn.Module):
        def __init__(self, d: int = 16, h: int = 32) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(d)  # a plain (replicated) parameter: its gradient comes in B
            self.fc1, self.fc2 = nn.Linear(d, h), nn.Linear(h, d)

        def forward(self, x):
            return x + self.fc2(self.fc1(self.norm(x)).relu())

    return Chunk()


def _dtensor_run(schedules: list[str]) -> list[dict]:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from pipeloom.runtime.config import RunConfig, prepare
    from pipeloom.runtime.executor import PipelineExecutor

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "tp"))
    pp_rank = mesh.get_local_rank("pp")
    out = []
    for name in schedules:
        sched = prepare(RunConfig(schedule=name, pp=2, microbatches=4)).schedule
        torch.manual_seed(0)
        full = [_chunk() for _ in range(sched.num_chunks)]
        ref = [_chunk() for _ in range(sched.num_chunks)]
        for a, b in zip(full, ref):
            b.load_state_dict(a.state_dict())
        mine = sched.chunks_of(pp_rank)
        mods = {k: parallelize_module(full[k], mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
                for k in mine}
        xs = [torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(i)) for i in range(4)]
        ys = [torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(10 + i)) for i in range(4)]

        def lf(o, t):
            return ((o - t) ** 2).mean()

        ex = PipelineExecutor(sched, mods, lf, pp_rank=pp_rank, loss_replicas=2,
                              pp_ranks=dist.get_process_group_ranks(mesh.get_group("pp")))
        loss = ex.step(xs, ys)
        ref_loss = 0.0
        for x, y in zip(xs, ys):
            h = x
            for c in ref:
                h = c(h)
            part = lf(h, y) / len(xs)
            part.backward()
            ref_loss += part.item()
        diff, dtensors = 0.0, 0
        for k in mine:
            for (_, p), (_, q) in zip(mods[k].named_parameters(), ref[k].named_parameters()):
                g = p.grad
                if hasattr(g, "full_tensor"):
                    dtensors += 1
                    g = g.full_tensor()
                diff = max(diff, (g - q.grad).abs().max().item())
        t = torch.tensor([abs(loss - ref_loss), diff], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out.append({"loss_diff": t[0].item(), "grad_diff": t[1].item(), "dtensor_grads": dtensors,
                    "split": bool(ex._split)})
        ex.close()
    return out if dist.get_rank() == 0 else None


def test_parallelize_module_chunks_run_in_pipeloom_executor():
    res = spawn(_dtensor_run, 4, (["zbv", "1f1b"],), timeout_s=120)
    zbv, f1b = res
    assert zbv["split"] and not f1b["split"]
    for r, chunks in ((zbv, 2), (f1b, 1)):
        assert r["dtensor_grads"] == 4 * chunks  # fc1/fc2 weight and bias of the rank's chunks: DTensor gradients
        assert r["loss_diff"] <= TOL and r["grad_diff"] <= TOL, r
