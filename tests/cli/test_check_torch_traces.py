"""`pipeloom check DIR` on the torch profiler traces of a dp x pp run of torch's own pipelining runtime (the
layout torchtitan writes: ``iteration_<N>/rank<R>_trace.json``), and on the same traces as a GPU run records
them (every action twice: on the CPU and on the GPU stream).

Before: every rank was taken for its own pipeline rank (pp = the number of traces), so a dp 2 x pp 2 run was
refused as "neither interleaved nor in a V"; a GPU trace's actions were read twice.
"""
from __future__ import annotations

import contextlib
import io
import json
import os

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

from pipeloom.cli import main  # noqa: E402
from pipeloom.runtime.launch import spawn  # noqa: E402
from pipeloom.schedule import io as schedule_io  # noqa: E402
from pipeloom.schedule.planning import make_spec, plan  # noqa: E402

pytestmark = [pytest.mark.dist, pytest.mark.slow]

DP, PP, M, STEPS = 2, 2, 4, 3
SLOW_RANK = 3  # dp 1, pipeline rank 1
DELAY = 0.05  # s slept in every forward of the slow rank (a job of the tiny model takes < 1 ms)


def _dp_pp_run(plan_dict: dict, out_dir: str) -> int:
    """dp x pp ranks laid out pipeline-inner (rank = dp * PP + pp rank), each pipeline its own process group;
    torch's runtime steps the plan under torch.profiler, one trace per rank and step."""
    from torch.distributed.pipelining import PipelineStage
    from torch.profiler import ProfilerActivity, profile

    from pipeloom.integrations.torch import build_torch_schedule
    from torch_profiled import SlowChunk

    rank = dist.get_rank()
    groups = [dist.new_group([d * PP + p for p in range(PP)]) for d in range(DP)]  # every rank makes every group
    dpr, ppr = divmod(rank, PP)
    s = schedule_io.from_dict(plan_dict)
    torch.manual_seed(0)
    chunks = [nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(s.num_chunks)]
    mine = s.chunks_of(ppr)
    mods = {c: SlowChunk(chunks[c], DELAY if rank == SLOW_RANK else 0.0) for c in mine}
    stages = [PipelineStage(mods[c], c, s.num_chunks, torch.device("cpu"), group=groups[dpr]) for c in mine]
    runtime = build_torch_schedule(s, stages, lambda o, t: nn.functional.mse_loss(o, t))
    g = torch.Generator().manual_seed(1 + dpr)
    x, y = torch.randn(2 * M, 8, generator=g), torch.randn(2 * M, 8, generator=g)
    first, last = 0 in mine, s.num_chunks - 1 in mine

    def step():
        runtime.step(*((x,) if first else ()), **({"target": y, "losses": []} if last else {}))

    step()  # warm-up, not profiled
    for it in range(1, STEPS + 1):
        dist.barrier()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        d = os.path.join(out_dir, "profile_trace", f"iteration_{it}")
        os.makedirs(d, exist_ok=True)
        prof.export_chrome_trace(os.path.join(d, f"rank{rank}_trace.json"))
    return rank


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # tests/torch_profiled.py
    d = tmp_path_factory.mktemp("titan")
    spawn(_dp_pp_run, DP * PP, (schedule_io.to_dict(plan("1f1b", make_spec(pp=PP, microbatches=M))), str(d)),
          timeout_s=240)
    return d / "profile_trace"


def _check(path, *extra) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["check", str(path), "--json", "--no-pictures", "--slowdown-threshold", "0.5", *extra]) == 0
    return json.loads(buf.getvalue())


def test_a_dp_by_pp_torch_run_is_read_with_its_data_parallel_ranks(traces):
    from pipeloom.trace.reader import read_logs

    run = read_logs(str(traces))
    assert (run.pp, run.dp, run.steps) == (PP, DP, [1, 2, 3])
    assert {(r.rank, r.dp_rank, r.pp_rank) for r in run.ranks} == {(k, k // PP, k % PP) for k in range(DP * PP)}
    assert run.schedule.devices == plan("1f1b", make_spec(pp=PP, microbatches=M)).devices


def test_check_names_the_slow_rank_of_a_dp_by_pp_torch_run(traces):
    d = _check(traces)
    assert d["format"] == "torch-profiler" and d["dp"] == DP and d["pp"] == PP
    assert d["stragglers"] == [SLOW_RANK], d["verdict"]
    top = max(d["by_worker"], key=lambda w: w["slowdown"])
    assert (top["dp_rank"], top["stage"]) == divmod(SLOW_RANK, PP)
    assert {"dp_rank": 1, "stage": 1, "rank": SLOW_RANK} in d["whatif_stragglers"], d["verdicts"]
    assert d["replay_error"] < 0.02


def test_a_gpu_trace_is_read_from_its_gpu_spans_once(traces, tmp_path):
    """The same traces as a CUDA run records them: each PP span also on the GPU stream (here 2 ms later and
    half as long); the jobs are the GPU spans, each once."""
    from pipeloom.trace.reader import read_logs

    cpu = read_logs(str(traces))
    gpu_dir = tmp_path / "gpu"
    for sub in sorted(os.listdir(traces)):
        os.makedirs(gpu_dir / sub)
        for name in os.listdir(traces / sub):
            data = json.loads((traces / sub / name).read_text())
            extra = [dict(ev, cat="gpu_user_annotation", ts=ev["ts"] + 2000, dur=ev["dur"] / 2, pid=1, tid=7)
                     for ev in data["traceEvents"] if ev.get("ph") == "X" and str(ev.get("name")).startswith("PP:")
                     and "RECV" not in ev["name"] and "SEND" not in ev["name"]]
            data["traceEvents"] += extra
            (gpu_dir / sub / name).write_text(json.dumps(data))
    gpu = read_logs(str(gpu_dir), align=False)
    raw = read_logs(str(traces), align=False)
    for rc, rg in zip(raw.ranks, gpu.ranks):
        assert len(rg.jobs) == len(rc.jobs)
        for jc, jg in zip(sorted(rc.jobs, key=lambda j: (j.step, j.kind, j.mb, j.chunk)),
                          sorted(rg.jobs, key=lambda j: (j.step, j.kind, j.mb, j.chunk))):
            assert jg.end - jg.start == pytest.approx((jc.end - jc.start + jc.wait) / 2, abs=2e-6)
            assert jg.wait == 0.0
    assert gpu.dp == cpu.dp == DP
