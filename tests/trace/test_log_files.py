"""Job logs are written as workerlog.<rank>.partial and renamed when the rank closes them."""
import os
import time

from pipeloom.schedule import io as schedule_io
from pipeloom.schedule.planning import make_spec, plan
from pipeloom.trace.reader import read_logs
from pipeloom.trace.writer import JobLog


def _write(tmp_path, rank, close=True, run_id="r1"):
    s = plan("1f1b", make_spec(pp=2, microbatches=2))
    log = JobLog(str(tmp_path), rank=rank, local_rank=rank, world_size=2, pp=2, dp=1, pp_rank=rank, dp_rank=0,
                 schedule=schedule_io.to_dict(s), costs=None, profile_steps=(0, 1), run_id=run_id)
    log.begin_step(0)
    t = time.time()
    for i, job in enumerate(s.devices[rank]):
        log.job(0, job.kind.value, job.mb, job.chunk, rank, t + i, t + i + 0.5)
    if close:
        log.end_step(0, 1.0)
        log.close(0)
    else:
        log.f.flush()  # the rank dies here: nothing closes the file
    return log


def test_a_closed_log_has_its_name_and_no_partial_is_left(tmp_path):
    _write(tmp_path, 0)
    assert os.listdir(tmp_path) == ["workerlog.0"]


def test_a_killed_rank_leaves_a_partial_log_that_is_read_with_a_warning(tmp_path):
    _write(tmp_path, 0)
    _write(tmp_path, 1, close=False)
    assert sorted(os.listdir(tmp_path)) == ["workerlog.0", "workerlog.1.partial"]
    run = read_logs(str(tmp_path))
    assert [r.rank for r in run.ranks] == [0, 1]
    assert any("workerlog.1.partial: rank 1's log is incomplete" in w for w in run.warnings), run.warnings


def test_the_newer_of_a_log_and_a_partial_of_the_same_rank_is_read(tmp_path):
    _write(tmp_path, 0)
    _write(tmp_path, 1, run_id="r1")
    old = tmp_path / "workerlog.1"
    os.utime(old, (time.time() - 100, time.time() - 100))
    _write(tmp_path, 1, close=False, run_id="r1")  # a rerun's rank 1 died
    run = read_logs(str(tmp_path))
    assert next(r for r in run.ranks if r.rank == 1).path.endswith("workerlog.1.partial")
