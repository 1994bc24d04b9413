"""The compiled paced pass (``paced_pass`` in _accel.c, on the C list-scheduling board) against its reference,
:class:`pipeloom.schedule.search.paced.PacedPolicy` on the Python loop (``paced.run_py``): identical job lists (the
same Job tuples in the same order on every device) and the same deadlocks, over hypothesis-drawn deep shapes, the
shapes of test_paced_modulo.py and the official pp 24 cases; and a mutated rule in core/rules.py reaches the C
pass (it reads the rule tables, it does not restate them)."""
from __future__ import annotations

import json
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.core import rules
from pipeloom.core.ir import Kind, Placement
from pipeloom.schedule.planning import make_spec
from pipeloom.schedule.search import greedy, paced
from pipeloom.sim import kernel

from _rule_mutations import mutations

pytestmark = pytest.mark.skipif(paced.ext is None, reason="C extension not built")

ZB = "F=1,B=2,W=1,comm=0.5"
EQUAL = "F=1,B=1,W=1,comm=0"
_DATA = pathlib.Path(__file__).resolve().parents[2] / "bench" / "data" / "official_at_scale.json"


def _prob(pp, m, costs, limit, vpp=2):
    spec = make_spec(pp=pp, vpp=vpp, microbatches=m, costs=costs, mem_limit=limit)
    return greedy.make_problem(pp, vpp, m, Placement.V, spec.costs, spec.mem, spec.mem_limit)


def _same(prob, paces) -> int:
    """C and Python give identical results for every pace; the number of passes that finished."""
    assert paced.accelerated()
    finished = 0
    for pace in paces:
        want = paced.run_py(prob, pace)
        got = paced.run(prob, pace)
        assert got == want, (prob.pp, prob.m, prob.limit, pace)
        if want is not None:
            assert [[type(j) for j in s] for s in got] == [[type(j) for j in s] for s in want]
            finished += 1
    return finished


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(2, 16), k=st.integers(4, 16), costs=st.sampled_from([EQUAL, ZB]),
       frac=st.sampled_from([0.5, 0.625, 0.75, 0.875, 1.0]), b_bias=st.sampled_from([0.0, 0.5]),
       data=st.data())
def test_c_pass_places_the_python_jobs(pp, k, costs, frac, b_bias, data):
    m = k * pp // 4  # pp .. 4pp
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
    _same(_prob(pp, m, costs, frac * pp, vpp), paced.grid(_prob(pp, m, costs, frac * pp, vpp)))


def test_both_outcomes_are_exercised():
    """Some paces of the grid deadlock below 1F1B's memory on small deep shapes, others finish: both forms
    agree on both outcomes (so the comparison above is not only between Nones)."""
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


def test_a_timetable_given_by_the_caller_is_used_by_both():
    prob = _prob(6, 18, ZB, 3.0)
    tf, tb = paced.timetable(prob)
    table = ([x + 0.5 * c for c, x in enumerate(tf)], tb)
    pace = paced.grid(prob)[0]
    want = paced.run_py(prob, pace, table)
    assert want is not None and want != paced.run_py(prob, pace)
    assert paced.run(prob, pace, table) == want


# ---- mutations: one wrong copy of a rule in core/rules.py, as a monkeypatch

#: shapes where the paced passes finish, memory binds and W fills gaps (both cost sets, limits below 1p)
_MUT_SHAPES = [(4, 12, ZB, 2.5), (6, 18, ZB, 3.0), (5, 15, "F=1,B=1.5,W=1,comm=0.5", 3.0), (6, 12, EQUAL, 3.0)]


def _results(run) -> list:
    out = []
    for pp, m, costs, limit in _MUT_SHAPES:
        prob = _prob(pp, m, costs, limit)  # made under the patch: a Problem derives its tables from core.rules
        for pace in paced.grid(prob)[:6]:
            out.append(run(prob, pace))
    return out


@pytest.mark.parametrize("name", list(mutations()))
def test_a_mutated_rule_reaches_the_c_pass(name, monkeypatch):
    """Under a wrong copy of a rule the C pass places other jobs than before, and exactly the jobs of the
    Python pass under the same rule: both read the one copy in core/rules.py."""
    before = _results(paced.run)
    assert before == _results(paced.run_py)
    assert any(r is not None for r in before)
    for attr, fn in mutations()[name]:
        monkeypatch.setattr(rules, attr, fn)
    kernel._make_rules.cache_clear()
    try:
        after = _results(paced.run)
        assert after != before, "the C paced pass did not see the mutated rule"
        assert after == _results(paced.run_py)
    finally:
        kernel._make_rules.cache_clear()


def test_tables_the_pass_cannot_handle_are_refused_by_both(monkeypatch):
    """An F with two inputs (here: it waits for its own chunk's ACT too) is refused with the same ValueError."""
    needs = rules.needs

    def f_waits_for_itself(kind, mb, chunk, num_chunks):
        return needs(kind, mb, chunk, num_chunks) + (((rules.ACT, mb, chunk),) if kind is Kind.F else ())

    monkeypatch.setattr(rules, "needs", f_waits_for_itself)
    kernel._make_rules.cache_clear()
    try:
        prob = _prob(4, 8, ZB, 2.0)
        pace = paced.grid(prob)[0]
        for run in (paced.run, paced.run_py):
            with pytest.raises(ValueError, match="at most 1 and 2"):
                run(prob, pace)
    finally:
        kernel._make_rules.cache_clear()


@pytest.mark.parametrize("name,pp,m,limit", [("zbv", 8, 16, "0.5p"), ("vmin", 16, 32, None)])
def test_a_default_plan_won_by_the_paced_pass_is_the_same_with_either_form(name, pp, m, limit, monkeypatch):
    """Through the real path (the registry's default plan, the portfolio, the paced candidates): where the paced
    pass wins, the plan made with its compiled form is the plan made with the Python form, job for job."""
    from pipeloom.schedule import registry

    spec = make_spec(pp=pp, vpp=2, microbatches=m, costs=ZB, mem_limit=limit)
    compiled = registry.build(name, spec)
    assert compiled.meta["policy"]["builder"] == "paced"
    calls = []
    real_py = paced.run_py
    monkeypatch.setattr(paced, "accelerated", lambda: False)
    monkeypatch.setattr(paced, "run_py", lambda *a: calls.append(1) or real_py(*a))
    python = registry.build(name, spec)
    assert calls, "the Python form did not run"
    assert python.devices == compiled.devices and python.meta["policy"] == compiled.meta["policy"]
