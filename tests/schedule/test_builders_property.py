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
    why = registry.get(name).unsupported(pp, vpp, m, spec.options)
    if why is not None:  # a shape the builder declares it does not plan: refused with that reason
        with pytest.raises(ScheduleError) as e:
            plan(name, spec)
        assert str(e.value) == why
        return
    s = plan(name, spec)  # a declared shape builds, and plan() validates it (raises on any violation)
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
    info = registry.get(name)
    assert info.unsupported(pp, vpp, m, spec.options) is None  # every heuristic declares every shape
    floor = registry.min_feasible_limit(pp, vpp, info.placement_at(vpp), spec.mem)
    if spec.mem_limit is not None and spec.mem_limit < floor - 1e-9:  # no schedule meets it: the one message
        with pytest.raises(ScheduleError, match="is infeasible for .* smallest feasible limit is"):
            plan(name, spec)
        return
    s = plan(name, spec)  # at any limit >= the floor a memory-aware builder builds
    r = simulate(s, spec.costs, spec.mem)
    limit = registry.effective_limit(name, spec)
    if spec.mem_limit is not None:
        assert max(r.peak_memory) <= spec.mem_limit + 1e-9
    if limit is not None:  # and stays within the limit its declaration says it plans under
        assert max(r.peak_memory) <= limit + 1e-9


def test_the_property_tests_fail_on_a_builder_that_refuses_a_declared_shape(monkeypatch):
    """A builder that refuses every shape it declares cannot pass test_builder_valid (it used to)."""
    info = registry.get("1f1b")

    def refuse(spec):
        raise ScheduleError("1f1b: not today")
    monkeypatch.setitem(registry.BUILDERS, "1f1b", info.__class__(*[refuse if f == "fn" else getattr(info, f)
                                                                     for f in info.__slots__]))
    with pytest.raises(ScheduleError, match="not today"):
        test_builder_valid.hypothesis.inner_test(name="1f1b", pp=2, m=2, vpp_i=0, f=1, b=1, w=1, comm=0)


def test_optimal_declares_its_job_cap():
    info = registry.get("optimal")
    assert info.unsupported(2, 1, 4, {}) is None
    why = info.unsupported(8, 2, 64, {})
    assert why and "allow_large" in why
    assert info.unsupported(8, 2, 64, {"allow_large": True}) is None
    with pytest.raises(ScheduleError) as e:
        registry.build("optimal", make_spec(pp=8, microbatches=64, vpp=2))
    assert str(e.value) == why
