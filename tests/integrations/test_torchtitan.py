"""pipeloom's torch CSV through torchtitan's own schedule builder (``_build_pipeline_schedule`` with
``parallelism.pipeline_parallel_schedule_csv``), run on gloo processes: loss and every gradient equal to one
process. Skipped where torchtitan is not installed (``make venv`` installs it; see the Makefile for why without
its dependencies)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
titan_pp = pytest.importorskip("torchtitan.distributed.pipeline_parallel")
titan_cfg = pytest.importorskip("torchtitan.config")

import torch.distributed as dist  # noqa: E402
from torch.distributed.pipelining import PipelineStage  # noqa: E402

from pipeloom.runtime.launch import spawn  # noqa: E402
from pipeloom.schedule import io as schedule_io  # noqa: E402
from pipeloom.schedule.planning import make_spec, plan  # noqa: E402
from pipeloom.schedule.validate import validate  # noqa: E402

from test_torch_runtime import _chunks, _data, _loss, _reference  # noqa: E402

pytestmark = pytest.mark.dist


def _titan_loss(out, target):
    """torchtitan's loss functions return (loss, extra); its builder keeps the first."""
    return _loss(out, target), None


def _rank(plan_dict: dict, csv_path: str):
    s = schedule_io.from_dict(plan_dict)
    rank = dist.get_rank()
    chunks = _chunks(s.num_chunks)
    mine = s.chunks_of(rank)
    stages = [PipelineStage(chunks[c], c, s.num_chunks, torch.device("cpu")) for c in mine]
    parallelism = titan_cfg.ParallelismConfig(pipeline_parallel_degree=s.pp, pipeline_parallel_schedule_csv=csv_path,
                                              pipeline_parallel_microbatch_size=1)
    runtime = titan_pp._build_pipeline_schedule(parallelism=parallelism, local_batch_size=s.microbatches, stages=stages,
                                                loss_fn=_titan_loss)
    x, y = _data(s.microbatches)
    losses: list = []
    first, last = 0 in mine, s.num_chunks - 1 in mine
    runtime.step(*((x,) if first else ()), **({"target": y, "losses": losses} if last else {}))
    grads = {f"{c}.{n}": p.grad.tolist() for c in mine for n, p in chunks[c].named_parameters()}
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, ([float(v.detach()) for v in losses], grads, type(runtime).__name__))
    return out


CASES = [
    ("zbv-1p-hetero", lambda: plan("zbv", make_spec(pp=2, microbatches=8, vpp=2, mem_limit="1p",
                                                   costs="F=1:1:1:3,B=1:1:1:3,W=1", mem="b=0"))),
    ("interleaved-pp4-m6", lambda: plan("interleaved", make_spec(pp=4, microbatches=6, vpp=2))),
    # overlapped F/B pairs: the CSV holds OVERLAP_F_B composites, which torchtitan's loader lowers with torch's pass
    ("dualpipev-pp2-m6", lambda: plan("dualpipev", make_spec(pp=2, microbatches=6, vpp=2))),
]


@pytest.mark.parametrize("name, make", CASES, ids=[c[0] for c in CASES])
def test_torchtitan_builds_and_runs_a_pipeloom_csv_exactly(name, make, tmp_path):
    s = make()
    assert not validate(s)
    csv = tmp_path / "plan.csv"
    schedule_io.save(s, csv, fmt="torch")
    per_rank = spawn(_rank, s.pp, (schedule_io.to_dict(s), str(csv)), timeout_s=120)
    assert {kind for _, _, kind in per_rank} == {"_PipelineScheduleRuntime"}  # the CSV path, not a built-in class
    ref_losses, ref_grads = _reference(s)
    losses = [l for lo, _, _ in per_rank for l in lo]
    assert sorted(losses) == pytest.approx(sorted(ref_losses), abs=1e-6)
    grads = {k: torch.tensor(v) for _, g, _ in per_rank for k, v in g.items()}
    assert set(grads) == set(ref_grads)
    for k in ref_grads:  # torchtitan builds with scale_grads=False: the sum over microbatches, not the mean
        torch.testing.assert_close(grads[k], ref_grads[k] * s.microbatches, rtol=1e-5, atol=1e-5, msg=k)


@pytest.mark.parametrize("builder, vpp, titan_name", [("zbv", 2, "ZBVZeroBubble"), ("dualpipev", 2, "ZBVZeroBubble"),
                                                      ("interleaved", 2, "Interleaved1F1B"),
                                                      ("interleaved", 3, "Interleaved1F1B"), ("zbh1", 1, "1F1B")])
def test_torchtitan_places_stages_where_the_plan_does_when_told_the_matching_schedule_name(builder, vpp, titan_name):
    """torchtitan picks each rank's stages from ``pipeline_parallel_schedule`` (V for ZBVZeroBubble/DualPipeV,
    looped otherwise) even when a CSV is given: the name pipeloom writes must give the plan's placement."""
    from pipeloom.integrations.torchtitan import TitanJob, placement_schedule

    pp = 4
    s = plan(builder, make_spec(pp=pp, microbatches=8, vpp=vpp))
    assert placement_schedule(TitanJob.from_schedule(s, [1] * s.num_chunks)) == titan_name
    for rank in range(pp):
        got = titan_pp._get_pp_rank_to_stage_indices_mapping(rank, pp, titan_name, s.num_chunks)
        assert sorted(got) == sorted(s.chunks_of(rank)), (rank, got)
