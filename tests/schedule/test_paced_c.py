"""The compiled paced pass (``paced_pass`` in _accel.c, on the C list-scheduling board) against its reference,
:class:`pipeloom.schedule.search.paced.PacedPolicy` on the Python loop (``paced.run_py``). Identical job lists and
deadlocks over hypothesis-drawn deep shapes, the shapes of test_paced_modulo.py and the official pp 24 cases are
checked in test_paced_board.py, beside the legacy loop; here: a caller's timetable, a mutated rule in
core/rules.py reaching the C pass (it reads the rule tables, it does not restate them), tables neither form can
handle, and default plans won by the paced pass built with either form."""
from __future__ import annotations

import pytest

from pipeloom.core import rules
from pipeloom.core.ir import Kind, Placement
from pipeloom.schedule.planning import make_spec
from pipeloom.schedule.search import greedy, paced
from pipeloom.sim import kernel

from _rule_mutations import check_mutation_reaches, mutations

pytestmark = pytest.mark.skipif(paced.ext is None, reason="C extension not built")

ZB = "F=1,B=2,W=1,comm=0.5"
EQUAL = "F=1,B=1,W=1,comm=0"


def _prob(pp, m, costs, limit, vpp=2):
    spec = make_spec(pp=pp, vpp=vpp, microbatches=m, costs=costs, mem_limit=limit)
    return greedy.make_problem(pp, vpp, m, Placement.V, spec.costs, spec.mem, spec.mem_limit)


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
    check_mutation_reaches(name, monkeypatch, lambda: _results(paced.run), lambda: _results(paced.run_py), "paced")


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
