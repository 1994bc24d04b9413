"""``pipeloom run`` takes the planning options of ``pipeloom plan`` (no process is started here)."""
from __future__ import annotations

import pytest

from pipeloom.cli import build_parser, main
from pipeloom.cli.run_cmd import run_config
from pipeloom.core.costs import Costs
from pipeloom.runtime.driver import prepare
from pipeloom.schedule.planning import make_spec, plan


def _cfg(*argv):
    args = build_parser().parse_args(["run", *argv])
    before = dict(vars(args))
    cfg = run_config(args)
    assert vars(args) == before  # the options are read, never rewritten
    return cfg


def test_costs_mem_and_options_reach_the_plan():
    cfg = prepare(_cfg("-s", "zbv", "--pp", "2", "-m", "6", "--costs", "F=1,B=3,W=1,comm=2", "-O", "budget=500",
                       "--mem-limit", "2p"))
    want = plan("zbv", make_spec(pp=2, microbatches=6, vpp=2, costs="F=1,B=3,W=1,comm=2", mem_limit="2p",
                                 options={"budget": 500}))
    assert cfg.schedule.devices == want.devices
    assert cfg.planned_costs == Costs.parse("F=1,B=3,W=1,comm=2")


def test_layer_partition_options_choose_the_model_split():
    cfg = _cfg("-s", "1f1b", "--pp", "2", "-m", "4", "--layers", "9", "--layers-per-device", "6,3")
    assert cfg.layers_per_chunk == (6, 3)
    cfg = _cfg("-s", "interleaved", "--pp", "2", "-m", "4", "--layers", "10")
    assert sum(cfg.layers_per_chunk) == 10 and len(cfg.layers_per_chunk) == 4
    assert _cfg("-s", "1f1b", "--pp", "2").layers_per_chunk is None  # no partition option: even split


def test_measured_first_plans_with_unit_costs():
    cfg = _cfg("-s", "zbv", "--pp", "2", "-m", "4", "--costs", "measured")
    assert cfg.measure_costs and cfg.spec.costs == Costs()


def test_plan_file_refuses_planning_options(tmp_path, capsys):
    from pipeloom.schedule import io as schedule_io

    f = tmp_path / "p.json"
    schedule_io.save(plan("1f1b", make_spec(pp=2, microbatches=2)), str(f))
    assert main(["run", "--plan", str(f), "--costs", "measured", "-O", "budget=1"]) == 2
    err = capsys.readouterr().err
    assert f"--plan {f} fixes the schedule, pp, vpp and microbatches; drop --costs, --option" in err


def test_prepare_validates_once_and_ranks_only_check_the_shape(monkeypatch):
    import pipeloom.schedule.validate as v

    calls = []
    real = v.validate
    monkeypatch.setattr(v, "validate", lambda *a, **k: calls.append(1) or real(*a, **k))
    sched = plan("1f1b", make_spec(pp=2, microbatches=4))
    from pipeloom.runtime.driver import RunConfig

    cfg = prepare(RunConfig(plan=sched, pp=2))
    assert len(calls) == 1 and cfg.checked and cfg.schedule.devices == sched.devices
    assert prepare(cfg) is cfg and len(calls) == 1


@pytest.mark.parametrize("argv", [
    ["compare", "--pp", "2", "-m", "4", "--schedules", "1f1b,zbv,interleaved", "--json"],
    ["compare", "--pp", "2", "-m", "4", "--vpp", "2", "--costs-per", "chunk", "--costs", "F=1,B=2,W=1", "--json"],
    ["partition", "--pp", "2", "--layers", "8", "--vpp", "2", "--balance", "--json", "--max-evals", "20"],
    ["simulate", "-s", "zbv", "--pp", "2", "-m", "4", "--layers", "9", "--json"],
])
def test_commands_do_not_rewrite_their_options(capsys, argv):
    args = build_parser().parse_args(argv)
    before = dict(vars(args))
    assert args.func(args) in (0, None)
    capsys.readouterr()
    assert vars(args) == before


def test_compare_stage_costs_are_split_over_vpp_without_reparsing(capsys):
    import json

    assert main(["compare", "--pp", "2", "-m", "4", "--schedules", "interleaved", "--costs", "F=2,B=4,W=2,comm=1",
                 "--json"]) == 0
    rows = {r["vpp"]: r for r in json.loads(capsys.readouterr().out)["rows"] if "error" not in r}
    for vpp, r in rows.items():
        s = plan("interleaved", make_spec(pp=2, microbatches=4, vpp=vpp,
                                          costs=Costs(F=2 / vpp, B=4 / vpp, W=2 / vpp, comm=1)))
        from pipeloom.sim.simulate import simulate
        assert r["makespan"] == simulate(s, Costs(F=2 / vpp, B=4 / vpp, W=2 / vpp, comm=1)).makespan
