"""Every registered builder (whatever families exist), over many shapes: valid and within its memory limit."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom import Costs, simulate, validate
from pipeloom.schedule.planning import make_spec, plan
from pipeloom.schedule import registry
from pipeloom.core.errors import ScheduleError

HEURISTICS = [n for n in registry.names() if n != "optimal"]


def _vpps(name):
    v = registry.get(name).vpp
    return {"1": [1], "2": [2], ">=2": [2, 3, 4], "any": [1, 2, 3]}[v]


@pytest.mark.parametrize("name", HEURISTICS)
@settings(max_examples=25)
@given(pp=st.integers(1, 8), m=st.integers(1, 24), vpp_i=st.integers(0, 2),
       f=st.sampled_from([1, 2, 3]), b=st.sampled_from([1, 2, 3]), w=st.sampled_from([0, 1, 2]),
       comm=st.sampled_from([0, 0.5, 1]))
def test_builder_valid(name, pp, m, vpp_i, f, b, w, comm):
    vpps = _vpps(name)
    vpp = vpps[vpp_i % len(vpps)]
    spec = make_spec(pp=pp, microbatches=m, vpp=vpp, costs=Costs(F=f, B=b, W=w, comm=comm))
    try:
        s = plan(name, spec)  # plan() validates and raises on any violation
    except ScheduleError as e:
        # a builder may refuse a shape it does not support, but must say so clearly
        assert str(e) and "invalid" not in str(e), str(e)
        return
    assert validate(s) == []
    assert (s.pp, s.vpp, s.microbatches) == (pp, vpp, m)
    simulate(s, spec.costs)


MEMORY_AWARE = [n for n in HEURISTICS if registry.get(n).memory_aware]


@pytest.mark.parametrize("name", MEMORY_AWARE)
@settings(max_examples=25)
@given(pp=st.integers(2, 8), m=st.integers(1, 24), vpp_i=st.integers(0, 2),
       limit=st.sampled_from(["1p", "1.5p", "2p", "none"]), comm=st.sampled_from([0, 1]))
def test_memory_aware_builder_respects_limit(name, pp, m, vpp_i, limit, comm):
    vpps = _vpps(name)
    vpp = vpps[vpp_i % len(vpps)]
    spec = make_spec(pp=pp, microbatches=m, vpp=vpp, costs=Costs(F=1, B=1, W=1, comm=comm), mem_limit=limit)
    try:
        s = plan(name, spec)
    except ScheduleError as e:
        assert "limit" in str(e) or "vpp" in str(e) or "microbatches" in str(e), str(e)
        return
    r = simulate(s, spec.costs, spec.mem)
    if spec.mem_limit is not None:
        assert max(r.peak_memory) <= spec.mem_limit + 1e-9
