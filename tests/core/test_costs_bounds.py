"""Costs that would overflow a makespan are refused with a one-line reason; the largest allowed stay finite."""
import math

import pytest

from pipeloom.core.costs import MAX_COST, Costs
from pipeloom.schedule.planning import make_spec, plan
from pipeloom.sim.simulate import simulate


@pytest.mark.parametrize("text", ["F=1e308,B=1e308,W=1e308", "F=1,B=1e13", "F=1:2:1e300:1", "comm=1e20"])
def test_costs_above_the_cap_are_refused(text):
    with pytest.raises(ValueError, match="above 1e\\+12; costs are relative, so scale them down"):
        Costs.parse(text)


def test_constructor_refuses_them_too():
    with pytest.raises(ValueError, match="above"):
        Costs(F=2 * MAX_COST)
    with pytest.raises(ValueError, match="above"):
        Costs(comm=2 * MAX_COST)


@pytest.mark.parametrize("name, vpp", [("1f1b", 1), ("zbv", 2)])
def test_the_largest_costs_give_finite_results(name, vpp):
    c = f"F={MAX_COST:g},B={MAX_COST:g},W={MAX_COST:g},comm={MAX_COST:g}"
    spec = make_spec(pp=8, microbatches=64, vpp=vpp, costs=c)
    r = simulate(plan(name, spec), spec.costs, spec.mem)
    assert math.isfinite(r.makespan) and math.isfinite(r.bubble) and r.makespan >= 64 * 3 * MAX_COST
