"""`pipeloom check LOGDIR` runs the what-if straggler analysis on real runs: pipeloom's runtime on gloo with a
planted slow rank (and a clean run), and torch's pipelining runtime under torch.profiler."""
from __future__ import annotations

import contextlib
import io
import json

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

from pipeloom.cli import main  # noqa: E402
from pipeloom.runtime.driver import cases_worker  # noqa: E402
from pipeloom.runtime.launch import spawn  # noqa: E402
from pipeloom.schedule import io as schedule_io  # noqa: E402
from pipeloom.schedule.planning import make_spec, plan  # noqa: E402

pytestmark = [pytest.mark.dist, pytest.mark.slow]

DELAY = 0.1  # s slept in every job of the slow rank: ~15x a job of the example model, far above CPU noise
TORCH_DELAY = 0.03  # s slept in every forward of the slow rank (the torch jobs are tiny)
THRESHOLD = "0.99"
"""the largest --slowdown-threshold: 4 ranks on a shared 2-core machine, one rank's jobs can take about 2x its
peers' for a whole run (measured: clean runs whose worst worker had S_w 1.2, 1.4 and 2.2); the planted causes
are > 4x"""


def _check(logdir: str) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["check", logdir, "--json", "--no-pictures", "--slowdown-threshold", THRESHOLD])
    assert rc == 0
    return json.loads(buf.getvalue())


def _all(cases: list[dict], plan_dict: dict, out_dir: str) -> int:
    """Both runs in ONE process group (process start dominates): pipeloom's runtime, then torch's."""
    cases_worker(cases)
    dist.barrier()
    return _profiled(plan_dict, out_dir, 2, 3)


ZBV = dict(pp=4, microbatches=8, vpp=2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """pipeloom: 1F1B, pp 2 x dp 2 with ranks laid out pp-major (rank 1 = stage 0, dp 1: the coordinates must
    come from the logs, not from the rank number), 5 profiled steps, rank 1 slowed, and the same run without
    the delay. torch: zbv on 4 ranks, rank 2 slowed, 3 profiled steps."""
    d = tmp_path_factory.mktemp("runs")
    base = dict(schedule="1f1b", pp=2, dp=2, microbatches=4, steps=6, profile_steps="1:6", seq_len=8,
                rank_order="pp-dp")
    cases = [dict(base, log_dir=str(d / "slow"), inject_delay=(1, DELAY)), dict(base, log_dir=str(d / "clean"))]
    spawn(_all, 4, (cases, schedule_io.to_dict(plan("zbv", make_spec(**ZBV))), str(d / "torch")), timeout_s=240)
    return d


def test_pipeloom_run_with_a_slow_rank_is_named_by_the_whatif_keys(runs):
    slow = _check(str(runs / "slow"))
    # CPU noise on a shared 2-core machine may push a clean worker over the threshold too: the planted one must
    # be named and be the slowest
    assert {"dp_rank": 1, "stage": 0, "rank": 1} in slow["whatif_stragglers"], slow["verdicts"]
    assert slow["slowdown"] > 2 and slow["whatif"]["steps"] == [1, 2, 3, 4, 5]
    top = max(slow["by_worker"], key=lambda w: w["slowdown"])
    assert (top["dp_rank"], top["stage"]) == (1, 0)
    assert slow["replay_error"] < 0.02  # the logs' gaps replayed: the measured step comes back


def test_the_planted_delay_is_what_the_analysis_measures(runs):
    """The same run without the delay: its slowdown is far below the delayed run's, and rank 1 is not singled out
    there. (That a clean log gets no verdict at all is tested on synthetic logs, tests/trace/test_runops.py: on
    real CPU runs beside other jobs, a clean worker can be ~2x its peers for a whole run.)"""
    clean, slow = _check(str(runs / "clean")), _check(str(runs / "slow"))
    assert slow["slowdown"] > 1.5 * clean["slowdown"], (slow["slowdown"], clean["slowdown"])
    s_w = {(w["dp_rank"], w["stage"]): w["slowdown"] for w in clean["by_worker"]}
    assert s_w[(1, 0)] < {(w["dp_rank"], w["stage"]): w["slowdown"] for w in slow["by_worker"]}[(1, 0)] / 1.5
    assert clean["replay_error"] < 0.02


def _profiled(plan_dict: dict, out_dir: str, slow_rank: int, steps: int) -> int:
    """torch's runtime of a pipeloom plan under torch.profiler, one trace per rank and step."""
    from torch_profiled import profiled_steps

    s = schedule_io.from_dict(plan_dict)
    torch.manual_seed(0)
    chunks = [nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(s.num_chunks)]
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(2 * s.microbatches, 8, generator=g), torch.randn(2 * s.microbatches, 8, generator=g)
    return profiled_steps(s, chunks, lambda o, t: nn.functional.mse_loss(o, t), x, y, out_dir, slow_rank,
                          TORCH_DELAY, steps)


def test_torch_profiler_traces_get_the_whatif_analysis(runs):
    """zbv (V placement, split backward: W jobs), rank 2 slowed: the what-if keys name its stage (dp = 1: a slow
    rank and a heavy stage look the same, so it is the imbalanced stage)."""
    s = plan("zbv", make_spec(**ZBV))
    rep = _check(str(runs / "torch"))
    w = rep["whatif"]
    assert w["steps"] == [1, 2, 3] and w["ops"] == 3 * s.num_jobs
    assert {o["optype"] for o in rep["by_optype"]} == {"forward-compute", "backward-compute",
                                                       "backward-weight-compute"}
    assert 2 in rep["imbalanced_stages"], rep["verdicts"]
    assert max(rep["by_worker"], key=lambda r: r["slowdown"])["stage"] == 2
    assert {r["rank"]: r["score"] for r in w["by_rank"]}[2] == max(r["score"] for r in w["by_rank"])
    assert max(rep["by_stage"], key=lambda r: r["slowdown"])["stage"] == 2
    assert w["model"]["pipeline_edges"] == 3 * 2 * s.microbatches * (s.num_chunks - 1)
    assert rep["replay_error"] < 0.02
