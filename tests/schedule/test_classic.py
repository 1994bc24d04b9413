"""Classic builders over many shapes: valid, memory as expected, seed 002's VPP rules."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeloom import Costs, Kind, simulate, validate
from pipeloom.schedule.planning import make_spec, plan
from pipeloom.schedule.classic import microbatch_groups


@given(st.sampled_from(["fthenb", "1f1b", "eager1f1b"]), st.integers(1, 16), st.integers(1, 64))
def test_one_chunk_builders_valid(name, pp, m):
    s = plan(name, make_spec(pp=pp, microbatches=m))
    assert validate(s) == []
    assert s.num_jobs == 2 * pp * m


@given(st.integers(1, 12), st.integers(1, 4), st.integers(1, 50), st.sampled_from(["spread", "last"]))
def test_interleaved_valid_for_every_m(pp, vpp, m, remainder):
    s = plan("interleaved", make_spec(pp=pp, microbatches=m, vpp=vpp, options={"remainder": remainder}))
    assert validate(s) == []


@given(st.integers(2, 8), st.integers(2, 4), st.integers(1, 4))
def test_balanced_vpp_follows_seed_002(pp, vpp, k):
    """m % pp == 0: the k-th forward micro-step runs chunk (k % (pp*vpp)) // pp; warm-up count formula."""
    m = k * pp
    s = plan("interleaved", make_spec(pp=pp, microbatches=m, vpp=vpp))
    for d, seq in enumerate(s.devices):
        fwd = [j for j in seq if j.kind is Kind.F]
        local = [(j.chunk - d) // pp for j in fwd]
        assert local == [(i % (pp * vpp)) // pp for i in range(m * vpp)]
        bwd = [j for j in seq if j.kind is Kind.BW]
        assert [(j.chunk - d) // pp for j in bwd] == [vpp - 1 - (i % (pp * vpp)) // pp for i in range(m * vpp)]
        first_b = next(i for i, j in enumerate(seq) if j.kind is Kind.BW)
        warm = 2 * (pp - d - 1) + (vpp - 1) * pp
        assert first_b == min(warm, m * vpp) + (1 if warm < m * vpp else 0)


def test_remainder_spread_beats_remainder_last():
    """Seed 002: 'remainder last' leaves a long tail; spreading the remainder cuts the bubble."""
    c = Costs(F=1, B=2, W=0)
    gains = []
    for m in (5, 6, 7, 9, 10, 11):
        last = simulate(plan("interleaved", make_spec(pp=4, microbatches=m, vpp=2, options={"remainder": "last"})), c)
        spread = simulate(plan("interleaved", make_spec(pp=4, microbatches=m, vpp=2)), c)
        assert spread.bubble <= last.bubble + 1e-12
        gains.append(last.bubble - spread.bubble)
    assert max(gains) > 0.1


@given(st.integers(1, 100), st.integers(1, 16), st.sampled_from(["spread", "last"]))
def test_microbatch_groups_partition(m, pp, remainder):
    groups = microbatch_groups(m, pp, remainder)
    assert [x for g in groups for x in g] == list(range(m))
    if m >= pp and remainder == "spread":
        assert all(pp <= len(g) < 2 * pp for g in groups)


def test_1f1b_memory_below_fthenb():
    a = simulate(plan("1f1b", make_spec(pp=4, microbatches=16)))
    b = simulate(plan("fthenb", make_spec(pp=4, microbatches=16)))
    assert max(a.peak_memory) == 4 and max(b.peak_memory) == 16
    assert a.makespan == pytest.approx(b.makespan)  # 1F1B changes memory, not time (seed 002)


def test_1f1b_no_slower_than_official(reference_cases):
    """Issue 3: with the official generator's costs our 1f1b never has a larger makespan than its 1F1B."""
    cases = [c for c in reference_cases if c["generator"] == "1f1b"]
    assert cases
    for case in cases:
        k = case["costs"]
        spec = make_spec(pp=case["pp"], microbatches=case["microbatches"],
                         costs=Costs(F=k["F"], B=k["B"], W=k["W"], comm=k["comm"]))
        r = simulate(plan("1f1b", spec), spec.costs)
        assert r.makespan <= case["makespan"] + 1e-9, case["id"]
        assert max(r.peak_memory) <= max(case["peak_memory"]) + 1e-9, case["id"]
