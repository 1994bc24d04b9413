"""The registry's declarations match what the builders do (partition relies on them instead of probing)."""
from __future__ import annotations

import pytest

from pipeloom.core.errors import ScheduleError
from pipeloom.core.ir import Placement, device_of
from pipeloom.partition import placement_of
from pipeloom.schedule import registry
from pipeloom.schedule.planning import make_spec, plan
from pipeloom.schedule.registry import Option

FAST = {"optimal": {"time_limit": 5, "hints": False, "workers": 1}}


def _vpps(info):
    return {"1": [1], "2": [2], ">=2": [2, 3], "any": [1, 2, 3]}[info.vpp]


@pytest.mark.parametrize("name", [n for n in registry.names()])
def test_declared_placement_is_the_built_one(name):
    info = registry.get(name)
    for vpp in _vpps(info):
        if name == "optimal" and vpp == 3:
            continue  # too many jobs for the exact solver
        sched = registry.build(name, make_spec(pp=2, microbatches=4 if name != "optimal" else 2, vpp=vpp,
                                               options=FAST.get(name)))
        declared = info.placement_at(vpp)
        assert [sched.device_of(c) for c in range(sched.num_chunks)] == \
            [device_of(c, 2, declared) for c in range(sched.num_chunks)]
        assert placement_of(name, vpp) is declared


def test_optimal_placement_follows_its_option():
    info = registry.get("optimal")
    assert info.placement_at(2) is Placement.V and info.placement_at(3) is Placement.INTERLEAVED
    assert info.placement_at(2, {"placement": "interleaved"}) is Placement.INTERLEAVED
    s = plan("optimal", make_spec(pp=2, microbatches=2, vpp=2, options={**FAST["optimal"], "placement": "interleaved"}))
    assert s.placement is placement_of("optimal", 2, {"placement": "interleaved"})
    with pytest.raises(ScheduleError, match="placement"):
        placement_of("optimal", 2, {"placement": "ring"})


@pytest.mark.parametrize("name", ["zbh1", "zbh2", "vhalf", "vmin"])
@pytest.mark.parametrize("pp", [2, 4])
def test_declared_default_limit_is_what_mem_limit_none_plans_under(name, pp):
    info = registry.get(name)
    assert info.no_limit != registry.UNLIMITED and info.default_limit is not None
    vpp = registry.default_vpp(name)
    s = plan(name, make_spec(pp=pp, microbatches=2 * pp, vpp=vpp))
    if name.startswith("zbh"):
        assert s.meta["mem_limit"] == info.default_limit(pp)
    else:  # V-Half / V-Min: the budget, raised to the smallest feasible limit
        assert s.meta["mem_limit"] >= info.default_limit(pp)
        assert s.meta["mem_limit"] == plan(name, make_spec(pp=pp, microbatches=2 * pp, vpp=vpp,
                                                           mem_limit=s.meta["mem_limit"])).meta["mem_limit"]


@pytest.mark.parametrize("name", ["zbv", "1f1b", "interleaved", "dualpipev"])
def test_unlimited_builders_plan_the_same_without_and_with_a_huge_limit(name):
    info = registry.get(name)
    assert info.no_limit == registry.UNLIMITED and info.default_limit is None
    vpp = registry.default_vpp(name)
    a = plan(name, make_spec(pp=4, microbatches=8, vpp=vpp, costs="F=1,B=2,W=1,comm=0.5"))
    b = plan(name, make_spec(pp=4, microbatches=8, vpp=vpp, costs="F=1,B=2,W=1,comm=0.5", mem_limit=1e9))
    assert a.devices == b.devices


@pytest.mark.parametrize("name", registry.names())
def test_every_option_is_typed_and_its_default_passes_its_check(name):
    info = registry.get(name)
    for o in info.options:
        assert isinstance(o, Option) and o.help
        if o.default is not None:
            o.check(o.default, name)


@pytest.mark.parametrize("name,key,bad,msg", [
    ("zbv", "polish", -1, "zbv: option polish must be a number >= 0"),
    ("zbv", "insert_budget", 1.5, "zbv: option insert_budget must be a whole number >= 0"),
    ("optimal", "time_limit", 0, "optimal: option time_limit must be a number > 0"),
    ("optimal", "workers", 0, "optimal: option workers must be a whole number >= 1"),
    ("optimal", "backward", "x", "optimal: option backward must be 'split' or 'bw'"),
    ("interleaved", "remainder", "first", "interleaved: option remainder must be 'spread' or 'last'"),
    ("dualpipev", "overlap_pairs", "yes", "dualpipev: option overlap_pairs must be true or false"),
])
def test_build_checks_values_from_the_declarations(name, key, bad, msg):
    info = registry.get(name)
    vpp = registry.default_vpp(name)
    with pytest.raises(ScheduleError) as e:
        registry.build(name, make_spec(pp=2, microbatches=4, vpp=vpp, options={key: bad}))
    assert str(e.value).startswith(msg), str(e.value)
    assert "\n" not in str(e.value)
    info.option(key)  # declared


def test_register_refuses_bare_option_names():
    with pytest.raises(TypeError, match="Option declarations"):
        registry.register("x", description="x", options=("budget",))


# ---------------------------------------------------------------- one limit rule, one floor, one message
MEMORY_AWARE = [n for n in registry.names() if registry.get(n).memory_aware]


@pytest.mark.parametrize("name", MEMORY_AWARE)
def test_a_limit_below_the_floor_is_the_one_message(name):
    # default memory model: every chunk allocates 1/vpp, so a device's chunks hold 1 unit: the floor is 1
    vpp = registry.default_vpp(name)
    # (a PlanSpec as the library takes it: make_spec refuses a limit below one chunk's activation before any
    # builder is chosen, a weaker check that does not know the placement)
    spec = registry.PlanSpec(pp=2, microbatches=2, vpp=vpp, mem_limit=0.75, options=FAST.get(name) or {})
    with pytest.raises(ScheduleError) as e:
        registry.build(name, spec)
    assert str(e.value) == (f"memory limit 0.75 units (0.375p) is infeasible for {name} pp=2 vpp={vpp}: the smallest "
                            f"feasible limit is 1 units (0.5p), every schedule needs at least 1 units on some device "
                            f"(one microbatch's activations on all {vpp} chunk{'s' if vpp > 1 else ''} of a device at "
                            f"once); use --mem-limit 1 or more")


@pytest.mark.parametrize("name", ["zbh1", "zbh2", "vhalf", "vmin", "zbvpp"])
def test_a_default_limit_below_the_floor_is_raised_to_it(name):
    # F allocates 5 units per chunk: one microbatch on a device holds 5 * vpp units, above 2p = 4 units
    vpp = registry.default_vpp(name)
    floor = 5.0 * vpp
    s = plan(name, make_spec(pp=2, microbatches=4, vpp=vpp, mem="a=5,b=2"))
    assert s.meta["mem_limit"] == floor
    assert registry.effective_limit(name, make_spec(pp=2, microbatches=4, vpp=vpp, mem="a=5,b=2")) == floor


@pytest.mark.parametrize("name,given,expect", [("zbh1", 5.0, 5.0), ("zbvpp", 7.0, 7.0), ("zbv", 3.0, 3.0),
                                               ("vhalf", 1.5, 1.5), ("vhalf", 9.0, 3.0), ("vmin", 9.0, 2.0)])
def test_effective_limit_of_a_given_limit(name, given, expect):
    # pp 4: V-Half's budget (4+2)//2 = 3 and V-Min's (4+4)//3 = 2 also cap a given limit; the others take it
    vpp = registry.default_vpp(name)
    spec = make_spec(pp=4, microbatches=8, vpp=vpp, mem_limit=given)
    assert registry.effective_limit(name, spec) == expect
    assert plan(name, spec).meta["mem_limit"] == expect
