"""Run logs as op traces (trace/runops.py): the chunk mapping of every placement, dp coordinates, planted
causes named by the what-if analysis on pipeloom's own (synthetic) logs and on seed-003 text logs."""
import json
from pathlib import Path

import numpy as np
import pytest

from pipeloom import make_spec, plan
from pipeloom.cli import main
from pipeloom.trace.runops import check_run_whatif
from pipeloom.trace.reader import read_logs
from pipeloom.trace.runops import _serialise, optrace_of_run
from pipeloom.trace.synth import SynthConfig, write_logs
from pipeloom.trace.ops.whatif import analyse, build_model


def _logs(tmp_path, name, pp, m, vpp=1, **kw):
    sched = plan(name, make_spec(pp=pp, microbatches=m, vpp=vpp, costs="F=1,B=1,W=1,comm=0"))
    d = tmp_path / f"{name}-{len(list(tmp_path.iterdir()))}"
    write_logs(str(d), sched, SynthConfig(**kw))
    return str(d), sched


# ------------------------------------------------------------------------------- the mapping
@pytest.mark.parametrize("name,pp,vpp", [("1f1b", 4, 1), ("zbh1", 4, 1), ("interleaved", 4, 2), ("zbv", 4, 2)])
def test_every_dependency_of_the_schedule_is_rebuilt(tmp_path, name, pp, vpp):
    """Logs timed by the simulator without comm latency: every job starts when its last input ends, so the
    what-if model reproduces the step without any launch gap only if it rebuilt every pipeline edge, chunk
    order of the placement (V differs from looped) included; a wrong gmc would drop or misplace edges."""
    m, dp, steps = 8, 2, 3
    d, sched = _logs(tmp_path, name, pp, m, vpp, dp=dp, jitter=0.05, profile_steps=(1, 1 + steps), extra_steps=0)
    run = read_logs(d)
    tr = optrace_of_run(run)
    nc = sched.num_chunks
    assert len(tr) == dp * steps * sched.num_jobs
    for r in run.ranks:  # gmc = the global chunk, mc = its index on the rank, whatever the placement
        rows = tr.rank == r.rank
        assert set(tr.gmc[rows].tolist()) == set(sched.chunks_of(r.pp_rank))
        for c, i in zip(sched.chunks_of(r.pp_rank), range(vpp)):
            assert set(tr.mc[rows & (tr.gmc == c)].tolist()) == {i}
        assert set(tr.dp[rows].tolist()) == {r.dp_rank} and set(tr.stage[rows].tolist()) == {r.pp_rank}
    names = [tr.optypes[c] for c in tr.op]
    split = any(j.kind.value == "W" for _, _, j in sched.jobs())
    assert names.count("backward-weight-compute") == (dp * steps * m * nc if split else 0)
    assert names.count("forward-compute") == names.count("backward-compute") == dp * steps * m * nc
    model = build_model(tr)
    assert model.pipeline_edges == 2 * dp * steps * m * (nc - 1)
    assert not model.warnings
    res = analyse(model)
    assert res.replay_error < 1e-9
    assert np.allclose(res.t_base, res.t_measured, rtol=1e-6)  # no launch gap: every wait is explained


def test_overlapped_pairs_and_overlaps_are_serialised():
    spans, pairs, shared, clamped = _serialise([(0.0, 2.0), (0.0, 2.0), (2.0, 3.0), (2.5, 4.0), (4.0, 5.0),
                                                (4.0, 5.0)])
    assert spans == [(0.0, 2.0), (0.0, 2.0), (2.0, 3.0), (3.0, 4.0), (4.0, 5.0), (4.0, 5.0)]
    assert pairs == [0, 0, -1, -1, 1, 1] and (shared, clamped) == (4, 1)


@pytest.mark.parametrize("overlap", [0.0, 1.0])
def test_overlapped_pairs_replay_as_one_unit(tmp_path, overlap):
    """DualPipeV logs timed by the simulator: a pair shares one interval; as one unit (start when both are
    ready, take the longer) the model rebuilds the run without launch gaps and a clean log scores S ~ 1."""
    sched = plan("dualpipev", make_spec(pp=4, vpp=2, microbatches=16, costs=f"F=1,B=1,W=1,overlap={overlap}"))
    assert sched.overlapped
    write_logs(str(tmp_path), sched, SynthConfig(dp=2, jitter=0.02, profile_steps=(1, 5), extra_steps=0))
    d = check_run_whatif(read_logs(str(tmp_path)), pictures=False)
    assert any("overlapped pairs" in w for w in d["warnings"])
    assert d["replay_error"] < 1e-6 and d["launch_slowdown"] < 1.01
    assert d["slowdown"] < 1.05 and d["verdicts"] == []


# ------------------------------------------------------------------------------- planted causes
def _whatif(tmp_path, **kw):
    d, _ = _logs(tmp_path, "1f1b", 4, 8, dp=2, jitter=0.02, profile_steps=(1, 7), extra_steps=0, **kw)
    return check_run_whatif(read_logs(d), pictures=False)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return _whatif(tmp_path_factory.mktemp("clean"))


def test_clean_logs_get_no_verdict(clean):
    assert clean["verdicts"] == [] and clean["stragglers"] == [] and clean["imbalanced_stages"] == []
    assert clean["slowdown"] < 1.05 and clean["replay_error"] < 1e-6


def test_a_slow_stage_is_named_imbalanced_and_its_slowdown_recovered(tmp_path, clean):
    d = _whatif(tmp_path, slow={3: 1.5, 7: 1.5}, layers_per_chunk=[8, 8, 8, 8])  # stage 3 on both dp ranks
    assert d["imbalanced_stages"] == [3] and d["stragglers"] == []
    planted = d["step_time_measured"] / clean["step_time_measured"]  # same jitter draws
    assert d["slowdown"] == pytest.approx(planted, rel=0.05)
    assert d["partition_command"] and "--pp 4" in d["partition_command"]


def test_a_slow_rank_is_a_straggler_by_its_dp_coordinates(tmp_path, clean):
    d = _whatif(tmp_path, slow={5: 1.6})  # rank 5 = dp 1, pp 1
    assert d["stragglers"] == [{"dp_rank": 1, "stage": 1}] and d["imbalanced_stages"] == []
    assert d["slowdown"] == pytest.approx(d["step_time_measured"] / clean["step_time_measured"], rel=0.05)
    assert max(d["by_rank"], key=lambda r: r["score"])["rank"] == 5


def test_a_slow_rank_on_a_heavy_stage_gets_both_verdicts(tmp_path):
    d = _whatif(tmp_path, slow={2: 1.4, 6: 1.4 * 1.6})
    assert d["imbalanced_stages"] == [2] and d["stragglers"] == [{"dp_rank": 1, "stage": 2}]
    stage_verdict = next(v for v in d["verdicts"] if "stage (2)" in v or "stage 2 (2)" in v)
    pct = float(stage_verdict.split(" is ")[1].split("%")[0])
    assert 25 < pct < 55  # the stage's own 40%, not inflated by the straggler on it


# ------------------------------------------------------------------------------- plain-text run logs
def test_seed003_text_logs_of_two_skewed_machines(tmp_path):
    """Text lines (no meta, no sync), two machines with clocks 5 s apart: aligned by the reader, the replay
    reproduces the measured steps and the slow stage is the one the analysis names."""
    sched = plan("1f1b", make_spec(pp=4, microbatches=8))
    write_logs(str(tmp_path), sched, SynthConfig(text_form=True, machines=2, skew={1: 5.0}, slow={2: 1.6},
                                                 profile_steps=(0, 5), extra_steps=0))
    run = read_logs(str(tmp_path))
    assert run.alignment == "p2p"
    d = check_run_whatif(run, pictures=False)
    assert d["replay_error"] < 0.02 and not [w for w in d["warnings"] if "contradict" in w]
    assert d["steps"] == [0, 1, 2, 3, 4]
    assert d["imbalanced_stages"] == [2]  # dp = 1: a slow rank and a heavy stage look the same
    assert max(d["by_stage"], key=lambda s: s["slowdown"])["stage"] == 2


# ------------------------------------------------------------------------------- the CLI
def test_check_logdir_json_gains_the_whatif_keys(tmp_path, capsys):
    d, _ = _logs(tmp_path, "1f1b", 4, 8, dp=2, slow={5: 1.6}, profile_steps=(1, 5), extra_steps=0)
    assert main(["check", d, "--json", "--out", str(tmp_path / "w")]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert {"planned_bubble", "measured_bubble", "late_jobs", "verdict"} <= set(obj)
    assert obj["stragglers"] == [5]  # the bubble check's key, unchanged: ranks
    for k in ("slowdown", "mw", "ms", "by_worker", "by_stage", "by_optype", "imbalanced_stages", "verdicts",
              "replay_error", "whatif"):
        assert k in obj, k
    assert obj["whatif"]["stragglers"] == [{"dp_rank": 1, "stage": 1}]
    assert obj["whatif_stragglers"] == [{"dp_rank": 1, "stage": 1, "rank": 5}]
    assert obj["slowdown"] > 1.2 and obj["replay_error"] < 1e-6
    pics = obj["whatif"]["pictures"]
    assert pics["heatmap"].startswith(str(tmp_path / "w")) and json.load(open(pics["timeline"]))
    assert main(["check", d, "--no-pictures"]) == 0
    out = capsys.readouterr().out
    assert "what-if verdict: worker dp 1 / pp 1" in out and "verdict: " in out
    assert main(["check", d, "--no-pictures", "--json", "--steps", "1:2"]) == 0
    assert json.loads(capsys.readouterr().out)["whatif"]["steps"] == [1]
    assert main(["check", d, "--steps", "50:60"]) == 2
    assert "none of the steps" in capsys.readouterr().err
    assert main(["check", d, "--meta", "m.yaml"]) == 2
    assert "--meta applies to op traces" in capsys.readouterr().err


# ------------------------------------------------------------------------------- torch profiler traces
def test_torch_actions_lose_the_wait_for_their_input(tmp_path):
    """torch's RECV action only posts a receive; the F/I/B action that needs the data waits inside its own
    span until the gloo:recv the RECV action started ends: that wait is cut off the job (times in µs)."""
    def trace(rank, events):
        evs = [{"ph": "X", "name": n, "ts": t, "dur": d} for n, t, d in events]
        (tmp_path / f"rank{rank}_trace.json").write_text(json.dumps({"traceEvents": evs}))
    trace(0, [("PP:0F0", 0, 10), ("PP:0RECV_B0", 11, 1), ("c10d::recv_", 11.2, 0.5), ("gloo:recv", 11.5, 40),
              ("PP:0B0", 12, 45)])
    trace(1, [("PP:1RECV_F0", 0, 1), ("gloo:recv", 0.5, 11), ("PP:1F0", 1, 15), ("PP:1B0", 16, 20)])
    run = read_logs(str(tmp_path))
    jobs = {(j.kind, j.chunk): j for j in run.jobs()}
    assert jobs[("F", 1)].start * 1e6 == pytest.approx(11.5) and jobs[("F", 1)].wait * 1e6 == pytest.approx(10.5)
    assert jobs[("BW", 0)].start * 1e6 == pytest.approx(51.5) and jobs[("BW", 0)].wait * 1e6 == pytest.approx(39.5)
    assert jobs[("F", 0)].wait == 0 and jobs[("BW", 1)].wait == 0  # nothing to receive
    tr = optrace_of_run(run)
    assert sorted(np.round(tr.dur * 1e3, 6).tolist()) == [4.5, 5.5, 10.0, 20.0]  # µs: compute only


def test_a_missing_rank_log_is_a_warning_not_a_failure(tmp_path):
    d, _ = _logs(tmp_path, "1f1b", 4, 8, dp=2, slow={6: 1.5}, profile_steps=(1, 4), extra_steps=0)
    (tmp_path / d.rsplit("/", 1)[1] / "workerlog.5").unlink()
    res = check_run_whatif(read_logs(d), pictures=False)
    assert any("no jobs of worker(s) dp 1 / pp 1" in w for w in res["warnings"])
    assert res["stragglers"] == [{"dp_rank": 1, "stage": 2}] and res["replay_error"] < 1e-6


def test_the_time_to_hand_outputs_over_is_a_send_op(tmp_path):
    """CPU logs carry `done` (outputs handed to the transport): end..done becomes a forward-/backward-send op
    of the worker, cut at the next job's start; none after a rank's last job of a step or for a bad value."""
    from pipeloom import Costs

    d, _ = _logs(tmp_path, "1f1b", 2, 4, profile_steps=(1, 3), extra_steps=0, costs=Costs(comm=0.5))
    want = {"forward-send": [], "backward-send": []}
    for path in sorted(Path(d).iterdir()):
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        jobs = [x for x in lines if x["event"] == "job"]
        for x in jobs:
            x["done"] = x["end"] + 2e-3 if x["kind"] == "F" else "bad" if x["mb"] == 0 else x["end"] + 1e9
        for x, nxt in zip(jobs, jobs[1:]):
            if nxt["step"] == x["step"] and isinstance(x["done"], float) and min(x["done"], nxt["start"]) > x["end"]:
                want["forward-send" if x["kind"] == "F" else "backward-send"].append(
                    (min(x["done"], nxt["start"]) - x["end"]) * 1e3)
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert want["forward-send"] and want["backward-send"]
    tr = optrace_of_run(read_logs(d))
    names = np.array([tr.optypes[c] for c in tr.op])
    for name, durs in want.items():
        assert sorted(tr.dur[names == name]) == pytest.approx(sorted(durs), abs=1e-6)
    assert (names == "forward-compute").sum() == 2 * 2 * 4  # the jobs themselves unchanged
    assert analyse(build_model(tr)).replay_error < 1e-9


def test_merged_logs_of_several_machines_use_the_aligned_clocks(tmp_path):
    """pipeloom logs of pp 4 x dp 2 copied from four machines (two stages each, machine<k>/ folders) whose
    clocks are seconds apart: the reader's alignment (sync events) makes every cross-machine edge consistent;
    unaligned, they contradict."""
    sched = plan("interleaved", make_spec(pp=4, microbatches=8, vpp=2))
    write_logs(str(tmp_path), sched, SynthConfig(dp=2, machines=4, skew={1: 3.0, 3: -2.0}, slow={6: 1.6},
                                                 profile_steps=(1, 5), extra_steps=0))
    run = read_logs(str(tmp_path))
    assert run.alignment == "sync" and len(run.machines) == 4
    d = check_run_whatif(run, pictures=False)
    # the sync lines carry up to 20 µs of jitter: the offsets are that close
    assert not [w for w in d["warnings"] if "contradict" in w] and d["replay_error"] < 1e-4
    assert d["stragglers"] == [{"dp_rank": 1, "stage": 2}]
    raw = build_model(optrace_of_run(read_logs(str(tmp_path), align=False)))
    assert any("contradict" in w for w in raw.warnings)  # the test can tell aligned from not


def test_an_unwritable_pictures_folder_leaves_the_analysis(tmp_path, capsys):
    d, _ = _logs(tmp_path, "1f1b", 4, 8, dp=2, slow={5: 1.6}, profile_steps=(1, 4), extra_steps=0)
    (tmp_path / "file").write_text("")
    assert main(["check", d, "--json", "--out", str(tmp_path / "file" / "x")]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["whatif_stragglers"] == [{"dp_rank": 1, "stage": 1, "rank": 5}] and obj["whatif"]["pictures"] == {}
    assert any(w.startswith("no pictures: cannot write to") for w in obj["whatif"]["warnings"])
    d2, _ = _logs(tmp_path, "1f1b", 4, 8, dp=2, slow={1: 1.6, 5: 1.6}, profile_steps=(1, 4), extra_steps=0,
                  layers_per_chunk=[8, 8, 8, 8])
    assert main(["check", d2, "--json", "--out", str(tmp_path / "file" / "x")]) == 0  # layer costs unwritable
    obj = json.loads(capsys.readouterr().out)
    assert obj["whatif"] is None and "cannot write to" in obj["whatif_error"] and obj["verdict"]
