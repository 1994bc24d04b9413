"""The timing kernel: its Python loop, its compiled form (_accel.c) and core/rules.py held together against a
hand-written oracle (tests/ruleoracle.py) on random valid orders, random costs, per-job durations, delays,
overlapped pairs, and orders that deadlock."""
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzzplans import random_plan
from ruleoracle import chunk_dur, oracle_needs, oracle_time
from strategies import draw_costs

from pipeloom import make_spec, plan
from pipeloom.core import rules
from pipeloom.core.errors import DeadlockError
from pipeloom.core.ir import Job, Kind, Placement, Schedule
from pipeloom.sim import kernel
from pipeloom.sim.simulate import simulate

ENGINES = ["python"] + (["c"] if kernel.ext is not None else [])


@pytest.fixture(params=ENGINES)
def engine(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setenv("PIPELOOM_PURE_PYTHON", "1")
    else:
        monkeypatch.delenv("PIPELOOM_PURE_PYTHON", raising=False)
    return request.param


def _both(fn):
    """fn() under the Python loop and under the C kernel (when built): the two results."""
    import os
    out = []
    for pure in ([True, False] if kernel.ext is not None else [True]):
        old = os.environ.pop("PIPELOOM_PURE_PYTHON", None)
        if pure:
            os.environ["PIPELOOM_PURE_PYTHON"] = "1"
        try:
            try:
                out.append(("ok", fn()))
            except DeadlockError as e:
                out.append(("deadlock", sorted((d, i) for d, i, _j, _w in e.stuck)))
        finally:
            os.environ.pop("PIPELOOM_PURE_PYTHON", None)
            if old is not None:
                os.environ["PIPELOOM_PURE_PYTHON"] = old
    return out


def test_rule_tables_are_core_rules():
    """The tables both loops interpret are core/rules.py's needs, PRODUCES and comm (crosses), nothing else."""
    pp, nc = 2, 4
    t = kernel.Rules.make(pp, nc, Placement.V, 0.5)
    for k, kind in enumerate(kernel.KINDS):
        for c in range(nc):
            want = tuple((ev, c2 - c, 0.5 if rules.crosses(c2, c, pp, Placement.V) else 0.0)
                         for ev, _mb, c2 in rules.needs(kind, 0, c, nc))
            assert t.needs[k * nc + c] == want
            assert t.produces[k * nc + c] == rules.PRODUCES[kind]
    # and spelled out for V at pp 2 (chunks on devices 0, 1, 1, 0): B of chunk 1 needs its F and chunk 2's grad,
    # on the same device (no comm); F of chunk 3 needs chunk 2's activation from device 1 (comm)
    assert t.needs[1 * nc + 1] == ((rules.ACT, 0, 0.0), (rules.GRAD, 1, 0.0))
    assert t.needs[0 * nc + 3] == ((rules.ACT, -1, 0.5),)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), pp=st.integers(1, 4), vpp=st.integers(1, 3), m=st.integers(1, 5),
       placement=st.sampled_from(["interleaved", "v"]), seed=st.integers(0, 10_000))
def test_random_valid_orders_time_as_the_oracle(data, pp, vpp, m, placement, seed):
    s = random_plan(pp, vpp, m, placement=placement, seed=seed, split=data.draw(st.sampled_from([0.0, 0.5, 1.0])))
    nc = s.num_chunks
    costs = draw_costs(data.draw, nc)
    dF, dB, dW = costs.per_chunk(nc)
    want = oracle_time(s.devices, nc, pp, s.placement, chunk_dur(dF, dB, dW), costs.comm)
    assert want is not None
    tab = kernel.Rules.make(pp, nc, s.placement, costs.comm)
    for status, got in _both(lambda: kernel.time_order(s.devices, m, tab,
                                                        durations=rules.durations(nc, dF, dB, dW))):
        assert status == "ok"
        assert (got.start, got.end) == want  # exactly: the same float operations
        assert got.makespan == max((e[-1] for e in want[1] if e), default=0.0)
    # the planners' summary timer: the same makespan and sum of ends (summed device by device, in list order)
    dur_tab = kernel.duration_table(nc, dF, dB, dW)
    total = 0.0
    for e in want[1]:
        for t in e:
            total += t
    for status, got in _both(lambda: kernel.order_timer(m, tab, dur_tab)(s.devices)):
        assert status == "ok" and got == (max((e[-1] for e in want[1] if e), default=0.0), total)
    # the simulator is the kernel plus metrics
    assert simulate(s, costs).end == want[1]


@settings(max_examples=40, deadline=None)
@given(pp=st.integers(1, 4), vpp=st.integers(1, 2), m=st.integers(1, 4), seed=st.integers(0, 10_000),
       comm=st.sampled_from([0.0, 0.3]), delays=st.booleans())
def test_per_job_durations_and_delays(pp, vpp, m, seed, comm, delays):
    s = random_plan(pp, vpp, m, seed=seed)
    rng = random.Random(seed)
    jd = [[rng.choice([0.25, 1.0, 1.7, 3.0]) for _ in seq] for seq in s.devices]
    dl = [[rng.choice([0.0, 0.5]) for _ in seq] for seq in s.devices] if delays else None
    want = oracle_time(s.devices, s.num_chunks, pp, s.placement, lambda d, i, _j: jd[d][i], comm, delays=dl)
    tab = kernel.Rules.make(pp, s.num_chunks, s.placement, comm)
    for status, got in _both(lambda: kernel.time_order(s.devices, m, tab, job_durations=jd, delays=dl)):
        assert status == "ok" and (got.start, got.end) == want


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (3, 7)])
def test_overlapped_pairs_as_the_oracle(pp, m):
    spec = make_spec(pp=pp, microbatches=m, vpp=2, costs="F=1,B=2,W=1,comm=0.25")
    s = plan("dualpipev", spec)
    assert s.overlapped
    nc = s.num_chunks
    dF, dB, dW = spec.costs.per_chunk(nc)
    dur = chunk_dur(dF, dB, dW)
    pairs = {}
    for d, i in s.overlapped:
        d1, d2 = dur(d, i, s.devices[d][i]), dur(d, i + 1, s.devices[d][i + 1])
        pairs[(d, i)] = (d1, d2, 0.5 * min(d1, d2))
    want = oracle_time(s.devices, nc, pp, s.placement, dur, 0.25, pairs=pairs)
    tab = kernel.Rules.make(pp, nc, s.placement, 0.25)
    for status, got in _both(lambda: kernel.time_order(s.devices, m, tab, durations=rules.durations(nc, dF, dB, dW),
                                                        pairs=pairs)):
        assert status == "ok" and (got.start, got.end) == want


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(2, 4), vpp=st.integers(1, 2), m=st.integers(1, 4), seed=st.integers(0, 10_000))
def test_shuffled_orders_deadlock_exactly_when_the_oracle_does(pp, vpp, m, seed):
    s = random_plan(pp, vpp, m, seed=seed)
    rng = random.Random(seed)
    devs = [list(x) for x in s.devices]
    for seq in devs:  # a few random swaps: some orders still run, others block
        for _ in range(rng.randrange(3)):
            i, j = rng.randrange(len(seq)), rng.randrange(len(seq))
            seq[i], seq[j] = seq[j], seq[i]
    want = oracle_time(devs, s.num_chunks, pp, s.placement, lambda *_: 1.0)
    tab = kernel.Rules.make(pp, s.num_chunks, s.placement)
    results = _both(lambda: kernel.time_order(devs, m, tab, job_durations=[[1.0] * len(x) for x in devs]))
    for status, got in results:
        if want is None:
            assert status == "deadlock"
            # every device named is really stuck: its job at that position waits for something never produced
            for d, i in got:
                assert i < len(devs[d])
        else:
            assert status == "ok" and (got.start, got.end) == want
    assert all(r == results[0] for r in results)  # C and Python name the same stuck jobs
    # the planners' summary timer: None exactly on deadlock, else the full timing's makespan and sum of ends
    summary = _both(lambda: kernel.order_timer(m, tab, [1.0] * (4 * s.num_chunks))(devs))
    for status, got in summary:
        assert status == "ok"
        if want is None:
            assert got is None
        else:
            assert got == (max((e[-1] for e in want[1] if e), default=0.0), sum(t for e in want[1] for t in e))


def test_deadlock_names_the_stuck_jobs_and_what_they_wait_for():
    d0 = [Job.parse(t) for t in "F0.0 BW0.0 F1.0 BW1.0".split()]
    d1 = [Job.parse(t) for t in "F1.1 BW1.1 F0.1 BW0.1".split()]
    tab = kernel.Rules.make(2, 2, "interleaved")
    for status, got in _both(lambda: kernel.time_order([d0, d1], 2, tab, job_durations=[[1.0] * 4] * 2)):
        assert status == "deadlock" and got == [(0, 1), (1, 0)]
    with pytest.raises(DeadlockError, match=r"device 1 is stuck at position 0 on F1\.1, waiting for F1\.0"):
        kernel.time_order([d0, d1], 2, tab, job_durations=[[1.0] * 4] * 2)


def test_out_of_range_job_is_named(engine):
    s = Schedule("bad", 1, 1, 1, "interleaved", [[Job(Kind.F, 0, 0), Job(Kind.F, 3, 0)]])
    with pytest.raises(DeadlockError, match=r"position 1: job F3\.0 is out of range \(microbatches 0\.\.0"):
        simulate(s)
    # the summary timer refuses it too (None, as for a deadlock), and times the same list without it
    timer = kernel.order_timer(1, kernel.Rules.make(1, 1, "interleaved"), [1.0, 2.0, 1.0, 3.0])
    assert timer(s.devices) is None
    assert timer([[Job(Kind.F, 0, 0), Job(Kind.BW, 0, 0)]]) == (4.0, 5.0)


def test_the_oracle_is_the_pairing_rule_spelled_out():
    """The oracle itself against a few cases (so a wrong oracle cannot hide a wrong kernel)."""
    assert oracle_needs(Job(Kind.F, 2, 0), 3) == []
    assert oracle_needs(Job(Kind.B, 2, 1), 3) == [[Job(Kind.F, 2, 1)], [Job(Kind.B, 2, 2), Job(Kind.BW, 2, 2)]]
    assert oracle_needs(Job(Kind.BW, 2, 2), 3) == [[Job(Kind.F, 2, 2)]]
    assert oracle_needs(Job(Kind.W, 0, 1), 3) == [[Job(Kind.B, 0, 1)]]
    # 1F1B pp 2 m 2, F 1, BW 2: timed by hand
    d0 = [Job.parse(t) for t in "F0.0 F1.0 BW0.0 BW1.0".split()]
    d1 = [Job.parse(t) for t in "F0.1 BW0.1 F1.1 BW1.1".split()]
    start, end = oracle_time([d0, d1], 2, 2, "interleaved", chunk_dur([1, 1], [1, 1], [1, 1]))
    assert end == [[1, 2, 6, 9], [2, 4, 5, 7]]


def test_kernel_is_linear_in_jobs():
    """A 2-million-job order is timed in seconds (the former sweep timers were quadratic in pp)."""
    import time
    pp, m = 65_536, 1
    seqs = [[Job(Kind.F, 0, d), Job(Kind.BW, 0, d)] for d in range(pp)]
    tab = kernel.Rules.make(pp, pp, "interleaved")
    t0 = time.perf_counter()
    tm = kernel.time_order(seqs, m, tab, job_durations=[[1.0, 2.0]] * pp)
    assert tm.makespan == pp + 2 * pp
    assert time.perf_counter() - t0 < 20
