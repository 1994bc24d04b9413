"""``pipeloom run --tp N --costs measured`` (refused before): the per-chunk costs come from every TP rank's logs,
the slowest TP rank's per chunk and kind (:func:`pipeloom.trace.tp_costs.fit_tp_chunk_costs`, checked on
synthetic logs with one slow TP rank), and a pp2 x tp2 zbv run plans with them and still equals one process."""
from __future__ import annotations

import json

import pytest

from pipeloom.core.costs import Costs
from pipeloom.schedule.planning import make_spec, plan
from pipeloom.trace.check import CheckError, fit_chunk_costs
from pipeloom.trace.reader import read_logs
from pipeloom.trace.synth import SynthConfig, write_logs
from pipeloom.trace.tp_costs import fit_tp_chunk_costs

TRUE = Costs(F=[3.0, 1.0, 1.5, 4.0], B=[2.0, 1.0, 2.5, 5.0], W=[1.0, 0.5, 1.5, 2.0], comm=0.5)
UNIT = 0.002


def _tp_logs(tmp_path, slow: float):
    """Logs of a pp 2 x tp 2 zbv run: synthetic pp 2 x dp 2 logs whose dp index is relabelled as the TP index
    (global rank = pp_rank * tp + tp_rank, one pipeline), TP rank 0 of stage 1 ``slow`` times slower."""
    sched = plan("zbv", make_spec(pp=2, microbatches=8, vpp=2))
    # synth numbers ranks dp_rank * pp + pp_rank: rank 1 is (pp 1, index 0)
    write_logs(str(tmp_path), sched, SynthConfig(costs=TRUE, unit=UNIT, jitter=0.0, profile_steps=(1, 4), dp=2,
                                                 slow={1: slow}))
    run = read_logs(str(tmp_path))
    for r in run.ranks:
        r.rank, r.dp_rank = r.pp_rank * 2 + r.dp_rank, 0
    run.ranks.sort(key=lambda r: r.rank)
    run.dp = 1
    return sched, run


def test_tp_fit_takes_the_slowest_tp_rank_per_chunk(tmp_path):
    sched, run = _tp_logs(tmp_path, slow=1.5)
    fit = fit_tp_chunk_costs(run, 2, unit=UNIT)
    F, B, W = TRUE.per_chunk(4)
    factor = [1.5 if sched.device_of(c) == 1 else 1.0 for c in range(4)]
    got = fit.per_chunk(4)
    for want, have in zip((F, B, W), got):
        assert have == pytest.approx([x * f for x, f in zip(want, factor)], rel=1e-3)
    # reading the TP logs as one pipeline keeps one rank per stage (here the fast TP rank 1) and misses it
    one = fit_chunk_costs(run, unit=UNIT).per_chunk(4)
    assert one[0] == pytest.approx(F, rel=1e-3)
    assert fit_tp_chunk_costs(run, 1, unit=UNIT) == fit_chunk_costs(run, unit=UNIT)


def test_tp_fit_names_a_missing_tp_index(tmp_path):
    _, run = _tp_logs(tmp_path, slow=1.0)
    run.ranks = [r for r in run.ranks if r.rank % 2 == 0]
    with pytest.raises(CheckError, match=r"no log of tensor-parallel index 1"):
        fit_tp_chunk_costs(run, 2, unit=UNIT)


@pytest.mark.dist
def test_cli_run_pp2_tp2_zbv_costs_measured_plans_with_them_and_verifies(tmp_path, capsys):
    pytest.importorskip("torch")
    from pipeloom.cli import main

    logs = tmp_path / "logs"
    rc = main(["run", "--schedule", "zbv", "--pp", "2", "--tp", "2", "-m", "4", "--costs", "measured", "--verify",
               "--steps", "1", "--seq-len", "8", "--dim", "32", "--log-dir", str(logs), "--json"])
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["verified"] and res["tp"] == 2, res
    assert res["max_loss_diff"] <= 1e-5 and res["max_grad_diff"] <= 1e-5, res
    c = res["measured_costs"]
    assert all(len(c[k]) == 4 and all(x > 0 for x in c[k]) for k in ("F", "B", "W")), c
    # the schedule that ran is zbv planned with exactly the measured costs (not unit costs)
    run = read_logs(str(logs))
    measured = Costs(F=tuple(c["F"]), B=tuple(c["B"]), W=tuple(c["W"]), comm=c["comm"])
    assert run.schedule.devices == plan("zbv", make_spec(pp=2, microbatches=4, vpp=2, costs=measured)).devices
    assert run.costs.per_chunk(4) == measured.per_chunk(4)
