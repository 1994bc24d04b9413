"""Schedule IR: job strings, placement, CSV/JSON round trips, malformed input."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeloom import Job, Kind, Placement, Schedule
from pipeloom.schedule.planning import make_spec, plan
from pipeloom.core.errors import ScheduleFormatError
from pipeloom.core.ir import chunks_of, device_of
from pipeloom.schedule import io as schedule_io

jobs = st.builds(Job, st.sampled_from(list(Kind)), st.integers(0, 10_000), st.integers(0, 512))


@given(jobs)
def test_job_string_round_trips(job):
    assert Job.parse(str(job)) == job
    assert str(job).startswith(job.kind.value)


@pytest.mark.parametrize("bad", ["", "X1.0", "F1", "F-1.0", "F1.0.2", "BW.1", "f1.0"])
def test_job_parse_rejects_malformed(bad):
    with pytest.raises(ValueError, match="KIND MICROBATCH.CHUNK"):
        Job.parse(bad)


@given(st.integers(1, 16), st.integers(1, 6))
def test_v_placement_zigzags(pp, vpp):
    # every device holds exactly vpp chunks; consecutive chunks sit on the same or a neighbouring device,
    # and a turn (same device) happens exactly at multiples of pp
    for placement in Placement:
        for d in range(pp):
            assert len(chunks_of(d, pp, vpp, placement)) == vpp
    for k in range(pp * vpp - 1):
        a, b = device_of(k, pp, "v"), device_of(k + 1, pp, "v")
        if (k + 1) % pp == 0:
            assert a == b, "the V turns on one device"
        else:
            assert abs(a - b) == 1
        assert device_of(k, pp, "interleaved") == k % pp
    assert device_of(0, pp, "v") == 0
    if vpp >= 2:
        assert device_of(2 * pp - 1, pp, "v") == 0


def _shapes():
    return st.tuples(st.sampled_from(["fthenb", "1f1b", "eager1f1b", "interleaved"]), st.integers(1, 6),
                     st.integers(1, 3), st.integers(1, 12))


@given(_shapes())
def test_csv_and_json_round_trip(shape):
    name, pp, vpp, m = shape
    vpp = vpp if name == "interleaved" else 1
    s = plan(name, make_spec(pp=pp, microbatches=m, vpp=vpp))
    for text, parse in ((schedule_io.to_csv(s), schedule_io.from_csv), (schedule_io.to_json(s), schedule_io.from_json)):
        t = parse(text)
        assert (t.pp, t.vpp, t.microbatches, t.placement, t.devices) == (s.pp, s.vpp, s.microbatches,
                                                                           s.placement, s.devices)


def test_csv_without_header_infers_shape_and_orders_by_step():
    text = "device,step,job\n1,1,BW0.1\n0,0,F0.0\n1,0,F0.1\n0,1,BW0.0\n"
    s = schedule_io.from_csv(text)
    assert (s.pp, s.vpp, s.microbatches, s.placement) == (2, 1, 1, Placement.INTERLEAVED)
    assert [str(j) for j in s.devices[1]] == ["F0.1", "BW0.1"]


def test_csv_infers_v_placement():
    # chunk 2 of pp=2 on device 1 is only possible with the V placement
    text = "device,step,job\n0,0,F0.0\n1,0,F0.1\n1,1,F0.2\n0,1,F0.3\n"
    assert schedule_io.from_csv(text).placement is Placement.V


def test_overlapped_pairs_round_trip():
    s = Schedule("x", 1, 1, 2, "interleaved", [[Job.parse(t) for t in "F0.0 F1.0 B0.0 W0.0 B1.0 W1.0".split()]],
                 overlapped={(0, 1)})
    assert schedule_io.from_csv(schedule_io.to_csv(s)).overlapped == {(0, 1)}
    assert schedule_io.from_json(schedule_io.to_json(s)).overlapped == {(0, 1)}


@pytest.mark.parametrize("text,match", [
    ("", "no rows"),
    ("a,b,c\n1,2,3\n", "must name the columns"),
    ("device,step,job\n0,0,Q1.0\n", "line 2"),
    ("device,step,job\n0,x,F0.0\n", "line 2"),
    ("device,step,job\n0,0,F0.0\n0,0,F1.0\n", "same step"),
    ("# pipeloom schedule pp=1\ndevice,step,job\n3,0,F0.0\n", "device >= pp"),
])
def test_malformed_csv_messages(text, match):
    with pytest.raises(ScheduleFormatError, match=match):
        schedule_io.from_csv(text)


@pytest.mark.parametrize("text", ["[]", "{", '{"devices": [["F0"]]}', '{"pp": 2}'])
def test_malformed_json_messages(text):
    with pytest.raises(ScheduleFormatError):
        schedule_io.from_json(text)
