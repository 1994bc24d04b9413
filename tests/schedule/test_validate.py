"""Validator: each rule is enforced with a message naming device, job and reason."""
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeloom import DeadlockError, Job, Schedule, simulate, validate
from pipeloom.schedule.planning import make_spec, plan
from pipeloom.core.errors import ValidationError
from pipeloom.schedule.validate import check


def _s(devs, pp=2, vpp=1, m=2, placement="interleaved"):
    return Schedule("t", pp, vpp, m, placement, [[Job.parse(t) for t in d.split()] for d in devs])


GOOD = ["F0.0 F1.0 BW0.0 BW1.0", "F0.1 BW0.1 F1.1 BW1.1"]


def test_good_schedule_has_no_violations():
    assert validate(_s(GOOD)) == []


def test_missing_job():
    v = validate(_s(["F0.0 F1.0 BW0.0", GOOD[1]]))
    assert any("BW" not in x and "B1.0 is missing" in x for x in v) or any("missing" in x for x in v)
    assert any("device 0" in x for x in v)


def test_duplicate_job():
    v = validate(_s(["F0.0 F1.0 F1.0 BW0.0 BW1.0", GOOD[1]]))
    assert any("F1.0 appears 2 times" in x for x in v)


def test_wrong_device():
    v = validate(_s(["F0.0 F1.0 BW0.0 BW1.0 ", "F0.1 BW0.1 F1.1 BW1.1"], pp=2).__class__(
        "t", 2, 1, 2, "interleaved",
        [[Job.parse(t) for t in "F0.0 F1.0 F0.1 BW0.0 BW1.0".split()], [Job.parse(t) for t in "BW0.1 F1.1 BW1.1".split()]]))
    assert any("F0.1 belongs on device 1" in x for x in v)


def test_mixed_bw_and_split():
    v = validate(_s(["F0.0 F1.0 BW0.0 B1.0 W1.0 BW1.0", GOOD[1]]))
    assert any("both BW and B/W" in x for x in v)


def test_same_device_order_is_named():
    v = validate(_s(["F0.0 F1.0 BW0.0 BW1.0", "F0.1 BW0.1 BW1.1 F1.1"]))
    assert any("device 1 position 2: BW1.1 runs before F1.1" in x for x in v)
    v = validate(_s(["F0.0 F1.0 W0.0 B0.0 BW1.0", GOOD[1]]))
    assert any("W0.0 runs before B0.0" in x for x in v)


def test_cross_device_deadlock():
    v = validate(_s(["F0.0 BW0.0 F1.0 BW1.0", "F1.1 BW1.1 F0.1 BW0.1"]))
    assert len(v) == 1 and v[0].startswith("deadlock") and "device 0" in v[0]


def test_out_of_range():
    v = validate(_s(["F0.0 F1.0 F5.0 BW0.0 BW1.0", "F0.1 BW0.1 F1.1 BW1.1 F0.7"]))
    assert any("microbatch 5" in x for x in v) and any("chunk 7" in x for x in v)


def test_memory_limit():
    s = plan("fthenb", make_spec(pp=2, microbatches=4))
    assert validate(s, mem_limit=4) == []
    v = validate(s, mem_limit=3.5)
    assert v == [f"device {d}: peak memory 4 units exceeds the limit 3.5" for d in range(2)]
    with pytest.raises(ValidationError, match="exceeds the limit"):
        check(s, mem_limit=3)


@given(st.integers(1, 5), st.integers(1, 6), st.integers(0, 10_000))
def test_validator_agrees_with_simulator_on_shuffled_lists(pp, m, seed):
    """Shuffle one device's list: the validator accepts exactly the orders that execute."""
    s = plan("1f1b", make_spec(pp=pp, microbatches=m))
    rnd = random.Random(seed)
    devs = [list(d) for d in s.devices]
    d = rnd.randrange(pp)
    rnd.shuffle(devs[d])
    t = Schedule("shuffled", pp, 1, m, "interleaved", devs)
    v = validate(t)
    try:
        simulate(t)
        runs = True
    except DeadlockError:
        runs = False
    same_device_ok = all(
        devs[d].index(Job.parse(f"F{j.mb}.{j.chunk}")) < i for i, j in enumerate(devs[d]) if j.kind.value == "BW")
    assert (v == []) == (runs and same_device_ok)
