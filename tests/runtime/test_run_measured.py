"""``pipeloom run`` plans like ``pipeloom plan`` (gloo on 127.0.0.1, the tiny example model)."""
from __future__ import annotations

import json

import pytest

from pipeloom.cli import main
from pipeloom.core.costs import Costs
from pipeloom.schedule.planning import make_spec, plan
from pipeloom.trace.reader import read_logs

pytestmark = pytest.mark.dist

SMALL = ["--seq-len", "8", "--dim", "32", "--microbatch-size", "1"]


def _run(capsys, *argv):
    rc = main(["run", *argv, *SMALL, "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out.strip().splitlines()[-1])


def test_run_zbv_with_measured_costs_plans_with_them_and_verifies(tmp_path, capsys):
    logs = tmp_path / "logs"
    rc, res = _run(capsys, "--schedule", "zbv", "--pp", "2", "-m", "8", "--costs", "measured", "--verify",
                   "--steps", "2", "--log-dir", str(logs))
    assert rc == 0 and res["verified"], res
    c = res["measured_costs"]
    for k in ("F", "B", "W"):
        assert len(c[k]) == 4 and all(x > 0 for x in c[k]), c
    # the schedule that ran is zbv planned with exactly the printed costs (not unit costs)
    run = read_logs(str(logs))
    measured = Costs(F=tuple(c["F"]), B=tuple(c["B"]), W=tuple(c["W"]), comm=c["comm"])
    again = plan("zbv", make_spec(pp=2, microbatches=8, vpp=2, costs=measured))
    assert run.schedule.devices == again.devices
    assert run.costs.per_chunk(4) == measured.per_chunk(4)


def test_run_plans_with_the_given_costs(tmp_path, capsys):
    logs = tmp_path / "logs"
    costs = "F=1,B=3,W=1,comm=2"
    rc, res = _run(capsys, "--schedule", "zbv", "--pp", "2", "-m", "6", "--costs", costs, "--steps", "1",
                   "--log-dir", str(logs))
    assert rc == 0, res
    run = read_logs(str(logs))
    assert run.schedule.devices == plan("zbv", make_spec(pp=2, microbatches=6, vpp=2, costs=costs)).devices
    assert run.costs == Costs.parse(costs)
