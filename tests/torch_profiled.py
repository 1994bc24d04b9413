"""torch's pipelining runtime stepping a pipeloom plan under torch.profiler, one Chrome trace per rank and step
(``OUT/iteration_<k>/rank<r>_trace.json``, the layout torchtitan's profiling writes), one rank slowed: shared by the
tests that read such traces (tests/integrations/test_torch_runtime.py, tests/cli/test_check_runlog.py)."""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn


class SlowChunk(nn.Module):
    """A chunk whose forward takes ``delay`` seconds longer (the planted straggler)."""

    def __init__(self, inner: nn.Module, delay: float):
        super().__init__()
        self.inner, self.delay = inner, delay

    def forward(self, x):
        time.sleep(self.delay)
        return self.inner(x)


def profiled_steps(s, chunks: list[nn.Module], loss, x, y, out_dir: str, slow_rank: int, delay: float,
                   steps: int) -> int:
    """Run schedule ``s`` (all chunks given, this rank's used) with ``build_torch_schedule``: a warm-up step, then
    ``steps`` profiled steps; returns the rank."""
    from torch.distributed.pipelining import PipelineStage
    from torch.profiler import ProfilerActivity, profile

    from pipeloom.integrations.torch import build_torch_schedule

    rank = dist.get_rank()
    mine = s.chunks_of(rank)
    mods = {c: SlowChunk(chunks[c], delay if rank == slow_rank else 0.0) for c in mine}
    stages = [PipelineStage(mods[c], c, s.num_chunks, torch.device("cpu")) for c in mine]
    runtime = build_torch_schedule(s, stages, loss)
    first, last = 0 in mine, s.num_chunks - 1 in mine

    def step():
        runtime.step(*((x,) if first else ()), **({"target": y, "losses": []} if last else {}))
        for m in mods.values():
            m.zero_grad()
    step()  # warm-up, not profiled
    for it in range(1, steps + 1):
        dist.barrier()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        d = os.path.join(out_dir, f"iteration_{it}")
        os.makedirs(d, exist_ok=True)
        prof.export_chrome_trace(os.path.join(d, f"rank{rank}_trace.json"))
    return rank
