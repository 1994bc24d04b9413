"""The dependency and memory rules, against cases written out by hand (not derived from rules.py)."""
import pytest

from pipeloom.core import rules
from pipeloom.core.ir import BW, B, F, Kind, Placement, W
from pipeloom.core.rules import ACT, GRAD, WGRAD


@pytest.mark.parametrize("job, expected", [
    (F(3, 0), ()),                                          # chunk 0 reads the microbatch itself
    (F(3, 2), ((ACT, 3, 1),)),
    (B(3, 3), ((ACT, 3, 3),)),                              # the last chunk computes the loss gradient
    (B(3, 1), ((ACT, 3, 1), (GRAD, 3, 2))),
    (BW(0, 1), ((ACT, 0, 1), (GRAD, 0, 2))),
    (W(2, 1), ((GRAD, 2, 1),)),
])
def test_needs(job, expected):
    assert rules.job_needs(job, 4) == expected


def test_what_jobs_produce():
    assert rules.PRODUCES == {Kind.F: (ACT,), Kind.B: (GRAD,), Kind.W: (WGRAD,), Kind.BW: (GRAD, WGRAD)}


def test_dependencies_name_the_jobs_split_or_fused():
    assert rules.dependencies(B(0, 1), 3, split=True) == (F(0, 1), B(0, 2))
    assert rules.dependencies(BW(0, 1), 3, split=False) == (F(0, 1), BW(0, 2))
    assert rules.dependencies(W(5, 2), 3, split=True) == (B(5, 2),)


def test_handoffs_are_the_pipeline_messages():
    assert rules.handoff(Kind.F, 1, 0, 4) == ((ACT, 1, 0), 1)
    assert rules.handoff(Kind.F, 1, 3, 4) is None
    assert rules.handoff(Kind.B, 1, 2, 4) == ((GRAD, 1, 2), 1)
    assert rules.handoff(Kind.BW, 1, 0, 4) is None
    assert rules.handoff(Kind.W, 1, 2, 4) is None
    assert rules.received(Kind.B, 1, 2, 4) == (GRAD, 1, 3)
    assert rules.received(Kind.W, 1, 2, 4) is None


def test_v_placement_crossings():
    """pp 2, vpp 2, V: chunks 0, 1, 2, 3 on devices 0, 1, 1, 0; the turn 1 -> 2 stays on device 1."""
    fwd, bwd = rules.edge_comm(2, 4, Placement.V, 0.5)
    assert fwd == [0.0, 0.5, 0.0, 0.5]
    assert bwd == [0.5, 0.0, 0.5, 0.0]
    assert not rules.crosses(1, 2, 2, Placement.V) and rules.crosses(1, 2, 2, Placement.INTERLEAVED)


def test_memory_of_a_1f1b_device_list():
    """Device 0 of 1F1B at pp 3, m 4 (a = 1, b = 0.5): three warm-up forwards, then one forward one backward."""
    seq = [F(0, 0), F(1, 0), F(2, 0), B(0, 0), W(0, 0), F(3, 0), BW(1, 0), BW(2, 0), BW(3, 0)]
    peak, trace = rules.peak_memory(seq, [1.0], [0.5])
    assert trace == [1, 2, 3, 2.5, 2, 3, 2, 1, 0]
    assert peak == 3


def test_durations():
    dF, dB, dW = [1.0, 2.0], [3.0, 4.0], [5.0, 6.0]
    assert [rules.duration(k, 1, dF, dB, dW) for k in (Kind.F, Kind.B, Kind.W, Kind.BW)] == [2, 4, 6, 10]
    assert rules.durations(2, dF, dB, dW)[Kind.BW] == [8.0, 10.0]
