"""The paced pass runs on the shared list-scheduling board (sim/listsched.py) as a policy: readiness and memory
come from the board's rule tables, and the pass in both its forms places exactly the jobs its former own loop
placed (kept as ``tests/schedule/_paced_legacy.py`` for this comparison only), with the same deadlocks, for every
pace of the grid, on a broad sample of shapes: the Python form (``paced.run_py``, PacedPolicy on the Python loop)
equals the legacy loop, and the compiled form (``paced_pass`` in _accel.c on the C board, where the extension is
built) equals the Python form job for job (test_paced_c.py has the compiled form's own checks: mutated rules,
refused tables, a caller's timetable, the registry)."""
import json
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.core.ir import Placement
from pipeloom.schedule.planning import make_spec
from pipeloom.schedule.search import greedy, paced

from _paced_legacy import run_legacy

ZB = "F=1,B=2,W=1,comm=0.5"
EQUAL = "F=1,B=1,W=1,comm=0"
_DATA = pathlib.Path(__file__).resolve().parents[2] / "bench" / "data" / "official_at_scale.json"


def _prob(pp, m, costs, limit, vpp=2):
    spec = make_spec(pp=pp, vpp=vpp, microbatches=m, costs=costs, mem_limit=limit)
    return greedy.make_problem(pp, vpp, m, Placement.V, spec.costs, spec.mem, spec.mem_limit)


def _same(prob, paces) -> int:
    """The three forms agree for every pace; the number of passes that finished."""
    finished = 0
    for pace in paces:
        old = run_legacy(prob, pace)
        new = paced.run_py(prob, pace)
        assert new == old, (prob.pp, prob.m, prob.limit, pace)
        if paced.accelerated():
            got = paced.run(prob, pace)
            assert got == new, ("compiled", prob.pp, prob.m, prob.limit, pace)
            if new is not None:
                assert [[type(j) for j in s] for s in got] == [[type(j) for j in s] for s in new]
        finished += new is not None
    return finished


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(2, 16), k=st.integers(4, 16), costs=st.sampled_from([EQUAL, ZB]),
       frac=st.sampled_from([0.5, 0.625, 0.75, 0.875, 1.0]), b_bias=st.sampled_from([0.0, 0.5]),
       data=st.data())
def test_policy_on_the_board_places_the_legacy_jobs(pp, k, costs, frac, b_bias, data):
    m = k * pp // 4
    prob = _prob(pp, m, costs, frac * pp)
    grid = paced.grid(prob)
    picks = data.draw(st.lists(st.integers(0, len(grid) - 1), min_size=1, max_size=4 if pp > 8 else len(grid)))
    paces = [grid[i] for i in picks]
    paces += [paced.Pace(period=p.period, slack=p.slack, head=p.head, b_bias=b_bias) for p in paces[:1]]
    _same(prob, paces)


@pytest.mark.parametrize("pp,vpp,m,costs,frac", [
    (pp, vpp, k * pp, costs, frac)
    for pp, vpp, k in ((2, 2, 1), (3, 3, 2), (4, 2, 3), (5, 2, 1), (6, 3, 2))
    for costs in (EQUAL, ZB, "F=1,B=1.5,W=1,comm=0.5", "F=1.5,B=2,W=0.5,comm=0.3")
    for frac in (0.5, 0.75, 1.0, 1.5)])
def test_same_jobs_on_the_paced_modulo_shapes(pp, vpp, m, costs, frac):
    prob = _prob(pp, m, costs, frac * pp, vpp)
    _same(prob, paced.grid(prob))


def test_both_outcomes_are_exercised():
    """Some paces of the grid deadlock below 1F1B's memory on small deep shapes, others finish: the forms agree on
    both outcomes (so the comparisons here are not only between Nones)."""
    finished = none = 0
    for pp in (4, 6, 8):
        prob = _prob(pp, 2 * pp, ZB, 0.5 * pp)
        grid = paced.grid(prob)
        n = _same(prob, grid)
        finished += n
        none += len(grid) - n
    assert finished > 0 and none > 0


def _official_pp24():
    with open(_DATA) as f:
        cases = [c for c in json.load(f)["cases"] if "makespan" in c and c["pp"] == 24]
    return sorted({(c["microbatches"], "F={F},B={B},W={W},comm={comm}".format(**c["costs"])) for c in cases})


@pytest.mark.parametrize("m,costs", _official_pp24())
@pytest.mark.parametrize("frac", [0.5, 1.0, 2.0])
def test_same_jobs_on_the_official_pp24_shapes(m, costs, frac):
    prob = _prob(24, m, costs, frac * 24)
    assert _same(prob, paced.grid(prob)[:paced.MIN_PASSES + 1]) > 0
