"""The compiled squeezes of the building blocks (vblock_squeeze, vblock_squeeze_w in _accel.c) are
transcriptions of vsqueeze._squeeze_py and vsqueeze._squeeze_implicit_w_py: identical slot tables, hence
identical job lists."""
import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.core.costs import Costs, MemModel
from pipeloom.core.ir import Placement
from pipeloom.schedule.search import greedy as g, vblock, vsqueeze

pytestmark = pytest.mark.skipif(vsqueeze.ext is None, reason="C extension not built")


def _tables(prob, blk):
    """The slot table before the squeezes (as vblock.build makes it) and the per-device memory changes."""
    pp, m, nc = prob.pp, prob.m, 2 * prob.pp
    base = vblock.offsets(pp, blk)
    T = [[[base[d][k] + blk.period * j for j in range(m)] for k in range(4)] for d in range(pp)]
    for d in range(pp):
        T[d].extend(vblock._put_w(T[d], m))
    dm = [[prob.mF[d], prob.mF[nc - 1 - d], prob.mB[nc - 1 - d], prob.mB[d], prob.mW[nc - 1 - d], prob.mW[d]]
          for d in range(pp)]
    return T, dm


@st.composite
def cases(draw):
    pp = draw(st.integers(2, 8))
    m = draw(st.integers(1, 3 * pp))
    costs = Costs(F=1.0, B=draw(st.sampled_from([1.0, 2.0])), W=1.0)
    a = draw(st.sampled_from([None, 1.0]))
    mem = MemModel() if a is None else MemModel(a=a, b=a * draw(st.sampled_from([0.0, 0.5, 1.0])))
    prob = g.make_problem(pp, 2, m, Placement.V, costs, mem, None)
    period = draw(st.sampled_from(vblock.PERIODS[:3]))
    blks = list(vblock.blocks(pp, max_gap=4, period=period))
    blk = draw(st.sampled_from(blks)) if blks else None
    cap = draw(st.sampled_from([0.25, 0.4, 0.6, 1.0, 2.0])) * pp * (a or 1.0)
    return prob, blk, cap


@settings(max_examples=150, deadline=None)
@given(case=cases())
def test_compiled_squeezes_equal_the_python_ones(case):
    prob, blk, cap = case
    if blk is None:
        return
    pp, m = prob.pp, prob.m
    T, dm = _tables(prob, blk)
    want, got = copy.deepcopy(T), copy.deepcopy(T)
    vsqueeze._squeeze_py(pp, m, want, dm, cap, 6, movable=(0, 1, 2, 3, 4, 5))
    vsqueeze._squeeze(pp, m, got, dm, cap, 6, movable=(0, 1, 2, 3, 4, 5))
    assert got == want
    want4, got4 = [row[:4] for row in want], [row[:4] for row in copy.deepcopy(want)]
    b_py, b_c = copy.deepcopy(want4), copy.deepcopy(want4)
    vsqueeze._squeeze_py(pp, m, b_py, dm, cap, 4, movable=(2, 3), warm=False)
    vsqueeze._squeeze(pp, m, b_c, dm, cap, 4, movable=(2, 3), warm=False)
    assert b_c == b_py
    vsqueeze._squeeze_implicit_w_py(pp, m, want4, dm, cap)
    vsqueeze._squeeze_implicit_w(pp, m, got4, dm, cap)
    assert got4 == want4


def test_the_squeezes_move_jobs():
    """The cases above must exercise moves (a squeeze that never moved anything would pass trivially)."""
    prob = g.make_problem(6, 2, 24, Placement.V, Costs(F=1.0, B=2.0, W=1.0), MemModel(), None)
    blk = next(vblock.blocks(6))
    T, dm = _tables(prob, blk)
    before = copy.deepcopy(T)
    vsqueeze._squeeze(6, 24, T, dm, 4.0, 6, movable=(0, 1, 2, 3, 4, 5))
    assert T != before
    T4 = [row[:4] for row in T]
    before4 = copy.deepcopy(T4)
    vsqueeze._squeeze_implicit_w(6, 24, T4, dm, 4.0)
    assert T4 != before4
