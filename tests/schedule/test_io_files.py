"""Schedule files: written whole or not at all, read strictly, sized from their content."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from pipeloom.core.errors import ScheduleFormatError
from pipeloom.core.files import atomic_write
from pipeloom.schedule import io as schedule_io
from pipeloom.schedule.planning import make_spec, plan

CSV = ("# pipeloom schedule name=t pp=2 vpp=1 microbatches=1 placement=interleaved\n"
       "device,step,job,overlap\n0,0,F0.0,{o}\n0,1,BW0.0,0\n1,0,F0.1,0\n1,1,BW0.1,0\n")


def test_a_failed_write_keeps_the_old_file_and_names_it(tmp_path):
    """A file-size limit hit half-way: the old plan survives, no temporary is left, the error names the file."""
    keep = tmp_path / "keep.csv"
    schedule_io.save(plan("1f1b", make_spec(pp=2, microbatches=2)), str(keep))
    before = keep.read_bytes()
    code = ("import resource, sys; from pipeloom.cli import main;"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (16384, resource.RLIM_INFINITY));"
            f"sys.exit(main(['plan', '-s', '1f1b', '--pp', '8', '-m', '400', '--out', {str(keep)!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(keep) in lines[0] and "File too large" in lines[0], r.stderr
    assert keep.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["keep.csv"]


def test_an_exception_while_writing_leaves_nothing(tmp_path):
    target = tmp_path / "x.json"
    with pytest.raises(RuntimeError):
        with atomic_write(target) as fh:
            fh.write("half")
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_devices_are_written_in_place_not_replaced():
    with atomic_write(os.devnull) as fh:
        fh.write("nothing")
    assert not os.path.isfile(os.devnull)  # still the device, not a regular file put in its place
    if os.path.exists("/dev/full"):
        with pytest.raises(OSError) as e:
            with atomic_write("/dev/full") as fh:
                fh.write("x" * 100_000)
        assert e.value.filename == "/dev/full"


@pytest.mark.parametrize("value", ["no", "false", "yes", "2", "true"])
def test_overlap_column_takes_only_the_documented_values(value):
    with pytest.raises(ScheduleFormatError, match=f"line 3: overlap must be 0, 1 or empty, got '{value}'"):
        schedule_io.from_csv(CSV.format(o=value))


@pytest.mark.parametrize("value, overlapped", [("", set()), ("0", set()), ("1", {(0, 0)})])
def test_overlap_values_that_are_allowed(value, overlapped):
    assert set(schedule_io.from_csv(CSV.format(o=value)).overlapped) == overlapped


def test_a_byte_order_mark_is_accepted(tmp_path):
    s = plan("1f1b", make_spec(pp=2, microbatches=3))
    for name, text in (("p.csv", schedule_io.to_csv(s)), ("p.json", schedule_io.to_json(s))):
        (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text.encode())
        assert schedule_io.load(str(tmp_path / name)).devices == s.devices


def test_header_only_csv_and_unknown_placement_are_clear():
    with pytest.raises(ScheduleFormatError, match="column header but no job rows"):
        schedule_io.from_csv("device,step,job\n")
    with pytest.raises(ScheduleFormatError, match="placement must be one of interleaved, v, got 'zigzag'"):
        schedule_io.from_csv(CSV.format(o=0).replace("placement=interleaved", "placement=zigzag"))


@pytest.mark.parametrize("field", ["pp", "microbatches", "vpp"])
def test_an_absurd_header_is_refused_before_anything_is_allocated(field):
    text = CSV.format(o=0).replace(f"{field}=", f"{field}=100000000000 x=")
    t = time.perf_counter()
    with pytest.raises(ScheduleFormatError, match="more than the 10,000,000 a schedule file may describe"):
        schedule_io.from_csv(text)
    with pytest.raises(ScheduleFormatError, match="schedule JSON: .* more than the 10,000,000"):
        schedule_io.from_dict({**schedule_io.to_dict(schedule_io.from_csv(CSV.format(o=0))), field: 10 ** 11})
    assert time.perf_counter() - t < 1.0


def test_a_header_far_beyond_the_rows_is_refused_but_a_few_missing_jobs_reach_the_validator():
    with pytest.raises(ScheduleFormatError, match="needs at least 2,000,000 jobs .* holds only 4"):
        schedule_io.from_csv(CSV.format(o=0).replace("microbatches=1", "microbatches=1000000"))
    s = schedule_io.from_csv(CSV.format(o=0).replace("microbatches=1", "microbatches=3"))
    assert s.microbatches == 3  # the validator then names F1.0, F2.0, ... as missing
