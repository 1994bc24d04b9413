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


def _board_tables(prob, **change):
    t = {"needs": prob.tables.needs, "produces": prob.tables.produces, "dur": prob.dur_table, "dmem": prob.mem_tab,
         "dev": prob.tables.dev, "handoff": prob.handoff} | change
    return tuple(t.values())


def test_bad_arguments_raise_not_crash():
    prob = g.make_problem(2, 2, 2, Placement.V, g.Costs(), MemModel(), None)
    dev_args = ([0, 1], [9.0, 9.0], [1.0, 1.0], [0, 3, 1, 2], [0, 3, 1, 2])
    pol = (False, True, False, 0.0, False, -1)
    assert g._accel.run_pass((2, 2, 2, 9.0, 1e-9), _board_tables(prob), dev_args, pol, g.Job, g._KINDS) is not None
    bad = {"durations of 8 slots, not 16": {"dur": [1.0] * 8},
           "a device out of range": {"dev": (0, 1, 1, 7)},
           "a handoff outside the chunks": {"handoff": [(5, 0.0)] * 16},
           "a need outside the chunks": {"needs": [((0, -9, 0.0),)] * 16}}
    for what, change in bad.items():
        with pytest.raises(ValueError):
            g._accel.run_pass((2, 2, 2, 9.0, 1e-9), _board_tables(prob, **change), dev_args, pol, g.Job, g._KINDS)
            pytest.fail(what)
    with pytest.raises(ValueError):  # chunk index out of range
        g._accel.run_pass((2, 2, 2, 9.0, 1e-9), _board_tables(prob), ([0, 1], [9.0, 9.0], [1.0, 1.0], [0, 3, 1, 7],
                          [0, 3, 1, 2]), pol, g.Job, g._KINDS)
