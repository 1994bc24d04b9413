"""The data-parallel reduction model (sim/dp.py) and simulate/compare --dp."""
from __future__ import annotations

import json

import pytest

from pipeloom import api
from pipeloom.cli import main
from pipeloom.core.costs import Costs
from pipeloom.core.ir import Kind
from pipeloom.schedule import registry
from pipeloom.sim.dp import DPLink, collective_seconds, parse_bandwidth, parse_seconds, simulate_dp
from pipeloom.sim.simulate import simulate

LINK = DPLink(bandwidth=1e9, latency=1e-3, unit_s=1.0)  # 1 GB/s, 1 ms per ring step, cost unit = 1 s


def test_ring_collective_costs():
    # 4 ranks, 8 GB: all-reduce moves 2*3/4 of the bytes in 2*3 steps; RS and AG half of that each
    assert collective_seconds("allreduce", 8e9, 4, LINK) == pytest.approx(12.0 + 0.006)
    assert collective_seconds("reduce_scatter", 8e9, 4, LINK) == pytest.approx(6.0 + 0.003)
    assert collective_seconds("all_gather", 8e9, 4, LINK) == pytest.approx(6.0 + 0.003)
    assert collective_seconds("allreduce", 8e9, 1, LINK) == 0.0


def test_units_parse():
    assert parse_bandwidth("100Gb/s") == pytest.approx(12.5e9)
    assert parse_bandwidth("12.5GB/s") == pytest.approx(12.5e9)
    assert parse_bandwidth("25Gbps") == pytest.approx(25e9 / 8)
    assert parse_seconds("5us") == pytest.approx(5e-6) and parse_seconds("0.01ms") == pytest.approx(1e-5)
    for bad in ("fast", "-3GB/s", "0"):
        with pytest.raises(ValueError, match="dp bandwidth"):
            parse_bandwidth(bad)


def _sim(name, pp=4, m=8, costs="F=1,B=1,W=1"):
    info = registry.get(name)
    sched = api.plan(name, api.make_spec(pp=pp, microbatches=m, vpp=1 if info.vpp == "1" else 2, costs=costs))
    return simulate(sched, Costs.parse(costs))


@pytest.mark.parametrize("name", ["1f1b", "interleaved", "zbv", "zbh1"])
def test_overlapped_reductions_start_after_each_chunks_last_weight_grad_and_serialise(name):
    sim = _sim(name)
    sched = sim.schedule
    nbytes = [1.5e9] * sched.num_chunks
    res = simulate_dp(sim, nbytes, 4, LINK)
    for d in range(sched.pp):
        # from the job list: the end of the last W or BW of each chunk on the device
        last = {}
        for j, e in zip(sched.devices[d], sim.end[d]):
            if j.kind in (Kind.W, Kind.BW):
                last[j.chunk] = e
        ivs = res.intervals[d]
        assert len(ivs) == len(last)  # each chunk once
        prev = 0.0
        for (s, e, label), (ready, c) in zip(ivs, sorted((r, c) for c, r in last.items())):
            assert label.endswith(str(c))
            assert s == pytest.approx(max(prev, ready))
            assert e - s == pytest.approx(collective_seconds("allreduce", 1.5e9, 4, LINK))
            prev = e
    ends = [max(sim.end[d][-1], res.intervals[d][-1][1]) for d in range(sched.pp)]
    assert res.step_time == pytest.approx(max(ends))
    assert res.dp_exposed == pytest.approx(res.step_time - sim.makespan)


@pytest.mark.parametrize("name", ["1f1b", "zbv", "interleaved"])
def test_without_overlap_one_all_reduce_after_the_last_job_and_overlap_never_slower(name):
    sim = _sim(name)
    nbytes = [2e9] * sim.schedule.num_chunks
    plain = simulate_dp(sim, nbytes, 8, LINK, overlap=False)
    per_dev = 2e9 * sim.schedule.vpp
    want = max(sim.end[d][-1] + collective_seconds("allreduce", per_dev, 8, LINK) for d in range(sim.schedule.pp))
    assert plain.step_time == pytest.approx(want)
    over = simulate_dp(sim, nbytes, 8, LINK, overlap=True)
    assert over.step_time <= plain.step_time + 1e-9
    if sim.schedule.vpp > 1:  # an early chunk's reduction hides behind the drain
        assert over.dp_hidden_share > plain.dp_hidden_share


def test_zero_adds_the_parameter_all_gather_and_a_fast_link_hides_everything():
    sim = _sim("zbv")
    nbytes = [1e9] * sim.schedule.num_chunks
    z = simulate_dp(sim, nbytes, 4, LINK, overlap=False, zero=1)
    for d, ivs in enumerate(z.intervals):
        assert [lab.split()[0] for _, _, lab in ivs] == ["RS", "RS", "AG", "AG"]
        assert ivs[0][0] == pytest.approx(sim.end[d][-1])
    fast = simulate_dp(sim, nbytes, 4, DPLink(bandwidth=1e18, latency=0.0, unit_s=1.0))
    assert fast.step_time == pytest.approx(sim.makespan) and fast.dp_exposed < 1e-6
    one = simulate_dp(sim, nbytes, 1, LINK)
    assert one.dp_hidden_share is None and one.step_time == sim.makespan


def test_simulate_and_compare_json_have_the_dp_fields(capsys, tmp_path):
    argv = ["simulate", "-s", "zbv", "--pp", "4", "-m", "8", "--costs", "F=20,B=20,W=20", "--dp", "8",
            "--model", "llama2-7b", "--dp-gantt", str(tmp_path / "g.svg"), "--json"]
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    assert {"step_time", "dp_exposed", "dp_hidden_share"} <= set(res)
    assert res["step_time"] == pytest.approx(res["makespan"] + res["dp_exposed"])
    svg = (tmp_path / "g.svg").read_text()
    assert 'id="dp-reduction"' in svg
    assert main(["compare", "--pp", "4", "-m", "8", "--dp", "2", "--param-bytes", "1GB", "--schedules", "1f1b,zbv",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert all("dp_hidden_share" in r for r in rows if "error" not in r)


@pytest.mark.parametrize("argv,msg", [
    (["--dp", "2"], "--dp 2 needs the gradient bytes"),
    (["--dp", "2", "--param-bytes", "1GB", "--dp-bandwidth", "fast"], "dp bandwidth 'fast'"),
    (["--dp", "2", "--param-bytes", "1GB,2GB"], "--param-bytes has 2 values but the schedule has 4 chunks"),
])
def test_bad_dp_options_are_one_line_errors(capsys, argv, msg):
    assert main(["simulate", "-s", "1f1b", "--pp", "4", "-m", "8"] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeloom: error:") and msg in err and err.count("\n") == 1, err
