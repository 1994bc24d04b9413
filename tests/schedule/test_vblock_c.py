"""The squeezes of the building blocks: the compiled forms (vblock_squeeze, vblock_squeeze_w in _accel.c) and the
Python reference forms (vsqueeze._squeeze_py, vsqueeze._squeeze_implicit_w_py) give identical slot tables, hence
identical job lists, on the blocks the builder tries and on random block layouts; the walk they share
(vsqueeze._unsteady_jobs) against a walk of every job that tracks the phase as it goes."""
import copy
import heapq

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pipeloom.core.costs import Costs, MemModel
from pipeloom.core.ir import Placement
from pipeloom.schedule.search import greedy as g, vblock, vsqueeze

needs_c = pytest.mark.skipif(vsqueeze.ext is None, reason="C extension not built")
_F0, _B0 = 0, 3


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


@st.composite
def random_layouts(draw):
    """A random block layout: any steps, turns, gap and period whose four passes fall on distinct slots modulo
    the period, uneven per-chunk memory (F allocates a, B frees part of it), any cap."""
    pp = draw(st.integers(2, 7))
    m = draw(st.integers(1, 4 * pp))
    steps = [draw(st.integers(1, 3)) for _ in range(4)]
    blk = vblock.Block(*steps, t1=draw(st.integers(0, 2)), g=draw(st.integers(0, 9)), t3=draw(st.integers(0, 2)),
                       period=draw(st.sampled_from(vblock.PERIODS)))
    if vblock.offsets(pp, blk) is None:  # its passes collide: one of the usable blocks of that period instead
        usable = list(vblock.blocks(pp, max_gap=9, period=blk.period))
        assume(usable)
        blk = draw(st.sampled_from(usable))
    nc = 2 * pp
    a = [draw(st.sampled_from([0.5, 1.0, 1.5, 2.0])) for _ in range(nc)]
    b = [x * draw(st.sampled_from([0.0, 0.25, 0.5, 1.0])) for x in a]
    prob = g.make_problem(pp, 2, m, Placement.V, Costs(F=1.0, B=2.0, W=1.0), MemModel(a=tuple(a), b=tuple(b)), None)
    cap = draw(st.floats(0.1, 1.5)) * sum(a) / 2
    return prob, blk, cap


def _compare(prob, blk, cap):
    pp, m = prob.pp, prob.m
    T, dm = _tables(prob, blk)
    want, got = copy.deepcopy(T), copy.deepcopy(T)
    vsqueeze._squeeze_py(pp, m, want, vsqueeze._type_mem(dm, 6), cap, 6, movable=(0, 1, 2, 3, 4, 5))
    vsqueeze._squeeze(pp, m, got, dm, cap, 6, movable=(0, 1, 2, 3, 4, 5))
    assert got == want
    want4, got4 = [row[:4] for row in want], [row[:4] for row in copy.deepcopy(want)]
    b_py, b_c = copy.deepcopy(want4), copy.deepcopy(want4)
    vsqueeze._squeeze_py(pp, m, b_py, vsqueeze._type_mem(dm, 4), cap, 4, movable=(2, 3), warm=False)
    vsqueeze._squeeze(pp, m, b_c, dm, cap, 4, movable=(2, 3), warm=False)
    assert b_c == b_py
    vsqueeze._squeeze_implicit_w_py(pp, m, want4, dm, cap)
    vsqueeze._squeeze_implicit_w(pp, m, got4, dm, cap)
    assert got4 == want4
    return T != want or want4 != [row[:4] for row in want]


@needs_c
@settings(max_examples=150, deadline=None)
@given(case=cases())
def test_compiled_squeezes_equal_the_python_ones(case):
    prob, blk, cap = case
    if blk is not None:
        _compare(prob, blk, cap)


@needs_c
@settings(max_examples=150, deadline=None)
@given(case=random_layouts())
def test_compiled_squeezes_equal_the_python_ones_on_random_layouts(case):
    _compare(*case)


@needs_c
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
    uneven = g.make_problem(5, 2, 17, Placement.V, Costs(), MemModel(a=(1.0, 2.0) * 5, b=(0.5, 0.0) * 5), None)
    assert _compare(uneven, list(vblock.blocks(5, period=9))[-1], 6.0)


def _phased_walk(T, pp: int, ntypes: int, m: int):
    """Every job in time order (a heap of each row's next job), ``(t, d, k, j, cool)`` for the jobs outside the
    steady phase: it starts at device 0's first B0 if device 0 still has forwards left, and ends with its last F0
    (that job is steady); after it, cool-down."""
    heap = [(T[d][k][0], d, k, 0) for d in range(pp) for k in range(ntypes)]
    heapq.heapify(heap)
    steady = cool = False
    f0_dev0 = 0
    out = []
    while heap:
        t, d, k, j = heapq.heappop(heap)
        if j + 1 < m:
            heapq.heappush(heap, (T[d][k][j + 1], d, k, j + 1))
        if d == 0 and k == _B0 and j == 0:
            steady = f0_dev0 < m
        if d == 0 and k == _F0:
            f0_dev0 += 1
            if steady and f0_dev0 == m:
                steady, cool = False, True
                continue
        if not steady:
            out.append((t, d, k, j, cool))
    return out


@settings(max_examples=150, deadline=None)
@given(case=random_layouts(), ntypes=st.sampled_from([4, 6]))
def test_unsteady_jobs_are_the_phase_walks(case, ntypes):
    prob, blk, _cap = case
    T, _dm = _tables(prob, blk)
    T = [rows[:ntypes] for rows in T]
    assert list(vsqueeze._unsteady_jobs(T, prob.pp, ntypes, prob.m)) == _phased_walk(T, prob.pp, ntypes, prob.m)
