"""Chunks that a user tensor-parallelized with torch's own ``parallelize_module`` (DTensor parameters,
``ColwiseParallel`` / ``RowwiseParallel``) run in pipeloom's executor (gloo, pp 2 x tp 2 on one (pp, tp)
DeviceMesh): the split backward's W computes the weight gradients on the local shards into the local shards of
DTensor gradients (it failed with ``aten.addmm_.default got mixed torch.Tensor and DTensor`` before), and the
loss and every gradient (gathered with ``full_tensor``) equal one process, for zbv (split backward) and 1f1b.
In the same processes, the same DTensor chunks run pipeloom's zbv plan, exported as torch's CSV, in torch's own
``_PipelineScheduleRuntime`` (``build_stages_from_csv`` on the mesh's pp group): equal to one process too."""
from __future__ import annotations

import re

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


def _reference(ref, xs, ys, lf) -> float:
    loss = 0.0
    for x, y in zip(xs, ys):
        h = x
        for c in ref:
            h = c(h)
        part = lf(h, y) / len(xs)
        part.backward()
        loss += part.item()
    return loss


def _grad_diff(mods: dict, ref: list) -> tuple[float, int]:
    """The largest difference between a chunk's gradients (DTensor ones gathered) and one process's; how many
    of them were DTensors."""
    diff, dtensors = 0.0, 0
    for k, mod in mods.items():
        for (_, p), (_, q) in zip(mod.named_parameters(), ref[k].named_parameters()):
            g = p.grad
            if hasattr(g, "full_tensor"):
                dtensors += 1
                g = g.full_tensor()
            diff = max(diff, (g - q.grad).abs().max().item())
    return diff, dtensors


def _torch_runtime(csv: str, mesh, xs, ys, lf) -> dict:
    """The plan saved at ``csv`` (torch's CSV) run by torch's own runtime on this rank's DTensor chunks."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from pipeloom.integrations.torch import build_stages_from_csv

    torch.manual_seed(0)
    n = 2 * mesh.size(0)  # zbv: two chunks per pp rank
    full = [_chunk() for _ in range(n)]
    ref = [_chunk() for _ in range(n)]
    for a, b in zip(full, ref):
        b.load_state_dict(a.state_dict())

    def make_chunk(c: int, num_chunks: int):
        assert num_chunks == n
        return parallelize_module(full[c], mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})

    rp = build_stages_from_csv(csv, make_chunk, lf, rank=mesh.get_local_rank("pp"), group=mesh.get_group("pp"))
    losses = rp.step(torch.cat(xs), torch.cat(ys))  # torch splits them back into the plan's microbatches
    loss = sum(float(v) for v in losses) / len(xs) if rp.is_last else None
    ref_loss = _reference(ref, xs, ys, lf)
    diff, dtensors = _grad_diff(dict(zip(rp.chunks, rp.modules)), ref)
    t = torch.tensor([abs(loss - ref_loss) if loss is not None else 0.0, diff], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    n_losses = torch.tensor([len(losses)])
    dist.all_reduce(n_losses)  # every TP rank of the last stage computes the losses
    return {"loss_diff": t[0].item(), "grad_diff": t[1].item(), "dtensor_grads": dtensors,
            "losses": int(n_losses.item()), "chunks": rp.chunks}


def _dtensor_run(schedules: list[str], torch_csv: str | None = None) -> list[dict]:
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
        ref_loss = _reference(ref, xs, ys, lf)
        diff, dtensors = _grad_diff(mods, ref)
        t = torch.tensor([abs(loss - ref_loss), diff], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out.append({"loss_diff": t[0].item(), "grad_diff": t[1].item(), "dtensor_grads": dtensors,
                    "split": bool(ex._split)})
        ex.close()
    if torch_csv is not None:
        out.append(_torch_runtime(torch_csv, mesh, xs, ys, lf))
    return out if dist.get_rank() == 0 else None


def test_parallelize_module_chunks_run_in_pipeloom_executor_and_torch_runtime(tmp_path):
    from pipeloom.runtime.config import RunConfig, prepare
    from pipeloom.schedule import io as schedule_io

    plan = prepare(RunConfig(schedule="zbv", pp=2, microbatches=4)).schedule  # the plan the executor runs
    csv = str(tmp_path / "zbv.csv")
    schedule_io.save(plan, csv, fmt="torch")
    actions = {re.sub(r"\d", "", a) for row in open(csv).read().split() for a in row.split(",")}
    assert actions == {"F", "I", "W"}, actions  # torch's CSV of the split backward: I and W, no fused B
    assert schedule_io.load(csv).num_jobs == plan.num_jobs
    res = spawn(_dtensor_run, 4, (["zbv", "1f1b"], csv), timeout_s=180)
    zbv, f1b, torch_rt = res
    # torch's runtime: rank 0 (pp 0) holds zbv's chunks 0 and 3; both TP ranks of the last stage give 4 losses
    assert torch_rt["chunks"] == [0, 3] and torch_rt["losses"] == 2 * 4, torch_rt
    assert torch_rt["dtensor_grads"] == 4 * 2, torch_rt
    assert torch_rt["loss_diff"] <= TOL and torch_rt["grad_diff"] <= TOL, torch_rt
    assert zbv["split"] and not f1b["split"]
    for r, chunks in ((zbv, 2), (f1b, 1)):
        assert r["dtensor_grads"] == 4 * chunks  # fc1/fc2 weight and bias of the rank's chunks: DTensor gradients
        assert r["loss_diff"] <= TOL and r["grad_diff"] <= TOL, r
