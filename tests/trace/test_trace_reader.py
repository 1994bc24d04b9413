"""Worker-log ingestion: layouts, profiled window, malformed lines, clock alignment, seed-003 text form."""
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom import make_spec, plan
from pipeloom.trace.reader import LogError, parse_file, read_logs
from pipeloom.trace.synth import SynthConfig, generate, write_logs
from pipeloom.schedule import io as schedule_io


def _sched(name="1f1b", pp=4, m=8, vpp=1):
    return plan(name, make_spec(pp=pp, microbatches=m, vpp=vpp))


def _true_jobs(sched, cfg):
    """(rank, step, job) -> (start, end) on the true clock, profiled steps only."""
    a, b = cfg.profile_steps
    out = {}
    for rank, evs in generate(sched, cfg).items():
        for e in evs:
            if e["event"] == "job" and a <= e["step"] < b:
                out[(rank, e["step"], f"{e['kind']}{e['mb']}.{e['chunk']}")] = (e["start"], e["end"])
    return out


def test_flat_layout_window_and_counts(tmp_path):
    sched = _sched()
    cfg = SynthConfig(profile_steps=(3, 5), extra_steps=2)
    write_logs(str(tmp_path), sched, cfg)
    run = read_logs(str(tmp_path))
    assert run.steps == [3, 4]
    assert run.schedule == sched and run.pp == 4 and run.dp == 1
    assert sum(len(r.jobs) for r in run.ranks) == 2 * sched.num_jobs
    assert sum(r.dropped_jobs for r in run.ranks) == 2 * sched.num_jobs  # steps 1 and 2 dropped
    assert run.alignment == "single clock" and run.malformed == 0


@settings(max_examples=8)
@given(skew=st.floats(-50.0, 50.0), sync=st.booleans(), machines=st.sampled_from([2, 4]))
def test_clock_skew_between_machines_is_removed(tmp_path_factory, skew, sync, machines):
    """Machine k's clock runs k*skew ahead; after alignment every job is where it truly ran (up to 1 ms)."""
    tmp = tmp_path_factory.mktemp("skew")
    sched = _sched()
    cfg = SynthConfig(machines=machines, skew={k: k * skew for k in range(machines)}, sync=sync,
                      costs=__import__("pipeloom").Costs(comm=0.25))
    write_logs(str(tmp), sched, cfg)
    run = read_logs(str(tmp))
    assert run.alignment == ("sync" if sync else "p2p")
    assert sorted(run.offsets) == [f"machine{k}" for k in range(machines)]
    for k in range(machines):
        assert run.offsets[f"machine{k}"] == pytest.approx(k * skew, abs=1e-3)
    truth = _true_jobs(sched, cfg)
    for r in run.ranks:
        for j in r.jobs:
            s, e = truth[(r.rank, j.step, f"{j.kind}{j.mb}.{j.chunk}")]
            assert j.start == pytest.approx(s, abs=1e-3) and j.end == pytest.approx(e, abs=1e-3)


def test_machine_layout_is_read(tmp_path):
    sched = _sched()
    write_logs(str(tmp_path), sched, SynthConfig(machines=2))
    assert sorted(os.listdir(tmp_path)) == ["machine0", "machine1"]
    assert sorted(os.listdir(tmp_path / "machine1")) == ["workerlog.0", "workerlog.1"]
    run = read_logs(str(tmp_path))
    assert [r.rank for r in run.ranks] == [0, 1, 2, 3]
    assert [r.machine for r in run.ranks] == [0, 0, 1, 1]


def test_malformed_and_truncated_lines_are_counted_not_fatal(tmp_path):
    sched = _sched()
    write_logs(str(tmp_path), sched, SynthConfig(malformed=3))
    run = read_logs(str(tmp_path))
    assert run.malformed == 4 * 4  # 3 garbage + 1 truncated per file
    assert sum(len(r.jobs) for r in run.ranks) == 2 * sched.num_jobs
    assert all(r.examples for r in run.ranks)
    assert any("malformed" in w for w in run.warnings)


def test_bad_field_values_are_malformed(tmp_path):
    p = tmp_path / "workerlog.0"
    lines = [
        {"event": "job", "step": 0, "kind": "F", "mb": 0, "chunk": 0, "start": 2.0, "end": 1.0},  # ends before start
        {"event": "job", "step": 0, "kind": "F", "mb": -1, "chunk": 0, "start": 1.0, "end": 2.0},
        {"event": "job", "step": 0, "kind": "F", "mb": 0, "chunk": 0, "start": "x", "end": 2.0},
        {"event": "job", "step": 0, "kind": "F", "mb": 0},
        {"no_event": 1},
        [1, 2],
        {"event": "job", "step": 0, "kind": "F", "mb": 0, "chunk": 0, "start": 1.0, "end": 2.0},  # good
        {"event": "gpu_util", "value": 3},  # unknown event: ignored, counted
    ]
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\nplain framework output\n")
    log = parse_file(str(p), None, 0)
    assert log.malformed == 6
    assert len(log.jobs) == 1
    assert log.unknown_events["gpu_util"] == 1


def test_seed003_text_form_with_steps_and_noise(tmp_path):
    sched = _sched("interleaved", 4, 8, 2)
    cfg = SynthConfig(text_form=True, machines=2, skew={1: 7.0}, malformed=1, profile_steps=(0, 3), extra_steps=0)
    write_logs(str(tmp_path), sched, cfg)
    run = read_logs(str(tmp_path))
    assert run.schedule_inferred
    assert run.steps == [0, 1, 2]
    assert run.schedule.devices == sched.devices  # order of the first step, chunks made global
    assert run.alignment == "p2p"
    assert run.offsets["machine1"] == pytest.approx(7.0, abs=1e-3)
    assert run.malformed == 4 * 2


def test_text_form_single_file_and_optimizer_lines(tmp_path):
    p = tmp_path / "workerlog.0"
    p.write_text(
        "Profiler Info: Job (0), type = forward, micro_batch_id = 0, job_start_time = 10.0, job_end_time = 11.0\n"
        "Profiler Info: Job (1), type = backward, micro_batch_id = 0, job_start_time = 11.0, job_end_time = 13.0\n"
        "Profiler Info: Job (2), type = optimizer, micro_batch_id = 0, job_start_time = 13.0, job_end_time = 13.5\n"
        "Profiler Info: Job (3), type = forward, micro_batch_id = 0, job_start_time = 14.0, job_end_time = 15.0\n"
        "Profiler Info: Job (4), type = backward, micro_batch_id = 0, job_start_time = 15.0, job_end_time = 17."
    )
    log = parse_file(str(p), None, 0)
    assert [(j.kind, j.step) for j in log.jobs] == [("F", 0), ("BW", 0), ("F", 1), ("BW", 1)]
    assert log.unknown_events["optimizer"] == 1


def test_unreadable_inputs_raise_log_error(tmp_path):
    with pytest.raises(LogError, match="neither a directory nor a file"):
        read_logs(str(tmp_path / "missing"))
    with pytest.raises(LogError, match="no worker logs"):
        read_logs(str(tmp_path))
    (tmp_path / "workerlog.0").write_text("{garbage\n")
    with pytest.raises(LogError, match="no job records"):
        read_logs(str(tmp_path))


def test_waits_logged_inside_jobs_are_moved_out(tmp_path):
    """A runtime timer that starts before the receive: rank 1's F0.1 'starts' before F0.0 ends."""
    sched = _sched("1f1b", 2, 1)
    meta = {"event": "meta", "pp": 2, "dp": 1, "dp_rank": 0, "schedule": schedule_io.to_dict(sched), "profile_steps": [0, 1]}
    jobs = {0: [("F", 0, 0, 10.0, 11.0), ("BW", 0, 0, 11.0, 15.0)],  # BW0.0 waits for BW0.1 (ends 14)
            1: [("F", 0, 1, 10.0, 12.0), ("BW", 0, 1, 12.0, 14.0)]}  # F0.1 waited 1 s for F0.0
    for rank, js in jobs.items():
        lines = [dict(meta, rank=rank, pp_rank=rank)] + [
            {"event": "job", "step": 0, "kind": k, "mb": m, "chunk": c, "device": rank, "start": s, "end": e}
            for k, m, c, s, e in js]
        (tmp_path / f"workerlog.{rank}").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    run = read_logs(str(tmp_path))
    got = {(r.rank, f"{j.kind}{j.mb}.{j.chunk}"): (j.start, j.end, j.wait) for r in run.ranks for j in r.jobs}
    assert got[(1, "F0.1")] == (11.0, 12.0, 1.0)
    assert got[(0, "BW0.0")] == (14.0, 15.0, 3.0)
    assert got[(0, "F0.0")] == (10.0, 11.0, 0.0) and got[(1, "BW0.1")] == (12.0, 14.0, 0.0)
    assert run.clipped_jobs == 2 and run.clipped_s == pytest.approx(4.0)
    assert any("before their input existed" in w for w in run.warnings)
