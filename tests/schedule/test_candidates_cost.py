"""The portfolio's low-memory candidates kept cheap on big shapes without changing what they plan: the modulo
patterns' job lists generated period by period (equal to sorting every copy by its start), and the paper's blocks
on shapes above paper_blocks.BIG_SHAPE jobs tried only where V-Half's block fits (V-Min's is covered there by the
building blocks of vblock, which the portfolio runs wherever it runs the paper's)."""
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.core.ir import Placement
from pipeloom.schedule.planning import make_spec
from pipeloom.schedule.search import greedy, modulo, paper_blocks, vblock

ZB = "F=1,B=2,W=1,comm=0.5"


def _prob(pp, vpp, m, costs, limit):
    spec = make_spec(pp=pp, vpp=vpp, microbatches=m, costs=costs, mem_limit=limit)
    return greedy.make_problem(pp, vpp, m, Placement.V, spec.costs, spec.mem, spec.mem_limit)


def _sorted_reference(prob, mod, x, m):
    """Every copy of every pattern job, sorted by (planned start, kind F/B/W, microbatch): the definition."""
    rank = {"F": 0, "B": 1, "W": 2}
    out = []
    for d in range(prob.pp):
        ev = sorted((t + j * mod.period, rank[k.name], j, k, c) for (k, c), t in x.items() if prob.dev[c] == d
                    for j in range(m))
        out.append([(k, j, c) for _, _, j, k, c in ev])
    return out


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(2, 12), vpp=st.sampled_from([2, 3]), k=st.integers(1, 4),
       costs=st.sampled_from(["F=1,B=1,W=1,comm=0", ZB, "F=1,B=1.5,W=0.7,comm=0.3", "F=1.5,B=2,W=0.5,comm=0.3"]),
       f=st.sampled_from(modulo.FACTORS), m_less=st.integers(0, 3))
def test_modulo_build_is_the_copies_sorted_by_start(pp, vpp, k, costs, f, m_less):
    prob = _prob(pp, vpp, k * pp, costs, "0.5p")
    mod = modulo.Modulo(period=f * modulo.work_period(prob))
    x = modulo.pattern(prob, mod)
    if x is None:
        return
    m = max(1, prob.m - m_less)
    got = [[(j.kind, j.mb, j.chunk) for j in seq] for seq in modulo.build(prob, mod, m, x)]
    assert got == _sorted_reference(prob, mod, x, m)


def test_paper_blocks_on_a_big_shape_try_v_half_only_where_it_fits():
    # pp 32, m 128: 24 576 jobs; at 0.75p both blocks fit the paper's count, V-Half's is the shorter
    prob = _prob(32, 2, 128, ZB, "0.75p")
    assert 3 * prob.m * prob.nc > paper_blocks.BIG_SHAPE
    got = [blk for _, blk in paper_blocks.candidates(prob, 0)]
    assert [(b.s0, b.s1, b.s2, b.s3) for b in got] == [(2, 1, 2, 1)]


def test_paper_blocks_on_a_small_shape_keep_v_min_where_v_half_does_not_fit():
    prob = _prob(8, 2, 16, ZB, "0.5p")
    b0 = replace(prob, b=tuple(0.0 for _ in prob.b))  # the paper's count: B frees nothing
    vhalf, vmin = paper_blocks.paper_blocks(8)
    fits = [p is not None and p <= prob.limit + 1e-9 for p in (vblock.pattern_peak(b0, blk, prob.limit)
                                                              for blk in (vhalf, vmin))]
    got = [(b.s0, b.s1) for _, b in paper_blocks.candidates(prob, 0)]
    assert got == ([(2, 1)] if fits[0] else [(1, 1)] if fits[1] else [])
