"""pipeloom plans run by torch's own runtime (_PipelineScheduleRuntime + PipelineStage) on gloo processes:
loss and every gradient equal to one process (fp32)."""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining import schedules as ts  # noqa: E402

from pipeloom.core.ir import Job, Schedule  # noqa: E402
from pipeloom.integrations.torch import build_torch_schedule  # noqa: E402
from pipeloom.memory.traced import SavedBytes  # noqa: E402
from pipeloom.runtime.launch import RankFailure, spawn  # noqa: E402
from pipeloom.schedule import io as schedule_io  # noqa: E402
from pipeloom.schedule.planning import make_spec, plan  # noqa: E402
from pipeloom.schedule.validate import validate  # noqa: E402

pytestmark = pytest.mark.dist

DIM, OUT, ROWS_PER_MB = 6, 3, 2


def _chunks(nc: int) -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) if c < nc - 1 else nn.Linear(DIM, OUT) for c in range(nc)]


def _data(m: int):
    g = torch.Generator().manual_seed(1)
    return torch.randn(m * ROWS_PER_MB, DIM, generator=g), torch.randn(m * ROWS_PER_MB, OUT, generator=g)


def _loss(out, target):
    return nn.functional.mse_loss(out, target)


def _reference(s: Schedule):
    chunks = _chunks(s.num_chunks)
    x, y = _data(s.microbatches)
    losses = []
    for xm, ym in zip(x.chunk(s.microbatches), y.chunk(s.microbatches)):
        h = xm
        for c in chunks:
            h = c(h)
        losses.append(_loss(h, ym))
    (torch.stack(losses).sum() / s.microbatches).backward()  # torch's scale_grads=True: grads / m
    grads = {f"{c}.{n}": p.grad.clone() for c, mod in enumerate(chunks) for n, p in mod.named_parameters()}
    return [float(v.detach()) for v in losses], grads


def _relabel(s: Schedule, perm: dict[int, int]) -> Schedule:
    return Schedule(s.name, s.pp, s.vpp, s.microbatches, s.placement,
                    tuple(tuple(Job(j.kind, perm[j.mb], j.chunk) for j in seq) for seq in s.devices), s.overlapped)


def _rank(s: Schedule, raw: bool, recvs: str = "early"):
    rank = dist.get_rank()
    chunks = _chunks(s.num_chunks)
    mine = s.chunks_of(rank)
    stages = [PipelineStage(chunks[c], c, s.num_chunks, torch.device("cpu")) for c in mine]
    runtime = build_torch_schedule(s, stages, _loss, recvs=recvs)
    if raw:  # the trap: the plan's own microbatch numbers, not renumbered for torch
        runtime.pipeline_order = {d: [ts._Action(j.chunk, {"F": ts.F, "B": ts.I, "W": ts.W, "BW": ts.B}[j.kind.value],
                                                 j.mb) for j in seq] for d, seq in enumerate(s.devices)}
        runtime._prepare_schedule_with_comms(runtime.pipeline_order)
    x, y = _data(s.microbatches)
    losses: list = []
    first, last = 0 in mine, s.num_chunks - 1 in mine
    runtime.step(*((x,) if first else ()), **({"target": y, "losses": losses} if last else {}))
    grads = {f"{c}.{n}": p.grad.tolist() for c in mine for n, p in chunks[c].named_parameters()}
    return [float(v.detach()) for v in losses], grads


def _run(s: Schedule, raw: bool = False, recvs: str = "early"):
    return spawn(_gather, s.pp, (schedule_io.to_dict(s), raw, recvs), timeout_s=120)


def _gather(plan_dict: dict, raw: bool, recvs: str = "early"):
    losses, grads = _rank(schedule_io.from_dict(plan_dict), raw, recvs)
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, (losses, grads))
    return out


CASES = [
    ("zbv-1p-hetero", lambda: plan("zbv", make_spec(pp=2, microbatches=8, vpp=2, mem_limit="1p",
                                                   costs="F=1:1:1:3,B=1:1:1:3,W=1"))),
    ("interleaved-m5", lambda: plan("interleaved", make_spec(pp=2, microbatches=5, vpp=2))),
    ("zbh1-pp4", lambda: plan("zbh1", make_spec(pp=4, microbatches=8))),
    ("optimal", lambda: plan("optimal", make_spec(pp=2, microbatches=3, vpp=2, options={"time_limit": 10}))),
    ("shuffled-last-stage", lambda: _relabel(plan("zbv", make_spec(pp=2, microbatches=4, vpp=2)),
                                             {0: 3, 1: 0, 2: 2, 3: 1})),
    ("shuffled-gpipe", lambda: _relabel(plan("fthenb", make_spec(pp=2, microbatches=4)), {0: 3, 1: 0, 2: 2, 3: 1})),
    ("dualpipev-composites", lambda: plan("dualpipev", make_spec(pp=2, microbatches=4, vpp=2))),
]


@pytest.mark.parametrize("name, make, recvs", [(*c, "early") for c in CASES] + [(*CASES[0], "torch"),
                                                                                  (*CASES[2], "torch")],
                         ids=[c[0] for c in CASES] + [f"{CASES[0][0]}-torch-lowering", f"{CASES[2][0]}-torch-lowering"])
def test_torch_runtime_runs_pipeloom_plans_exactly(name, make, recvs):
    """Receives posted first (build_torch_schedule's default) or where torch's own lowering puts them (what the
    compute-only CSV gives): the same losses and gradients as one process."""
    s = make()
    assert not validate(s)
    per_rank = _run(s, recvs=recvs)
    ref_losses, ref_grads = _reference(s)
    losses = [l for lo, _ in per_rank for l in lo]
    # torch reports the last stage's losses in its forward order, which export made 0, 1, 2, ...: compare as a
    # multiset (the renumbering permutes microbatch ids; each microbatch's loss must still be right)
    assert sorted(losses) == pytest.approx(sorted(ref_losses), abs=1e-6)
    grads = {k: torch.tensor(v) for _, g in per_rank for k, v in g.items()}
    assert set(grads) == set(ref_grads)
    for k in ref_grads:
        torch.testing.assert_close(grads[k], ref_grads[k], rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("base", ["zbv", "fthenb"])
def test_without_renumbering_torch_cannot_run_the_plan(base):
    """Why export renumbers: a valid plan whose last stage forwards 3, 0, 2, 1, fed to torch as is, passes
    torch's validator (build_torch_schedule) and then fails in the step: torch keeps the losses in the order
    the last stage forwards and looks microbatch i's up at position i. Measured with torch 2.13: a backward
    before all forwards stops with "Loss for microbatch 3 is not available"; all forwards first stops with
    "Failed to run stage backward" (the loss it picks belongs to another microbatch's graph). The same plans
    exported by pipeloom run exactly (the shuffled-* cases above)."""
    kw = dict(pp=2, microbatches=4, vpp=2) if base == "zbv" else dict(pp=2, microbatches=4)
    s = _relabel(plan(base, make_spec(**kw)), {0: 3, 1: 0, 2: 2, 3: 1})
    with pytest.raises(RankFailure, match="Loss for microbatch 3 is not available|Failed to run stage backward"):
        _run(s, raw=True)


def _profiled(plan_dict: dict, out_dir: str, slow_rank: int, steps: int):
    from torch_profiled import profiled_steps

    s = schedule_io.from_dict(plan_dict)
    x, y = _data(s.microbatches)
    return profiled_steps(s, _chunks(s.num_chunks), _loss, x, y, out_dir, slow_rank, 0.03, steps)


def test_torch_profiler_traces_of_a_torch_run_are_checked_like_pipeloom_logs(tmp_path):
    """torch's runtime under torch.profiler, rank 2 of 4 slowed: `pipeloom check` on the trace directory names it.
    (With pp 2, a straggler lengthens both ranks' steps alike and the check calls the run UNSTEADY, naming
    no one: with two ranks there is no majority to compare against.)"""
    import json

    from pipeloom.cli import main

    s = plan("zbv", make_spec(pp=4, microbatches=8, vpp=2))
    spawn(_profiled, 4, (schedule_io.to_dict(s), str(tmp_path), 2, 2), timeout_s=180)
    assert sorted(os.listdir(tmp_path)) == ["iteration_1", "iteration_2"]
    from pipeloom.trace.reader import read_logs
    run = read_logs(str(tmp_path))
    assert run.steps == [1, 2] and run.pp == 4 and run.schedule.placement.value == "v"
    assert run.schedule.devices == s.devices  # the order torch ran is the plan
    assert sum(len(r.jobs) for r in run.ranks) == 2 * s.num_jobs
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["check", str(tmp_path), "--json"])
    rep = json.loads(buf.getvalue())
    assert rc in (0, 1) and 2 in rep["stragglers"], rep


def test_a_trace_without_pipeline_spans_is_a_one_line_error(tmp_path):
    from pipeloom.trace.reader import LogError, read_logs
    (tmp_path / "rank0_trace.json").write_text('{"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 2}]}')
    with pytest.raises(LogError, match="rank0_trace.json holds no pipeline actions"):
        read_logs(str(tmp_path))


def _inflight(plan_dict: dict):
    """Peak saved-activation bytes of this rank during one step, in units of one full-stage microbatch."""
    s = schedule_io.from_dict(plan_dict)
    rank = dist.get_rank()
    torch.manual_seed(0)
    chunks = [nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) for _ in range(s.num_chunks)]  # equal chunks
    # one chunk's forward of one microbatch, measured the same way
    with SavedBytes() as saved:
        out = chunks[0](torch.randn(ROWS_PER_MB, DIM, requires_grad=True))
        per_chunk = saved.now
        del out
    mine = s.chunks_of(rank)
    stages = [PipelineStage(chunks[c], c, s.num_chunks, torch.device("cpu")) for c in mine]
    runtime = build_torch_schedule(s, stages, lambda o, t: nn.functional.mse_loss(o, t))
    x, _ = _data(s.microbatches)
    y = torch.zeros(s.microbatches * ROWS_PER_MB, DIM)
    first, last = 0 in mine, s.num_chunks - 1 in mine
    args = ((x,) if first else ()), ({"target": y, "losses": []} if last else {})
    runtime.step(*args[0], **args[1])  # warm-up (shape inference)
    with SavedBytes() as saved:
        runtime.step(*args[0], **args[1])
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, saved.peak / per_chunk / s.vpp)
    return out


def test_a_plan_for_torch_stays_within_its_limit_as_torch_holds_memory():
    """torch's I frees nothing (the graph lives until W): planned with pipeloom's default model (B frees half)
    a zbv plan at 1p holds up to 3 microbatches' activations in torch; planned with the torch runtime's model
    (B frees 0) it holds at most 2 = 1p, measured from autograd's saved tensors on every rank."""
    from pipeloom.core.costs import MemModel, runtime_mem_model

    peaks = {}
    for name, mem in (("default", MemModel()), ("torch", runtime_mem_model("torch"))):
        s = plan("zbv", make_spec(pp=2, microbatches=8, vpp=2, mem=mem, mem_limit="1p"))
        peaks[name] = spawn(_inflight, 2, (schedule_io.to_dict(s),), timeout_s=120)
    slack = 0.2  # the loss's own saved tensors on the last stage
    assert max(peaks["torch"]) <= 2 + slack, peaks
    assert max(peaks["default"]) > 2 + slack, peaks  # the trap is real
