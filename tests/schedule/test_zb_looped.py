"""zbvpp: zero-bubble with looped (interleaved) placement under a memory limit."""
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeloom import Costs, simulate, validate
from pipeloom.core.costs import MemModel, runtime_mem_model
from pipeloom.core.errors import ScheduleError
from pipeloom.core.ir import Placement
from pipeloom.schedule import registry
from pipeloom.schedule import zb_looped as Z
from pipeloom.schedule.planning import make_spec, plan
from pipeloom.schedule.search import greedy as G


def _costs(draw, nc):
    if draw(st.booleans()):
        return Costs(F=draw(st.sampled_from([0.5, 1.0, 2.0])), B=draw(st.sampled_from([0.5, 1.0, 1.5, 3.0])),
                     W=draw(st.sampled_from([0.0, 0.5, 0.7, 2.0])), comm=draw(st.sampled_from([0.0, 0.2, 1.0])))
    vals = st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0]), min_size=nc, max_size=nc)
    return Costs(F=tuple(draw(vals)), B=tuple(draw(vals)), W=tuple(draw(vals)), comm=draw(st.sampled_from([0, 0.5])))


@st.composite
def shapes(draw):
    pp = draw(st.integers(2, 16))
    vpp = draw(st.integers(2, 4))
    m = draw(st.integers(1, 64))
    costs = _costs(draw, pp * vpp)
    mem = draw(st.sampled_from([MemModel(), runtime_mem_model("torch")]))
    # a limit between the floor (one microbatch on all vpp chunks: 1 unit) and 2p
    limit = draw(st.sampled_from([None, 1.0, 1.5, 0.5 * pp, float(pp), 1.5 * pp, 2.0 * pp]))
    return pp, vpp, m, costs, mem, limit


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes())
def test_valid_and_within_limit(shape):
    pp, vpp, m, costs, mem, limit = shape
    spec = make_spec(pp=pp, microbatches=m, vpp=vpp, costs=costs, mem=mem, mem_limit=limit)
    s = plan("zbvpp", spec)  # plan() validates (deadlock, order, memory) and raises on any violation
    assert (s.pp, s.vpp, s.microbatches, s.placement) == (pp, vpp, m, Placement.INTERLEAVED)
    eff = float(pp) if limit is None else limit  # the default limit is 1p
    assert validate(s, mem=mem, mem_limit=eff) == []
    r = simulate(s, costs, mem)
    assert max(r.peak_memory) <= eff + 1e-9
    assert {j.kind.value for d in s.devices for j in d} <= {"F", "B", "W"}
    if "lower_bound" in s.meta:
        assert s.meta["lower_bound"] <= r.makespan + 1e-6


def test_registered_as_looped_memory_aware():
    info = registry.get("zbvpp")
    assert info.memory_aware and info.placement_at(3) is Placement.INTERLEAVED
    assert registry.default_vpp("zbvpp") == 2
    with pytest.raises(ScheduleError, match="vpp"):
        plan("zbvpp", make_spec(pp=4, microbatches=4, vpp=1))


@pytest.mark.parametrize("vpp", [2, 3])
def test_limit_below_floor_is_one_line_error_naming_the_floor(vpp):
    # floor = one microbatch on all vpp local chunks = vpp * (1/vpp) = 1 unit; one chunk alone is 1/vpp
    spec = make_spec(pp=4, microbatches=8, vpp=vpp, mem_limit=0.9)
    with pytest.raises(ScheduleError) as e:
        plan("zbvpp", spec)
    msg = str(e.value)
    assert "\n" not in msg and "smallest feasible limit is 1 units" in msg and "--mem-limit 1" in msg
    s = plan("zbvpp", make_spec(pp=4, microbatches=8, vpp=vpp, mem_limit=1.0))  # the floor itself works
    assert max(simulate(s, Costs()).peak_memory) <= 1.0 + 1e-9


def test_template_pass_times_like_the_simulator():
    # the pass's own clock must agree with the simulator on the job lists it returns
    costs = Costs(F=1, B=1.5, W=0.7, comm=0.2)
    mem = runtime_mem_model("torch")
    prob = G.make_problem(4, 2, 8, Placement.INTERLEAVED, costs, mem, 4.0)
    n = 0
    for tpl in Z.template_grid()[:12]:
        orders = [Z.fb_order(4, 2, 8, d, w) for d, w in enumerate(Z.warmups(prob, tpl))]
        r = Z.template_pass(prob, orders, tpl)
        if r is None:
            continue
        n += 1
        from pipeloom.core.ir import make_schedule
        s = make_schedule("t", 4, 2, 8, Placement.INTERLEAVED, r.seqs, witness=r.order)
        assert validate(s, mem=mem, mem_limit=4.0) == []
        sim = simulate(s, costs, mem)
        assert sim.makespan == pytest.approx(r.makespan)
        assert sim.peak_memory == pytest.approx(r.peak)
    assert n >= 6


def test_never_slower_than_interleaved_1f1b_split_at_its_memory():
    # Megatron's interleaved 1F1B (fused BW) at its own peak: zbvpp at that peak is never slower
    for pp, m in [(2, 4), (4, 8), (4, 6), (8, 16)]:
        costs = Costs(F=1, B=1, W=1, comm=0.5)
        ref_spec = make_spec(pp=pp, microbatches=m, vpp=2, costs=costs)
        ref = simulate(plan("interleaved", ref_spec), costs)
        lim = max(ref.peak_memory)
        s = plan("zbvpp", make_spec(pp=pp, microbatches=m, vpp=2, costs=costs, mem_limit=lim))
        assert simulate(s, costs).makespan <= ref.makespan + 1e-9


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 4), (4, 8), (8, 8), (8, 16)])
@pytest.mark.parametrize("costs", ["F=1,B=1,W=1", "F=1,B=1.5,W=0.7,comm=0.2"])
def test_not_slower_than_torch_interleaved_zero_bubble(pp, m, costs):
    torch_int = pytest.importorskip("pipeloom.integrations.torch")
    costs = Costs.parse(costs)
    mem = runtime_mem_model("torch")
    ref = simulate(torch_int.torch_builtin("InterleavedZeroBubble", pp, m, 2), costs, mem)
    lim = max(ref.peak_memory)
    s = plan("zbvpp", make_spec(pp=pp, microbatches=m, vpp=2, costs=costs, mem=mem, mem_limit=lim))
    r = simulate(s, costs, mem)
    assert max(r.peak_memory) <= lim + 1e-9
    assert r.makespan <= ref.makespan + 1e-9


def test_options_are_checked():
    with pytest.raises(ScheduleError, match="budget"):
        plan("zbvpp", make_spec(pp=2, microbatches=2, vpp=2, options={"budget": -1}))
    with pytest.raises(ScheduleError, match="polish"):
        plan("zbvpp", make_spec(pp=8, microbatches=32, vpp=2, options={"polish": 1}))
    s = plan("zbvpp", make_spec(pp=2, microbatches=4, vpp=2, options={"budget": 0, "template_budget": 0,
                                                                    "polish": 0}))
    assert validate(s) == []


@pytest.mark.parametrize("pp,m", [(4, 8), (4, 12), (8, 16)])
def test_strictly_shorter_than_torch_interleaved_zero_bubble_with_uneven_costs(pp, m):
    # torch's own order (its class's pipeline_order, no processes) timed by pipeloom's simulator; zbvpp under
    # torch's peak with the same placement must be strictly shorter where the costs are not all equal (these
    # shapes tied torch before the cool-down reorder of fb_order's ``pull``)
    torch_int = pytest.importorskip("pipeloom.integrations.torch")
    costs = Costs(F=1, B=1.5, W=0.7, comm=0.2)
    mem = runtime_mem_model("torch")
    ref = simulate(torch_int.torch_builtin("InterleavedZeroBubble", pp, m, 2), costs, mem)
    lim = max(ref.peak_memory)
    s = plan("zbvpp", make_spec(pp=pp, microbatches=m, vpp=2, costs=costs, mem=mem, mem_limit=lim))
    assert validate(s, mem=mem, mem_limit=lim) == []
    r = simulate(s, costs, mem)
    assert max(r.peak_memory) <= lim + 1e-9
    assert r.makespan < ref.makespan - 0.1


@pytest.mark.parametrize("pp,vpp,m", [(4, 2, 8), (4, 3, 8), (4, 2, 6), (3, 2, 7), (4, 2, 3), (8, 2, 8), (2, 4, 4)])
def test_pull_moves_only_last_group_backwards_and_stays_valid(pp, vpp, m):
    costs = Costs(F=1, B=1.5, W=0.7, comm=0.2)
    mem = runtime_mem_model("torch")
    prob = G.make_problem(pp, vpp, m, Placement.INTERLEAVED, costs, mem, float(pp))
    from pipeloom.core.ir import Kind, make_schedule
    from pipeloom.schedule.classic import microbatch_groups
    last = set((microbatch_groups(m, pp) if m >= pp else [list(range(m))])[-1])
    n_ok = 0
    for pull in range(1, pp):
        tpl = Z.Template(1, 0, "none", "fit", pull)
        ws = Z.warmups(prob, tpl)
        for d, w in enumerate(ws):
            base, new = Z.fb_order(pp, vpp, m, d, w), Z.fb_order(pp, vpp, m, d, w, pull)
            assert sorted(base) == sorted(new)  # the same jobs, only reordered
            # only the last group's backwards move: everything else keeps its order
            def rest(seq):
                return [j for j in seq if not (j.kind is Kind.B and j.mb in last)]
            assert rest(new) == rest(base)
            if d == 0 and pull < len(last) and m > 1:
                assert new != base
            # a microbatch's backwards still go down its local chunks
            for mb in range(m):
                assert [j.chunk for j in new if j.kind is Kind.B and j.mb == mb] == sorted(
                    (j.chunk for j in new if j.kind is Kind.B and j.mb == mb), reverse=True)
        for t in Z.template_grid()[:12]:  # some warm-ups do not fit 1p (the pass then returns None)
            t = replace(t, pull=pull)
            r = Z.template_pass(prob, [Z.fb_order(pp, vpp, m, d, w, pull) for d, w in enumerate(Z.warmups(prob, t))], t)
            if r is None:
                continue
            n_ok += 1
            s = make_schedule("t", pp, vpp, m, Placement.INTERLEAVED, r.seqs, witness=r.order)
            assert validate(s, mem=mem, mem_limit=float(pp)) == []
            assert simulate(s, costs, mem).makespan == pytest.approx(r.makespan)
    assert n_ok >= 1


def test_bound_option_skips_only_the_lower_bound():
    """``-O bound=false`` (what ``tune``'s sweep passes) leaves the plan itself unchanged and only drops
    ``meta['lower_bound']``, which the default computes."""
    spec = make_spec(pp=4, microbatches=8, vpp=2, mem_limit="1p")
    with_bound = plan("zbvpp", spec)
    without = plan("zbvpp", make_spec(pp=4, microbatches=8, vpp=2, mem_limit="1p", options={"bound": False}))
    assert "lower_bound" in with_bound.meta and "lower_bound" not in without.meta
    assert without.devices == with_bound.devices
