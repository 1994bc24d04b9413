"""Bubble check: replay vs the simulator, seed-002 closed form, straggler attribution on synthetic logs."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom import Costs, make_spec, plan, simulate
from pipeloom.cli import main
from pipeloom.schedule import registry
from pipeloom.trace.check import CheckError, check_run, closed_form_bubbles
from pipeloom.trace.reader import read_logs
from pipeloom.sim.replay import ReplayDeadlock, replay
from pipeloom.trace.synth import SynthConfig, write_logs


def _sched(name, pp, m, vpp=1, costs="F=1,B=1,W=1,comm=0"):
    spec = make_spec(pp=pp, microbatches=m, vpp=vpp, costs=costs)
    return plan(name, spec), spec


def _durations(sched, costs):
    dF, dB, dW = costs.per_chunk(sched.num_chunks)
    table = {"F": dF, "B": dB, "W": dW}
    return [[(dB[j.chunk] + dW[j.chunk]) if j.kind.value == "BW" else table[j.kind.value][j.chunk] for j in seq]
            for seq in sched.devices]


# ------------------------------------------------------------------------------- replay == simulate
@settings(max_examples=25)
@given(name=st.sampled_from(["fthenb", "1f1b", "eager1f1b", "interleaved", "zbh1", "zbv", "dualpipev"]),
       pp=st.integers(2, 5), mult=st.integers(1, 3), f=st.integers(1, 4), b=st.integers(1, 4),
       w=st.integers(0, 3), comm=st.sampled_from([0.0, 0.5, 1.0]))
def test_replay_matches_the_simulator(name, pp, mult, f, b, w, comm):
    if name not in registry.names():
        pytest.skip(f"{name} not built")
    info = registry.get(name)
    vpp = 1 if info.vpp == "1" else 2
    m = pp * mult if name != "dualpipev" else 2 * pp * mult
    costs = Costs(F=f, B=b, W=w, comm=comm)
    try:
        sched, _ = _sched(name, pp, m, vpp, costs=f"F={f},B={b},W={w},comm={comm}")
    except ValueError:
        return  # a builder may refuse a shape
    if sched.overlapped:
        return  # overlapped pairs: replay takes the pair's duration as given, the simulator derives it
    sim = simulate(sched, costs)
    rp = replay(sched, _durations(sched, costs), comm=comm)
    assert rp.makespan == pytest.approx(sim.makespan)
    for d in range(pp):
        assert rp.start[d] == pytest.approx(sim.start[d])
        assert rp.end[d] == pytest.approx(sim.end[d])


def test_replay_detects_deadlock():
    sched, _ = _sched("1f1b", 2, 2)
    bad = sched.__class__(sched.name, sched.pp, sched.vpp, sched.microbatches, sched.placement,
                          (tuple(reversed(sched.devices[0])), sched.devices[1]))
    with pytest.raises(ReplayDeadlock):
        replay(bad, _durations(bad, Costs()))


# ------------------------------------------------------------------------------- seed 002 closed form
@settings(max_examples=30)
@given(name=st.sampled_from(["fthenb", "1f1b", "interleaved"]), pp=st.integers(2, 6), mult=st.integers(1, 3),
       tf=st.integers(1, 4), tb=st.integers(1, 5), vpp=st.integers(1, 3))
def test_closed_form_bubble_positions_match_the_simulator(name, pp, mult, tf, tb, vpp):
    """Seed 002: idle before the first job s*t_f, after the last s*t_b, the rest (pp-s-1)(t_f+t_b)."""
    vpp = vpp if name == "interleaved" else 1
    m = pp * mult
    sched, _ = _sched(name, pp, m, vpp)
    # per chunk pass: F = tf, BW = tb (B = tb, W = 0)
    res = simulate(sched, Costs(F=tf, B=tb, W=0))
    rows = closed_form_bubbles(name, pp, tf, tb)
    for s, row in enumerate(rows):
        lead = res.start[s][0]
        tail = res.makespan - res.end[s][-1]
        middle = res.makespan - res.busy[s] - lead - tail
        assert lead == pytest.approx(row["lead"])
        assert tail == pytest.approx(row["tail"])
        assert middle == pytest.approx(row["middle"])


def test_closed_form_rejects_other_schedules():
    with pytest.raises(ValueError, match="no closed form"):
        closed_form_bubbles("zbv", 4, 1, 1)


# ------------------------------------------------------------------------------- stragglers
CASES = [("1f1b", 4, 8, 1), ("interleaved", 4, 8, 2), ("zbv", 4, 8, 2), ("fthenb", 4, 8, 1)]


@pytest.mark.parametrize("name,pp,m,vpp", CASES)
@pytest.mark.parametrize("slow_rank", [0, 2])
def test_slow_rank_is_found(tmp_path, name, pp, m, vpp, slow_rank):
    if name not in registry.names():
        pytest.skip(f"{name} not built")
    sched, spec = _sched(name, pp, m, vpp, costs="F=1,B=1,W=1,comm=0.1")
    write_logs(str(tmp_path), sched, SynthConfig(costs=spec.costs, slow={slow_rank: 1.7}, seed=slow_rank))
    rep = check_run(read_logs(str(tmp_path)))
    assert rep.stragglers == [slow_rank]
    assert rep.late_jobs > 0
    assert not rep.ok and "STRAGGLER" in rep.verdict
    assert rep.measured_bubble > rep.planned_bubble
    causes = {r["cause_rank"] for r in rep.late}
    assert causes <= {slow_rank, None} and slow_rank in causes
    slow = next(p for p in rep.per_rank if p["rank"] == slow_rank)
    assert slow["slowdown"] == pytest.approx(1.7, rel=0.05)


@pytest.mark.parametrize("name,pp,m,vpp", CASES)
def test_clean_run_reports_no_straggler(tmp_path, name, pp, m, vpp):
    if name not in registry.names():
        pytest.skip(f"{name} not built")
    sched, spec = _sched(name, pp, m, vpp, costs="F=1,B=1,W=1,comm=0.1")
    write_logs(str(tmp_path), sched, SynthConfig(costs=spec.costs, jitter=0.02))
    rep = check_run(read_logs(str(tmp_path)))
    assert rep.stragglers == []
    assert rep.ok and rep.verdict.startswith("OK")
    assert rep.measured_bubble == pytest.approx(rep.planned_bubble, abs=0.03)
    for d in rep.per_device:
        assert d["measured_bubble"] == pytest.approx(d["planned_bubble"], abs=0.05)


def test_downstream_waiting_rank_is_not_blamed_and_late_start_is(tmp_path):
    """Rank 1 starts every step 30 ms late; ranks 2, 3 wait for it but are not its cause."""
    sched, spec = _sched("1f1b", 4, 8)
    write_logs(str(tmp_path), sched, SynthConfig(late_start={1: 0.03}, jitter=0.01))
    rep = check_run(read_logs(str(tmp_path)))
    assert rep.stragglers == [1]
    r1 = next(p for p in rep.per_rank if p["rank"] == 1)
    assert r1["own_delay_s"] == pytest.approx(0.06, rel=0.1)  # 2 profiled steps x 30 ms
    assert r1["slowdown"] == pytest.approx(1.0, abs=0.05)
    late_ranks = {r["rank"] for r in rep.late}
    assert {2, 3} & late_ranks  # downstream ranks are late ...
    assert all(r["cause_rank"] in (1, None) for r in rep.late)  # ... because of rank 1


def test_two_slow_ranks_are_both_found(tmp_path):
    sched, _ = _sched("1f1b", 4, 8)
    write_logs(str(tmp_path), sched, SynthConfig(slow={1: 1.6, 2: 1.6}))
    assert check_run(read_logs(str(tmp_path))).stragglers == [1, 2]


def test_half_slow_pipeline_of_two(tmp_path):
    """pp=2: the lower median takes the fast rank as the norm."""
    sched, _ = _sched("1f1b", 2, 4)
    write_logs(str(tmp_path), sched, SynthConfig(slow={1: 1.5}))
    assert check_run(read_logs(str(tmp_path))).stragglers == [1]


def test_data_parallel_replicas_and_machines(tmp_path):
    sched, _ = _sched("interleaved", 4, 8, 2)
    write_logs(str(tmp_path), sched, SynthConfig(dp=2, machines=2, skew={1: -2.5}, slow={6: 1.6}))
    run = read_logs(str(tmp_path))
    assert run.dp == 2 and len(run.ranks) == 8
    rep = check_run(run)
    assert rep.stragglers == [6]
    assert {d["dp_rank"] for d in rep.per_device} == {0, 1}


def test_closed_form_reported_for_1f1b_only(tmp_path):
    sched, _ = _sched("1f1b", 4, 8)
    write_logs(str(tmp_path / "a"), sched, SynthConfig(jitter=0.0))
    rep = check_run(read_logs(str(tmp_path / "a")))
    assert rep.closed_form is not None and len(rep.closed_form) == 4
    unit = rep.fit["seconds_per_cost_unit"]["F"]
    for row in rep.closed_form:
        assert row["measured_lead"] == pytest.approx(row["lead"], abs=0.05 * unit)
        assert row["measured_tail"] == pytest.approx(row["tail"], abs=0.05 * unit)
    if "zbv" in registry.names():
        zs, _ = _sched("zbv", 4, 8, 2)
        write_logs(str(tmp_path / "z"), zs, SynthConfig())
        assert check_run(read_logs(str(tmp_path / "z"))).closed_form is None


def test_incomplete_step_is_left_out_with_a_warning(tmp_path):
    sched, _ = _sched("1f1b", 4, 8)
    paths = write_logs(str(tmp_path), sched, SynthConfig())
    # drop the last job line of step 4 from rank 3
    p = paths[3]
    lines = open(p).read().splitlines()
    idx = max(i for i, ln in enumerate(lines) if '"event": "job"' in ln and '"step": 4' in ln)
    del lines[idx]
    open(p, "w").write("\n".join(lines) + "\n")
    rep = check_run(read_logs(str(tmp_path)))
    assert rep.steps == [3]
    assert any("step 4" in w and "missing" in w for w in rep.warnings)


def test_no_complete_step_is_an_error(tmp_path):
    sched, _ = _sched("1f1b", 2, 2)
    paths = write_logs(str(tmp_path), sched, SynthConfig(profile_steps=(0, 1), extra_steps=0))
    lines = [ln for ln in open(paths[1]).read().splitlines() if '"mb": 1' not in ln]
    open(paths[1], "w").write("\n".join(lines) + "\n")
    with pytest.raises(CheckError, match="no complete step"):
        check_run(read_logs(str(tmp_path)))


# ------------------------------------------------------------------------------- CLI
def test_check_cli_json_contract(tmp_path, capsys):
    sched, _ = _sched("1f1b", 4, 8)
    write_logs(str(tmp_path), sched, SynthConfig(slow={3: 1.8}, malformed=2))
    rc = main(["check", str(tmp_path), "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    obj = json.loads(out)
    assert {"planned_bubble", "measured_bubble", "stragglers", "late_jobs", "verdict"} <= set(obj)
    assert obj["stragglers"] == [3]
    assert isinstance(obj["late_jobs"], int) and obj["late_jobs"] > 0
    assert obj["malformed_lines"] == 4 * 3  # 2 garbage lines + 1 truncated line per file
    assert main(["check", str(tmp_path), "--strict", "--json"]) == 1


def test_check_cli_table_and_errors(tmp_path, capsys):
    sched, _ = _sched("1f1b", 4, 8)
    write_logs(str(tmp_path), sched, SynthConfig())
    assert main(["check", str(tmp_path), "--strict"]) == 0
    out = capsys.readouterr().out
    assert "verdict: OK" in out and "closed form" in out
    assert main(["check", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeloom: error:") and "Traceback" not in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["check", str(empty)]) == 2
    err = capsys.readouterr().err
    assert "no trace format" in err and "workerlog.<rank>" in err and "torch profiler" in err


def test_noisy_run_is_unsteady_not_a_list_of_stragglers(tmp_path):
    """Every job time varies +-50%: most ranks cost time, the verdict says so instead of blaming all."""
    sched, _ = _sched("1f1b", 4, 8)
    write_logs(str(tmp_path), sched, SynthConfig(jitter=0.5, seed=3))
    rep = check_run(read_logs(str(tmp_path)))
    assert rep.verdict.startswith("UNSTEADY") and not rep.ok
    assert len(rep.stragglers) < 2


def test_seed003_text_logs_without_a_plan_still_find_the_straggler(tmp_path):
    sched, _ = _sched("interleaved", 4, 8, 2)
    write_logs(str(tmp_path), sched, SynthConfig(text_form=True, machines=2, skew={1: 3.0}, slow={1: 1.5},
                                                 profile_steps=(0, 3), extra_steps=0))
    rep = check_run(read_logs(str(tmp_path)))
    assert rep.schedule == "measured-order"
    assert rep.stragglers == [1]
