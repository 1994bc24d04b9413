"""Building-block V schedules (schedule/search/vblock.py): valid and within the limit, and as candidates of zbv."""
from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeloom.core.costs import Costs, MemModel
from pipeloom.core.ir import Kind, Placement, make_schedule
from pipeloom.schedule.planning import make_spec, plan
from pipeloom.schedule.search import greedy as G, localsearch as LS
from pipeloom.schedule.search import vblock as V
from pipeloom.schedule.validate import validate
from pipeloom.sim.simulate import simulate
from strategies import draw_costs

FAST = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODELS = (MemModel(), MemModel(a=0.5, b=0.0))  # default, and B frees nothing (the torch runtime's model)


@st.composite
def problems(draw):
    pp = draw(st.integers(2, 16))
    m = draw(st.integers(1, 64 if pp <= 6 else 24))
    costs = draw_costs(draw, 2 * pp)
    mem = draw(st.sampled_from(MODELS))
    frac = draw(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.75, 1.0]))
    lo = G.min_feasible_limit(G.make_problem(pp, 2, m, Placement.V, costs, mem, None))
    limit = lo + frac * (2 * pp - lo)  # anywhere between the V-Min floor and 2p
    return pp, m, costs, mem, limit


@FAST
@given(problems())
def test_every_block_candidate_complete_valid_within_limit(case):
    pp, m, costs, mem, limit = case
    prob = G.make_problem(pp, 2, m, Placement.V, costs, mem, limit)
    njobs = 6 * pp * m
    seen = 0
    for seqs, blk in V.candidates(prob, 6 * njobs):
        # every job exactly once, on the device that holds its chunk
        jobs = Counter((k, mb, c) for d, seq in enumerate(seqs) for k, mb, c in seq)
        assert len(jobs) == njobs and set(jobs.values()) == {1}
        assert all(prob.dev[c] == d for d, seq in enumerate(seqs) for _k, _mb, c in seq)
        r = LS.result_of(prob, seqs, blk)
        if r is None:  # over the limit (dropped by the search, never repaired): the validator agrees
            v = validate(make_schedule("vblock", pp, 2, m, Placement.V, seqs), mem=mem, mem_limit=limit)
            assert v, blk
            continue
        seen += 1
        sched = make_schedule("vblock", pp, 2, m, Placement.V, seqs)
        assert validate(sched, mem=mem, mem_limit=limit) == []
        sim = simulate(sched, costs, mem)
        assert abs(sim.makespan - r.makespan) < 1e-6
        assert max(sim.peak_memory) <= limit + 1e-9


@pytest.mark.slow
@FAST
@given(problems())
def test_zbv_with_blocks_valid_within_limit(case):
    pp, m, costs, mem, limit = case
    spec = make_spec(pp=pp, microbatches=m, vpp=2, costs=costs, mem=mem, mem_limit=limit,
                     options={"polish": 0})
    sched = plan("zbv", spec)  # plan() validates under the limit and raises otherwise
    assert max(simulate(sched, costs, mem).peak_memory) <= limit + 1e-9


def test_offsets_follow_the_dependencies():
    """The block's slots respect every dependency of microbatch 0 (unit slots, forward down then up)."""
    for pp in range(2, 17):
        for blk in V.blocks(pp):
            off = V.offsets(pp, blk)
            for i in range(pp):
                f0, f1, b1, b0 = off[i]
                assert f0 < f1 < b1 < b0
                if i:
                    assert off[i - 1][0] < f0 and off[i - 1][2] < b1
                if i < pp - 1:
                    assert off[i + 1][1] < f1 and off[i + 1][3] < b0
                assert len({x % V.PERIOD for x in off[i]}) == 4


def _reference() -> dict | None:
    root = Path(__file__).resolve().parents[2]
    for p in (root.parent / "shared" / "reference" / "official_vshape.json",
              root / "tests" / "data" / "official_vshape.json.gz"):
        if p.is_file():
            with (gzip.open(p, "rt") if p.suffix == ".gz" else open(p)) as f:
                return json.load(f)
    return None


REF = _reference()


@pytest.mark.skipif(REF is None, reason="official_vshape.json not found")
@pytest.mark.parametrize("gen,pp,m", [("vmin", 4, 8), ("vmin", 4, 16), ("vhalf", 4, 8), ("vmin", 6, 12)])
def test_no_worse_than_official_at_equal_memory(gen, pp, m):
    """zbv under the official V-Half / V-Min peak as the limit, without the CP-SAT polish, is no slower than
    the official schedule (both memory models, F=B=W=1 with and without comm); before the building blocks
    these were 126 vs 107 (V-Min pp 4 m 16) and 65 vs 59 (V-Min pp 4 m 8)."""
    cases = [c for c in REF["cases"] if (c["generator"], c["pp"], c["microbatches"]) == (gen, pp, m)
             and (c["costs"]["F"], c["costs"]["B"], c["costs"]["W"]) == (1, 1, 1)]
    assert cases
    for c in cases:
        costs = Costs(**c["costs"])
        for mem, key in zip(MODELS, ("peak_default", "peak_b0")):
            spec = make_spec(pp=pp, microbatches=m, vpp=2, costs=costs, mem=mem, mem_limit=float(c[key]),
                             options={"polish": 0})  # the blocks alone, without the CP-SAT polish
            r = simulate(plan("zbv", spec), costs, mem)
            assert max(r.peak_memory) <= c[key] + 1e-9
            assert r.makespan <= c["makespan"] + 1e-9, (c["costs"], key)
