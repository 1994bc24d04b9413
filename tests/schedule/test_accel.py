"""The C greedy pass (_accel.c) is a transcription of the Python pass: identical results."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom import MemModel
from pipeloom.schedule.search import greedy as g, portfolio
from pipeloom.core.ir import Placement
from strategies import draw_costs

pytestmark = pytest.mark.skipif(g._accel is None, reason="C extension not built (pip install -e . builds it)")


def _same(r_c, r_py):
    if r_py is None:
        assert r_c is None
        return
    assert r_c is not None
    assert r_c.seqs == r_py.seqs
    assert [list(o) for o in r_c.order] == r_py.order
    assert (r_c.makespan, r_c.peak, r_c.ends, r_c.starts) == (r_py.makespan, r_py.peak, r_py.ends, r_py.starts)
    assert [[type(j) for j in s] for s in r_c.seqs] == [[type(j) for j in s] for s in r_py.seqs]


@st.composite
def problems(draw):
    pp = draw(st.integers(1, 8))
    vpp = draw(st.integers(1, 4))
    m = draw(st.integers(1, 24))
    placement = draw(st.sampled_from([Placement.V, Placement.INTERLEAVED])) if vpp > 1 else Placement.INTERLEAVED
    costs = draw_costs(draw, pp * vpp)
    prob = g.make_problem(pp, vpp, m, placement, costs, MemModel(), None)
    lo = g.min_feasible_limit(prob)
    limit = draw(st.sampled_from([None, lo, 0.75 * pp, pp, 1.5 * pp, 2 * pp]))
    if limit is not None:
        prob = g.make_problem(pp, vpp, m, placement, costs, MemModel(), max(limit, lo))
    return prob


@settings(max_examples=150, deadline=None)
@given(problems(), st.data())
def test_c_pass_equals_python_pass(prob, data):
    grid = portfolio.policy_grid(prob)
    for pol in data.draw(st.lists(st.sampled_from(grid), min_size=1, max_size=4)):
        _same(g._run_pass_c(prob, pol), g._run_pass_py(prob, pol))


def test_c_pass_equals_python_pass_on_a_large_shape():
    prob = g.make_problem(16, 2, 96, Placement.V, g.Costs(F=1, B=2, W=1, comm=0.5), MemModel(), 16)
    for pol in portfolio._LEADERS:
        _same(g._run_pass_c(prob, pol), g._run_pass_py(prob, pol))


def test_pure_python_switch(monkeypatch):
    monkeypatch.setenv("PIPELOOM_PURE_PYTHON", "1")
    assert not g.accelerated()
    monkeypatch.delenv("PIPELOOM_PURE_PYTHON")
    assert g.accelerated()


def test_bad_arguments_raise_not_crash():
    prob = g.make_problem(2, 2, 2, Placement.V, g.Costs(), MemModel(), None)
    with pytest.raises(ValueError):
        g._accel.run_pass((2, 2, 2, 1.0, 1e-9), ((1.0,),) * 8 + ((0, 1, 1, 0),),
                             ([0, 1], [9.0, 9.0], [1.0, 1.0], [0, 3, 1, 2], [0, 3, 1, 2]),
                             (False, True, False, 0.0, False, -1), g.Job, g._KINDS)
    with pytest.raises(ValueError):  # chunk index out of range
        g._accel.run_pass((2, 2, 2, 1.0, 1e-9), (prob.dF, prob.dB, prob.dW, prob.fcomm, prob.bcomm, prob.mF,
                                                    prob.mB, prob.mW, (0, 1, 1, 7)),
                             ([0, 1], [9.0, 9.0], [1.0, 1.0], [0, 3, 1, 2], [0, 3, 1, 2]),
                             (False, True, False, 0.0, False, -1), g.Job, g._KINDS)
