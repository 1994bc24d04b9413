"""ZB-V (zbv), V-Half, V-Min: V placement, B/W split, memory limits, any vpp >= 2."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeloom.schedule.planning import make_spec, plan
from pipeloom.core.ir import Placement
from pipeloom.core.errors import ScheduleError
from pipeloom.schedule.validate import validate
from pipeloom.core.costs import Costs, MemModel
from pipeloom.sim.simulate import simulate
from strategies import draw_costs

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def shapes(draw, max_pp=16, max_m=64):
    pp = draw(st.integers(2, max_pp))
    vpp = draw(st.integers(2, 4))
    m = draw(st.integers(1, max_m))
    nc = pp * vpp
    costs = draw_costs(draw, nc)  # uniform with comm, or heterogeneous per-chunk
    limit = draw(st.sampled_from([None, "1p", "1.5p", "2p", "0.5p", "1.2"]))
    return pp, vpp, m, costs, limit


def _min_feasible(pp, vpp, mem=MemModel()):
    a, _ = mem.per_chunk(pp * vpp, vpp)
    from pipeloom.core.ir import chunks_of
    return max(sum(a[c] for c in chunks_of(d, pp, vpp, Placement.V)) for d in range(pp))


@FAST
@given(shape=shapes(max_pp=16, max_m=64))
def test_zbv_valid_and_memory_safe(shape):
    pp, vpp, m, costs, limit = shape
    spec = make_spec(pp=pp, microbatches=m, vpp=vpp, costs=costs, mem_limit=limit)
    if spec.mem_limit is not None and spec.mem_limit < _min_feasible(pp, vpp) - 1e-9:
        with pytest.raises(ScheduleError, match="smallest feasible limit"):
            plan("zbv", spec)
        return
    sched = plan("zbv", spec)
    assert sched.placement is Placement.V
    assert validate(sched, mem=spec.mem, mem_limit=spec.mem_limit) == []
    r = simulate(sched, costs)
    if spec.mem_limit is not None:
        assert max(r.peak_memory) <= spec.mem_limit + 1e-9
    # each device runs 3 * m jobs per local chunk, all of them B/W split
    assert all(len(seq) == 3 * m * vpp for seq in sched.devices)


@pytest.mark.slow
@FAST
@given(pp=st.integers(2, 16), vpp=st.integers(2, 4), m=st.integers(1, 64),
       f=st.sampled_from([0.5, 1.0, 2.0]), b=st.sampled_from([0.5, 1.0, 2.0]), w=st.sampled_from([0.5, 1.0, 2.0]))
def test_zbv_no_worse_than_1f1b_at_equal_memory(pp, vpp, m, f, b, w):
    """comm = 0: zbv at 1p (1F1B's peak) is never slower than 1F1B on the same model.

    The same model: a zbv chunk pass costs f/b/w, so a full stage (vpp chunks) costs vpp times
    that in 1F1B. Exception (not tested): with comm > 0 and few microbatches zbv can lose,
    because a microbatch crosses devices more often in V placement (4pp - 4 cross-device edges
    for vpp 2 against 2pp - 2 for 1F1B), e.g. pp 4, m 1, comm large.
    """
    _assert_zbv_no_worse_than_1f1b(pp, vpp, m, f, b, w)


def _assert_zbv_no_worse_than_1f1b(pp, vpp, m, f, b, w):
    """zbv at 1p against 1F1B with the same work per device: no more memory, no longer."""
    zb = make_spec(pp=pp, microbatches=m, vpp=vpp, costs=Costs(F=f, B=b, W=w), mem_limit="1p")
    ref = make_spec(pp=pp, microbatches=m, costs=Costs(F=vpp * f, B=vpp * b, W=vpp * w))
    r_zb = simulate(plan("zbv", zb), zb.costs, zb.mem)
    r_ref = simulate(plan("1f1b", ref), ref.costs, ref.mem)
    assert max(r_zb.peak_memory) <= max(r_ref.peak_memory) + 1e-9
    assert r_zb.makespan <= r_ref.makespan + 1e-9


@pytest.mark.parametrize("pp, vpp, m, f, b, w", [(3, 3, 41, 0.5, 2.0, 0.5)])
def test_zbv_no_worse_than_1f1b_found_cases(pp, vpp, m, f, b, w):
    """Counterexamples the property above once found. pp 3, vpp 3, m 41, F/B/W 0.5/2/0.5 at 1p: 1F1B makes
    387; the first 54 greedy policies (the former fixed budget of 60 000 placements at 1 107 jobs) gave 388,
    the whole policy grid gives 380.5."""
    _assert_zbv_no_worse_than_1f1b(pp, vpp, m, f, b, w)


@pytest.mark.slow  # 8-45 s on 2 busy cores: make test runs it, make test-fast does not
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pp=st.integers(2, 6), vpp=st.integers(2, 4), m=st.integers(1, 24), data=st.data(),
       limit=st.sampled_from([None, "1p", "1.5p"]))
def test_default_search_never_worse_than_any_single_grid_policy_on_small_shapes(pp, vpp, m, data, limit):
    """Up to about 1 250 jobs the default budget covers the whole policy grid, so the plan is never slower
    than any policy of it run alone (the brute force below; before, only the first 60 000 placements' worth)."""
    from pipeloom.schedule.search import greedy as _greedy, portfolio as _portfolio
    if 3 * m * pp * vpp > 1200:
        m = 1200 // (3 * pp * vpp)
    costs = draw_costs(data.draw, pp * vpp)
    spec = make_spec(pp=pp, microbatches=m, vpp=vpp, costs=costs, mem_limit=limit)
    prob = _greedy.make_problem(pp, vpp, m, Placement.V, costs, spec.mem, spec.mem_limit)
    if spec.mem_limit is not None and spec.mem_limit < _greedy.min_feasible_limit(prob) - 1e-9:
        return
    passes = [_greedy.run_pass(prob, pol) for pol in _portfolio.policy_grid(prob)]
    brute = min(r.makespan for r in passes if r is not None)
    ours = simulate(plan("zbv", spec), costs, spec.mem)
    assert ours.makespan <= brute + 1e-9
    if spec.mem_limit is not None:
        assert max(ours.peak_memory) <= spec.mem_limit + 1e-9


@pytest.mark.parametrize("name,budget", [("vhalf", lambda p: (p + 2) // 2), ("vmin", lambda p: (p + 4) // 3)])
@pytest.mark.parametrize("pp,m,vpp", [(4, 8, 2), (6, 12, 2), (8, 16, 2), (8, 24, 3)])
def test_vhalf_vmin_memory_budget(name, budget, pp, m, vpp):
    costs = Costs(F=1, B=1, W=1)
    spec = make_spec(pp=pp, microbatches=m, vpp=vpp, costs=costs)
    r = simulate(plan(name, spec), costs)
    cap = max(budget(pp), 1.0)
    assert max(r.peak_memory) <= cap + 1e-9
    zbv = simulate(plan("zbv", make_spec(pp=pp, microbatches=m, vpp=vpp, costs=costs, mem_limit="1p")), costs)
    assert max(r.peak_memory) < max(zbv.peak_memory)  # less memory than ZB-V at 1p
    f1b_costs = Costs(F=vpp, B=vpp, W=vpp)
    f1b = simulate(plan("1f1b", make_spec(pp=pp, microbatches=m, costs=f1b_costs)), f1b_costs)
    if name == "vhalf":
        assert r.makespan <= f1b.makespan + 1e-9  # V-Half: half the memory, no slower than 1F1B


def test_more_memory_never_hurts_much_and_seed000_shape():
    """pp8 m16 vpp2 (seed 000's example): 1p <= 32 official units = 8 units; looser limits are no slower."""
    costs = Costs(F=1, B=1, W=1)
    spans = {}
    for lim in ("1p", "1.5p", "2p", "none"):
        spec = make_spec(pp=8, microbatches=16, vpp=2, costs=costs, mem_limit=lim)
        r = simulate(plan("zbv", spec), costs)
        if spec.mem_limit is not None:
            assert max(r.peak_memory) <= spec.mem_limit + 1e-9
        spans[lim] = r
    assert spans["none"].makespan <= spans["2p"].makespan <= spans["1.5p"].makespan <= spans["1p"].makespan
    # seed 000: stage bubble 1.15% (own) vs 1.25% (official) at none and 1.5p; we must not be worse
    assert spans["none"].stage_bubble <= 0.0115 + 1e-9
    assert spans["1.5p"].stage_bubble <= 0.0115 + 1e-9


def test_infeasible_limit_names_smallest_feasible():
    # vpp 2: one chunk holds 0.5, but a microbatch holds both local chunks at once: 1 unit
    with pytest.raises(ScheduleError, match=r"smallest feasible limit is 1 units"):
        plan("zbv", make_spec(pp=4, microbatches=8, vpp=2, mem_limit=0.75))
    s = plan("zbv", make_spec(pp=4, microbatches=8, vpp=2, mem_limit=1.0))
    assert max(simulate(s).peak_memory) <= 1.0 + 1e-9


def test_small_m_and_uneven_m():
    for m in (1, 2, 3, 5, 7, 9):
        spec = make_spec(pp=4, microbatches=m, vpp=2, costs=Costs(F=1, B=2, W=1, comm=0.5), mem_limit="1p")
        s = plan("zbv", spec)
        assert validate(s, mem=spec.mem, mem_limit=spec.mem_limit) == []
        assert {j.mb for _, _, j in s.jobs()} == set(range(m))


def test_vpp_greater_than_two_zigzag():
    spec = make_spec(pp=4, microbatches=8, vpp=3, costs=Costs(F=1, B=1, W=1), mem_limit="1p")
    s = plan("zbv", spec)
    assert s.vpp == 3 and s.chunks_of(0) == [0, 7, 8]  # down, up, down again
    assert validate(s, mem=spec.mem, mem_limit=spec.mem_limit) == []


def test_zbv_rejects_vpp1():
    with pytest.raises(ScheduleError, match="vpp"):
        plan("zbv", make_spec(pp=4, microbatches=8, vpp=1))


def test_cli_infeasible_limit_is_a_clean_error(capsys):
    from pipeloom.cli import main
    rc = main(["plan", "--schedule", "zbv", "--pp", "4", "-m", "8", "--mem-limit", "0.8"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "smallest feasible limit is 1 units" in err and "Traceback" not in err
