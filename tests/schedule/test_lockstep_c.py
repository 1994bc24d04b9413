"""The compiled lock-step pass (lockstep_pass in _accel.c, on the C list-scheduling board) is a transcription of
lockstep._one_pass_py: identical job lists and bubbles, and the same passes dropped."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.core.costs import MemModel
from pipeloom.core.ir import Placement
from pipeloom.schedule.search import greedy as g, lockstep
from strategies import draw_costs

pytestmark = pytest.mark.skipif(lockstep.ext is None, reason="C extension not built")


def _py(prob, fill_b, fill_f, approved):
    try:
        return lockstep._one_pass_py(prob, fill_b, fill_f, approved)
    except lockstep._Broken:
        return None


def _c(prob, fill_b, fill_f, approved):
    try:
        return lockstep._one_pass(prob, fill_b, fill_f, approved)
    except lockstep._Broken:
        return None


@st.composite
def problems(draw):
    pp = draw(st.integers(1, 8))
    m = draw(st.integers(1, 24))
    costs = draw_costs(draw, 2 * pp)
    a = draw(st.sampled_from([None, 1.0, 0.75]))
    mem = MemModel() if a is None else MemModel(a=a, b=a * draw(st.sampled_from([0.25, 0.5, 1.0])))
    limit = draw(st.sampled_from([None, 0.5, 0.75, 1.0, 1.5, 2.0]))
    prob = g.make_problem(pp, 2, m, Placement.V, costs, mem, None if limit is None else limit * pp)
    approved = draw(st.one_of(st.none(), st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=pp, max_size=pp)))
    return prob, draw(st.booleans()), draw(st.booleans()), approved


@settings(max_examples=200, deadline=None)
@given(case=problems())
def test_c_pass_equals_python_pass(case):
    prob, fill_b, fill_f, approved = case
    assert lockstep.accelerated()
    want = _py(prob, fill_b, fill_f, approved)
    got = _c(prob, fill_b, fill_f, approved)
    if want is None:
        assert got is None
        return
    assert got is not None
    assert got[0] == want[0]
    assert got[1] == want[1]
    assert [[type(j) for j in s] for s in got[0]] == [[type(j) for j in s] for s in want[0]]


def test_both_forms_are_exercised():
    """The grid above must reach both outcomes of a pass (kept and dropped) in both forms."""
    ok = g.make_problem(4, 2, 8, Placement.V, g.Costs(F=1.0, B=2.0, W=1.0, comm=0.5), MemModel(), 4.0)
    broken = g.make_problem(4, 2, 2, Placement.V, g.Costs(F=1.0, B=2.0, W=1.0, comm=0.5), MemModel(), 2.0)
    assert _py(ok, True, True, None) is not None and _c(ok, True, True, None) == _py(ok, True, True, None)
    assert _py(broken, True, False, None) is None and _c(broken, True, False, None) is None
