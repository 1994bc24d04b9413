"""ZB-H1 / ZB-H2 (vpp = 1, B/W split): validity, memory, closed forms, 1F1B and the official generator."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeloom.schedule.planning import make_spec, plan
from pipeloom.core.errors import ScheduleError
from pipeloom.schedule.validate import validate
from pipeloom.core.costs import Costs
from pipeloom.sim.simulate import simulate

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

costs_st = st.builds(
    lambda f, b, w, comm: Costs(F=f, B=b, W=w, comm=comm),
    st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]), st.sampled_from([0.5, 1.0, 2.0, 3.0]),
    st.sampled_from([0.5, 1.0, 2.0]), st.sampled_from([0.0, 0.0, 0.5, 1.0]))


@FAST
@given(name=st.sampled_from(["zbh1", "zbh2"]), pp=st.integers(1, 16), m=st.integers(1, 64), costs=costs_st,
       limit=st.sampled_from([None, "1p", "1.5p", "2p", "0.5p", 3.0]))
def test_valid_and_memory_safe(name, pp, m, costs, limit):
    if limit == "0.5p" and pp < 2:
        with pytest.raises(ScheduleError, match="smallest"):
            plan(name, make_spec(pp=pp, microbatches=m, costs=costs, mem_limit=limit))
        return
    spec = make_spec(pp=pp, microbatches=m, costs=costs, mem_limit=limit)
    sched = plan(name, spec)  # plan() validates structure, order, deadlock and the limit it was given
    cap = spec.mem_limit if spec.mem_limit is not None else (pp if name == "zbh1" else 2 * pp)
    assert validate(sched, mem=spec.mem, mem_limit=cap) == []
    assert max(simulate(sched, costs).peak_memory) <= cap + 1e-9
    assert all(j.kind.value in ("F", "B", "W") for _, _, j in sched.jobs())


@FAST
@given(pp=st.integers(1, 16), m=st.integers(1, 64), costs=costs_st)
def test_zbh1_never_slower_than_1f1b_at_equal_memory(pp, m, costs):
    spec = make_spec(pp=pp, microbatches=m, costs=costs, mem_limit="1p")
    ref = simulate(plan("1f1b", spec), costs)
    ours = simulate(plan("zbh1", spec), costs)
    assert max(ours.peak_memory) <= max(ref.peak_memory) + 1e-9
    assert ours.makespan <= ref.makespan + 1e-9


@pytest.mark.parametrize("pp,m", [(4, 8), (4, 16), (8, 16), (8, 32), (6, 13)])
def test_zbh1_bubble_about_a_third_of_1f1b(pp, m):
    """F = B = W, comm 0: 1F1B idles (p-1)(F+B+W) per device, ZB-H1 (p-1)(F+B-W) = a third (Qi et al. 2024)."""
    costs = Costs(F=1, B=1, W=1)
    spec = make_spec(pp=pp, microbatches=m, costs=costs, mem_limit="1p")
    busy = 3 * m
    f1b_idle = simulate(plan("1f1b", spec), costs).makespan - busy
    zb_idle = simulate(plan("zbh1", spec), costs).makespan - busy
    assert f1b_idle == pytest.approx(3 * (pp - 1))   # closed form of 1F1B's bubble
    assert zb_idle <= f1b_idle / 3 + 1e-9


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 12), (8, 16), (8, 24)])
def test_zbh2_near_zero_bubble(pp, m):
    """F = B = W, comm 0, m >= 2p: ZB-H2 at 2p has (almost) no bubble inside a device's span."""
    costs = Costs(F=1, B=1, W=1)
    spec = make_spec(pp=pp, microbatches=m, costs=costs)
    r = simulate(plan("zbh2", spec), costs)
    assert r.stage_bubble <= 0.02
    assert max(r.peak_memory) <= 2 * pp + 1e-9


def test_default_limits_and_looser_limit_helps():
    costs = Costs(F=1, B=1, W=1, comm=1)
    h1 = plan("zbh1", make_spec(pp=4, microbatches=12, costs=costs))
    h2 = plan("zbh2", make_spec(pp=4, microbatches=12, costs=costs))
    assert max(simulate(h1, costs).peak_memory) <= 4 + 1e-9
    assert max(simulate(h2, costs).peak_memory) <= 8 + 1e-9
    assert simulate(h2, costs).makespan < simulate(h1, costs).makespan
    tight = plan("zbh2", make_spec(pp=4, microbatches=12, costs=costs, mem_limit="1p"))
    assert max(simulate(tight, costs).peak_memory) <= 4 + 1e-9


def test_infeasible_limit_names_smallest_feasible():
    with pytest.raises(ScheduleError, match=r"smallest (feasible|conceivable) limit"):
        plan("zbh1", make_spec(pp=4, microbatches=8, mem_limit=0.5))
    # exactly the smallest feasible limit works (microbatches one after another)
    s = plan("zbh1", make_spec(pp=4, microbatches=8, mem_limit=1.0))
    assert max(simulate(s).peak_memory) <= 1.0 + 1e-9


def test_zbh_rejects_vpp2():
    with pytest.raises(ScheduleError, match="vpp"):
        plan("zbh1", make_spec(pp=4, microbatches=8, vpp=2))
