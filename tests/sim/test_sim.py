"""Simulator: closed forms, comm rule, deadlock, and the official generators' own timing."""
import math
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeloom import Costs, DeadlockError, Job, Kind, MemModel, Schedule, simulate
from pipeloom.schedule.planning import make_spec, plan
from pipeloom.core.costs import parse_mem_limit

costs_st = st.tuples(st.integers(1, 5), st.integers(1, 5), st.integers(0, 5))


@given(st.integers(1, 12), st.integers(1, 40), st.integers(1, 5), st.floats(0, 1))
def test_1f1b_bubble_closed_form(pp, m, f, split):
    # (p-1)/(m+p-1) when comm = 0 and F = BW (= B + W, split any way)
    c = Costs(F=f, B=f * split, W=f * (1 - split))
    s = plan("1f1b", make_spec(pp=pp, microbatches=m))
    r = simulate(s, c)
    assert r.bubble == pytest.approx((pp - 1) / (m + pp - 1))
    # 1F1B keeps min(pp - d, m) microbatches alive on device d
    assert r.peak_memory == [min(pp - d, m) for d in range(pp)]


@given(st.integers(1, 10), st.integers(1, 30), costs_st)
def test_fthenb_makespan_closed_form(pp, m, fbw):
    f, b, w = fbw
    r = simulate(plan("fthenb", make_spec(pp=pp, microbatches=m)), Costs(F=f, B=b, W=w))
    assert r.makespan == pytest.approx((m + pp - 1) * f + (m + pp - 1) * (b + w))
    assert r.peak_memory == [m] * pp


@given(st.integers(2, 8), st.sampled_from([1, 2, 3]), st.integers(1, 4))
def test_interleaved_bubble_closed_form(pp, vpp, k):
    # Megatron VPP with m % pp == 0, comm = 0, F = BW: bubble = (p-1) / (v*m + p - 1)
    m = k * pp
    r = simulate(plan("interleaved", make_spec(pp=pp, microbatches=m, vpp=vpp)), Costs(F=2, B=1, W=1))
    assert r.bubble == pytest.approx((pp - 1) / (vpp * m + pp - 1))


@given(st.integers(1, 6), st.integers(1, 4), st.floats(0, 3), st.floats(0.1, 3))
def test_comm_only_on_cross_device_edges(pp, vpp, comm, f):
    # one microbatch walks every chunk down and back: its critical path is the sum of all passes plus
    # comm for each edge between different devices (V placement turns on one device for free)
    for placement in ("v", "interleaved"):
        nc = pp * vpp
        from pipeloom.core.ir import device_of
        devs = [[] for _ in range(pp)]
        for c in range(nc):
            devs[device_of(c, pp, placement)].append(Job(Kind.F, 0, c))
        for c in reversed(range(nc)):
            devs[device_of(c, pp, placement)].append(Job(Kind.BW, 0, c))
        s = Schedule("chain", pp, vpp, 1, placement, devs)
        crossings = sum(device_of(c, pp, placement) != device_of(c + 1, pp, placement) for c in range(nc - 1))
        r = simulate(s, Costs(F=f, B=1, W=0.5, comm=comm))
        assert r.makespan == pytest.approx(nc * (f + 1.5) + 2 * crossings * comm)


def test_deadlock_is_reported_with_devices():
    d0 = [Job.parse(t) for t in "F0.0 BW0.0 F1.0 BW1.0".split()]
    d1 = [Job.parse(t) for t in "F1.1 BW1.1 F0.1 BW0.1".split()]
    s = Schedule("cycle", 2, 1, 2, "interleaved", [d0, d1])
    with pytest.raises(DeadlockError) as e:
        simulate(s)
    assert "device 0" in str(e.value) and "device 1" in str(e.value)
    assert {x[0] for x in e.value.stuck} == {0, 1}


def test_per_chunk_costs_shift_the_bottleneck():
    # a slow last chunk lengthens 1F1B by (m-1) * its extra time per pass pair
    base = simulate(plan("1f1b", make_spec(pp=4, microbatches=8)), Costs(F=1, B=1, W=0)).makespan
    slow = simulate(plan("1f1b", make_spec(pp=4, microbatches=8)), Costs(F=(1, 1, 1, 2), B=(1, 1, 1, 2), W=0))
    assert slow.makespan == pytest.approx(base + 8 * 2)
    assert max(slow.busy) == pytest.approx(8 * 4)


@pytest.mark.parametrize("text,pp,expect", [
    ("none", 4, None), ("1p", 4, 4.0), ("1.5p", 4, 6.0), ("2p", 8, 16.0), ("3.5", 2, 3.5), (7, 3, 7.0),
])
def test_parse_mem_limit(text, pp, expect):
    assert parse_mem_limit(text, pp) == expect


@pytest.mark.parametrize("bad", ["abc", "-1", "0", "1q", "p"])
def test_parse_mem_limit_rejects(bad):
    with pytest.raises(ValueError):
        parse_mem_limit(bad, 4)


def test_costs_parse():
    c = Costs.parse("F=1,B=2,W=0.5,comm=1")
    assert (c.F, c.B, c.W, c.comm) == (1, 2, 0.5, 1)
    assert Costs.parse("F=1:2").per_chunk(2)[0] == [1, 2]
    for bad in ("F=-1", "X=1", "F", "F=abc"):
        with pytest.raises(ValueError):
            Costs.parse(bad)
    with pytest.raises(ValueError, match="per-chunk"):
        Costs(F=(1, 2)).per_chunk(3)


def _ref_schedule(case) -> Schedule:
    pp, vpp = case["pp"], case["vpp"]
    devs = []
    for d, seq in enumerate(case["jobs"]):
        out = []
        for text in seq:
            kind = "BW" if text.startswith("BW") else text[0]
            mb, local = text[len(kind):].split("c")
            chunk = d if int(local) == 0 else 2 * pp - 1 - d
            out.append(Job(Kind(kind), int(mb), chunk))
        devs.append(out)
    return Schedule(case["id"], pp, vpp, case["microbatches"], "v" if vpp == 2 else "interleaved", devs)


def test_simulator_matches_official_generators(reference_cases):
    """Re-time every official job list: makespan, bubbles and peak memory must equal the generators' own."""
    assert len(reference_cases) >= 100
    for case in reference_cases:
        s = _ref_schedule(case)
        c = case["costs"]
        r = simulate(s, Costs(F=c["F"], B=c["B"], W=c["W"], comm=c["comm"]), MemModel())
        assert r.makespan == pytest.approx(case["makespan"]), case["id"]
        assert r.bubble == pytest.approx(case["bubble"], abs=1e-4), case["id"]
        assert r.stage_bubble == pytest.approx(case["stage_bubble"], abs=1e-4), case["id"]
        assert r.peak_memory == pytest.approx(case["peak_memory"]), case["id"]


def test_simulator_speed_200k_jobs():
    # issue 3: pp=64, vpp=2, m=512 in well under a second (generous bound for a loaded CI machine)
    s = plan("interleaved", make_spec(pp=64, microbatches=512, vpp=2), check=False)
    assert s.num_jobs == 64 * 2 * 512 * 2
    t0 = time.perf_counter()
    r = simulate(s)
    dt = time.perf_counter() - t0
    assert math.isfinite(r.makespan)
    assert dt < 1.5, f"simulating {s.num_jobs} jobs took {dt:.2f} s"
