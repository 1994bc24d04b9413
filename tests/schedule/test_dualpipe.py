"""DualPipeV: validity for any (pp, m), overlapped pairs, the DeepSeek bubble formula, memory."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.schedule.planning import make_spec, plan
from pipeloom.core.ir import Kind, Placement, Schedule
from pipeloom.core.errors import ScheduleError
from pipeloom.schedule.validate import validate
from pipeloom.core.costs import Costs
from pipeloom.sim.simulate import memory_profile, simulate


def build(pp, m, costs=None, **kw):
    spec = make_spec(pp=pp, microbatches=m, vpp=2, costs=costs, **kw)
    return spec, plan("dualpipev", spec)


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(1, 8), m=st.integers(1, 40), f=st.sampled_from([1, 2, 0.5]), b=st.sampled_from([1, 2, 3]),
       w=st.sampled_from([0.5, 1, 2]), comm=st.sampled_from([0, 0.5, 1]), ov=st.sampled_from([0, 0.5, 1]))
def test_valid_for_any_shape(pp, m, f, b, w, comm, ov):
    costs = Costs(F=f, B=b, W=w, comm=comm, overlap=ov)
    spec, s = build(pp, m, costs)
    assert validate(s, mem=spec.mem) == []
    assert s.placement is Placement.V and s.vpp == 2
    r = simulate(s, costs)
    total = sum(len(d) for d in s.devices)
    assert total == 3 * m * 2 * pp - sum(1 for _, _, j in s.jobs() if j.kind is Kind.BW)
    # overlapped pairs: a forward with a backward of a different microbatch, on other chunks
    for d, i in s.overlapped:
        a, b_ = s.devices[d][i], s.devices[d][i + 1]
        assert a.kind is Kind.F and b_.kind in (Kind.B, Kind.BW)
        assert a.mb != b_.mb
        assert r.start[d][i] == r.start[d][i + 1]
    # a device never idles more than its work allows: makespan >= busiest device
    assert r.makespan >= max(r.busy) - 1e-9


# deepseek-ai/DualPipe ``DualPipeV.step`` worked through by hand for pp 2, m 4 (its eight steps per rank; rank r
# holds chunk r going down and chunk 2pp-1-r coming back up; [X Y] = ``_forward_backward_chunk``, an overlapped
# pair; B then W = ``enable_zb`` (W deferred, FIFO), BW = a plain backward):
#   rank 0: step 1 F F | 2 F F | 3 B W F | 4 [F BW] [F BW] | 5 BW [F BW] | 6 BW B (zb from the middle) | 7 W B | 8 W
#   rank 1 (last): 2 (F F) x2 | 4 F BW (not overlapped on the last rank), [F BW], [F BW] [F BW] | 6 BW BW, B B | 8 W W
DUALPIPEV_PP2_M4 = (
    "F0.0 F1.0 F2.0 F0.3 B0.3 W0.3 F1.3 F3.0 BW1.3 F2.3 BW0.0 BW2.3 F3.3 BW1.0 BW3.3 B2.0 W2.0 B3.0 W3.0",
    "F0.1 F0.2 F1.1 F1.2 F2.1 BW0.2 F2.2 BW0.1 F3.1 BW1.2 F3.2 BW1.1 BW2.2 BW2.1 B3.2 B3.1 W3.2 W3.1",
)
DUALPIPEV_PP2_M4_PAIRS = {(0, 7), (0, 9), (0, 12), (1, 6), (1, 8), (1, 10)}


def test_matches_the_official_program_worked_by_hand():
    _, s = build(2, 4)
    assert [" ".join(str(j) for j in seq) for seq in s.devices] == list(DUALPIPEV_PP2_M4)
    assert set(s.overlapped) == DUALPIPEV_PP2_M4_PAIRS


def test_fewer_microbatches_than_2pp_drop_the_missing_ones():
    """m 3 < 2pp: the pp 2, m 4 program without microbatch 3; a pair that lost its forward runs alone."""
    _, s = build(2, 3)
    assert [" ".join(str(j) for j in seq) for seq in s.devices] == [
        "F0.0 F1.0 F2.0 F0.3 B0.3 W0.3 F1.3 BW1.3 F2.3 BW0.0 BW2.3 BW1.0 B2.0 W2.0",
        "F0.1 F0.2 F1.1 F1.2 F2.1 BW0.2 F2.2 BW0.1 BW1.2 BW1.1 BW2.2 BW2.1"]
    assert set(s.overlapped) == {(0, 8), (1, 6)}


@settings(max_examples=30, deadline=None)
@given(pp=st.integers(1, 8), m=st.integers(1, 24))
def test_small_m_is_the_2pp_plan_with_microbatches_dropped(pp, m):
    _, s = build(pp, m)
    _, full = build(pp, max(m, 2 * pp))
    for d in range(pp):
        assert list(s.devices[d]) == [j for j in full.devices[d] if j.mb < m]


@settings(max_examples=25, deadline=None)
@given(pp=st.integers(2, 6), extra=st.integers(0, 10), f=st.sampled_from([1, 2, 3]),
       b=st.sampled_from([1, 2, 3]), w=st.sampled_from([1, 2]))
def test_overlap_only_helps(pp, extra, f, b, w):
    m = 2 * pp + extra
    spans = []
    for ov in (0.0, 0.5, 1.0):
        costs = Costs(F=f, B=b, W=w, overlap=ov)
        _, s = build(pp, m, costs)
        spans.append(simulate(s, costs).makespan)
    assert spans[0] >= spans[1] >= spans[2]
    assert spans[2] < spans[0]  # there are pairs in the steady phase, so overlap saves time
    # without overlap a pair only costs: it waits until both of its jobs are ready, so the same
    # order run without pairs is never slower than overlap=0
    costs = Costs(F=f, B=b, W=w)
    _, plain = build(pp, m, costs, options={"overlap_pairs": False})
    assert not plain.overlapped and plain.devices == build(pp, m, costs)[1].devices
    assert simulate(plain, costs).makespan <= spans[0]


@settings(max_examples=40, deadline=None)
@given(pp=st.integers(2, 8), extra=st.integers(0, 12), f=st.sampled_from([1, 2, 3, 4]),
       wfrac=st.sampled_from([0.25, 0.5, 1.0]), ov=st.sampled_from([0.0, 0.5, 1.0]))
def test_deepseek_bubble_formula(pp, extra, f, wfrac, ov):
    """DeepSeek-V3: DualPipe bubble (PP/2 - 1)(F&B + B_full - 3W), DualPipeV on pp devices = DualPipe on 2pp.

    pipeloom's B is the input-grad part, so DeepSeek's full backward is B + W, and F&B is the
    overlapped pair F + (B+W) - overlap*min(F, B+W). The simulated bubble of every device
    (makespan - busy) matches exactly when B = F and W <= F (measured; outside that regime the
    formula is only an estimate, see docs/readme/45-optimal-dualpipe.md).
    """
    m = 2 * pp + extra
    b, w = f, f * wfrac
    costs = Costs(F=f, B=b, W=w, overlap=ov)
    _, s = build(pp, m, costs)
    r = simulate(s, costs)
    fb = f + (b + w) - ov * min(f, b + w)
    formula = (pp - 1) * (fb + (b + w) - 3 * w)
    assert max(r.makespan - x for x in r.busy) == pytest.approx(formula)


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 8])
def test_peak_memory_and_limit(pp):
    # warm-up leaves 2pp chunk activations (a = 1/2 unit each) on device 0; the first overlapped
    # pair runs its forward before its backward frees, one more: pp + 1/2 units
    spec, s = build(pp, 4 * pp)
    peaks, _ = memory_profile(s, spec.mem)
    assert max(peaks) == pytest.approx(pp + 0.5)
    with pytest.raises(ScheduleError, match="dualpipev needs"):
        build(pp, 4 * pp, mem_limit="1p")
    build(pp, 4 * pp, mem_limit=pp + 0.5)


def test_uses_split_backward_to_fill_bubbles():
    _, s = build(4, 16)
    kinds = {j.kind for _, _, j in s.jobs()}
    assert {Kind.B, Kind.W, Kind.BW} <= kinds
    # W is deferred: on the last device Ws run after later backwards (not right after their own B)
    seq = s.devices[-1]
    pos = {j: i for i, j in enumerate(seq)}
    assert any(pos[j] > pos[j._replace(kind=Kind.B)] + 1 for j in seq if j.kind is Kind.W)


def test_unknown_option():
    with pytest.raises(ScheduleError, match="unknown option"):
        build(2, 4, options={"nope": 1})


def test_overlap_cost_option_parses_from_cli_string():
    spec, s = build(4, 8, "F=1,B=1,W=1,overlap=1")
    assert spec.costs.overlap == 1.0
    assert simulate(s, spec.costs).makespan < simulate(Schedule(s.name, 4, 2, 8, s.placement, s.devices),
                                                        spec.costs).makespan
