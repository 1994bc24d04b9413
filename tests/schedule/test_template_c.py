"""The compiled template pass (``template_pass`` in _accel.c, on the C list-scheduling board) against its reference,
:class:`pipeloom.schedule.zb_looped.TemplatePolicy` on the Python loop (``zb_looped.template_pass_py``): identical
job lists, commit orders, clocks and peaks, and the same deadlocks, over hypothesis-drawn looped shapes and every
template option the builders use; the same ``zbvpp`` plans through the registry with either form; and a mutated
rule in core/rules.py reaches the C pass (it reads the rule tables, it does not restate them)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.core import rules
from pipeloom.core.ir import Kind, Placement
from pipeloom.schedule import zb_looped as Z
from pipeloom.schedule.planning import make_spec
from pipeloom.schedule.search import greedy
from pipeloom.sim import kernel

from _rule_mutations import check_mutation_reaches, mutations

pytestmark = pytest.mark.skipif(not kernel.accelerated(), reason="C extension not built or switched off")

ZB = "F=1,B=2,W=1,comm=0.5"
EQUAL = "F=1,B=1,W=1,comm=0"
COSTS = [ZB, EQUAL, "F=1,B=1.5,W=1,comm=0.5", "F=1.5,B=2,W=0.5,comm=0.3", "F=1,B=2,W=2,comm=0.1"]
FRACS = [None, 1.0, 0.75, 0.5]  # the limit in units of pp (None: no limit)


def _prob(pp, vpp, m, costs, frac):
    spec = make_spec(pp=pp, vpp=vpp, microbatches=m, costs=costs, mem_limit=None if frac is None else frac * pp)
    return greedy.make_problem(pp, vpp, m, Placement.INTERLEAVED, spec.costs, spec.mem, spec.mem_limit)


def _key(r):
    if r is None:
        return None
    return (r.seqs, r.makespan, r.peak, r.ends, r.starts, [list(x) for x in r.order], r.policy)


def _orders(prob, tpl):
    return [Z.fb_order(prob.pp, prob.vpp, prob.m, d, w, tpl.pull) for d, w in enumerate(Z.warmups(prob, tpl))]


def _same(prob, tpls) -> int:
    """C and Python give identical results for every template; the number of passes that finished."""
    assert kernel.accelerated()
    finished = 0
    for tpl in tpls:
        orders = _orders(prob, tpl)
        frozen = [list(o) for o in orders]
        want = Z.template_pass_py(prob, [list(o) for o in orders], tpl)
        got = Z.template_pass(prob, orders, tpl)
        assert orders == frozen  # the caller's orders are not changed
        assert _key(got) == _key(want), (prob.pp, prob.vpp, prob.m, prob.limit, tpl)
        if want is not None:
            assert [[type(j) for j in s] for s in got.seqs] == [[type(j) for j in s] for s in want.seqs]
            finished += 1
    return finished


def _all_templates(prob):
    """Every template the builder runs: the grid, and the cool-down variants of each lead template."""
    last = len(Z._groups(prob.m, prob.pp)[-1])
    pulls = [Z.Template(b.k, b.e, b.lag, b.fill, x) for b in (*Z._LEAD_TEMPLATES[:3], Z.PULL_BASE)
             for x in Z.PULLS if x < last]
    return Z.template_grid() + pulls


@settings(max_examples=50, deadline=None)
@given(pp=st.integers(2, 16), vpp=st.integers(2, 4), mq=st.integers(1, 16), costs=st.sampled_from(COSTS),
       frac=st.sampled_from(FRACS), data=st.data())
def test_c_pass_places_the_python_jobs(pp, vpp, mq, costs, frac, data):
    m = max(1, mq * pp // 4)  # 1 .. 4pp
    try:
        prob = _prob(pp, vpp, m, costs, frac)
    except ValueError:  # a limit below the floor of this shape
        return
    tpls = _all_templates(prob)
    picks = data.draw(st.lists(st.integers(0, len(tpls) - 1), min_size=1, max_size=3 if pp * vpp * m > 256 else 12))
    _same(prob, [tpls[i] for i in picks])


@pytest.mark.parametrize("pp,vpp,m", [(2, 2, 4), (3, 3, 5), (4, 2, 8), (4, 4, 16), (5, 2, 1), (6, 3, 12)])
@pytest.mark.parametrize("costs", [ZB, EQUAL, "F=1.5,B=2,W=0.5,comm=0.3"])
def test_same_jobs_for_every_template_and_limit(pp, vpp, m, costs):
    for frac in FRACS:
        try:
            prob = _prob(pp, vpp, m, costs, frac)
        except ValueError:
            continue
        _same(prob, _all_templates(prob))


def test_both_outcomes_are_exercised():
    """At 0.5p the passes deadlock on these shapes, at 0.75p they finish: both forms agree on both outcomes (so
    the comparisons above are not only between Nones), and the reorder of a warm-up the limit cuts short is
    taken by both."""
    finished = none = 0
    for pp, vpp in ((4, 2), (6, 3), (8, 2)):
        for frac in (0.5, 0.75):
            prob = _prob(pp, vpp, 2 * pp, ZB, frac)
            tpls = _all_templates(prob)
            n = _same(prob, tpls)
            finished += n
            none += len(tpls) - n
    assert finished > 0 and none > 0
    # torch's warm-up does not fit 0.75p: the pass brings a backward forward (both forms)
    prob = _prob(4, 2, 8, ZB, 0.75)
    tpl = Z.Template(1, 1, "dev", "fit")
    orders = _orders(prob, tpl)
    moved = [list(o) for o in orders]
    want = Z.template_pass_py(prob, moved, tpl)
    assert want is not None and moved != orders
    assert _key(Z.template_pass(prob, orders, tpl)) == _key(want)


@pytest.mark.parametrize("pp,m,limit,opts", [(4, 8, None, {}), (4, 12, "0.75p", {"polish": 0}),
                                             (8, 16, "0.5p", {"bound": False}), (16, 64, None, {"bound": False}),
                                             (6, 18, "0.75p", {"bound": False})])
def test_zbvpp_plans_the_same_with_either_form(pp, m, limit, opts, monkeypatch):
    """Through the real path (the registry, the template and cool-down candidates, the local searches): the plan
    made with the compiled pass is the plan made with the Python pass, job for job, and the Python form ran."""
    from pipeloom.schedule import registry

    spec = make_spec(pp=pp, vpp=2, microbatches=m, costs=ZB, mem_limit=limit, options=opts)
    compiled = registry.build("zbvpp", spec)
    calls = []
    real_py = Z.template_pass_py
    monkeypatch.setattr(Z, "accelerated", lambda: False)
    monkeypatch.setattr(Z, "template_pass_py", lambda *a: calls.append(1) or real_py(*a))
    python = registry.build("zbvpp", spec)
    assert calls, "the Python form did not run"
    assert python.devices == compiled.devices and python.meta == compiled.meta


def test_zbvpp_plans_won_by_a_template_are_covered():
    """At least one of the registry shapes above is won by a template pass (so the comparison reaches it)."""
    from pipeloom.schedule import registry

    spec = make_spec(pp=16, vpp=2, microbatches=64, costs=ZB, options={"bound": False})
    assert registry.build("zbvpp", spec).meta["source"] == "template"


# ---- mutations: one wrong copy of a rule in core/rules.py, as a monkeypatch

#: shapes where the template passes finish, memory binds and W fills gaps (several cost sets, limits below 1p)
_MUT_SHAPES = [(4, 2, 12, ZB, 0.75), (6, 3, 12, ZB, 0.75), (5, 2, 15, "F=1,B=1.5,W=1,comm=0.5", 0.5),
               (4, 2, 8, "F=1,B=2,W=2,comm=0.1", 0.5), (4, 2, 8, EQUAL, None)]


def _results(run) -> list:
    out = []
    for pp, vpp, m, costs, frac in _MUT_SHAPES:
        prob = _prob(pp, vpp, m, costs, frac)  # made under the patch: a Problem derives its tables from core.rules
        for tpl in Z.template_grid()[:12]:
            out.append(_key(run(prob, _orders(prob, tpl), tpl)))
    return out


@pytest.mark.parametrize("name", list(mutations()))
def test_a_mutated_rule_reaches_the_c_pass(name, monkeypatch):
    check_mutation_reaches(name, monkeypatch, lambda: _results(Z.template_pass), lambda: _results(Z.template_pass_py),
                           "template")


def _plain_fb_order(pp, vpp, m, d, warmup, pull):
    """The interleaved order written out job by job (the construction before the per-shape cache)."""
    from pipeloom.core.ir import Job

    groups = Z._groups(m, pp)
    chunks = [d + v * pp for v in range(vpp)]
    fwd = [Job(Kind.F, mb, chunks[v]) for g in groups for v in range(vpp) for mb in g]
    bwd = [Job(Kind.B, mb, chunks[v]) for g in groups for v in reversed(range(vpp)) for mb in g]
    w = max(0, min(warmup, len(fwd)))
    seq = fwd[:w]
    for i in range(len(fwd) - w):
        seq += [fwd[w + i], bwd[i]]
    seq += bwd[len(fwd) - w:]
    g = groups[-1]
    x = min(pull, len(g) - 1)
    for v in reversed(range(vpp - 1)) if x > 0 else ():
        for i in range(x):
            lo, hi = Job(Kind.B, g[i], chunks[v]), Job(Kind.B, g[len(g) - 1 - x + i], chunks[v + 1])
            seq.remove(lo)
            seq.insert(seq.index(hi) + 1, lo)
    return seq


@pytest.mark.parametrize("pp,vpp", [(1, 2), (2, 2), (3, 3), (4, 2), (5, 4), (8, 2)])
def test_fb_order_is_the_plain_interleaved_order(pp, vpp):
    for m in range(1, 4 * pp + 3):
        for d in range(pp):
            for w in (-1, 0, 1, pp, pp * vpp, 4 * pp * vpp + 1):
                for pull in (0, 1, 3, 12):
                    got = Z.fb_order(pp, vpp, m, d, w, pull)
                    got.append(None)  # a caller may change its list: the next one is fresh
                    assert Z.fb_order(pp, vpp, m, d, w, pull) == _plain_fb_order(pp, vpp, m, d, w, pull)
