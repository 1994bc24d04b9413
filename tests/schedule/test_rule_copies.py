"""Every engine that still decides with its own reading of the rules, checked against the hand-written oracle
(tests/ruleoracle.py) in seconds, so that a mutation in any one copy of the dependency, duration, comm or memory
rule fails here, not only minutes later in the golden tests.

The engines: the greedy pass (Python and its C transcription), the zb_looped template pass, the lock-step
passes, the building blocks, the solver's warm start, and every registered builder through the simulator
(the timing kernel). Each must return job lists the oracle finds valid, with the times and peaks it
reports equal to the oracle's (exactly: the same float operations), under comm and uneven per-chunk costs.
"""
import pytest

from ruleoracle import chunk_dur, oracle_peaks, oracle_time, oracle_valid

from pipeloom import make_spec, plan
from pipeloom.core import rules
from pipeloom.core.costs import Costs, MemModel
from pipeloom.core.ir import Placement, Schedule, make_schedule
from pipeloom.schedule import registry, zb_looped
from pipeloom.schedule.optimal import _greedy_orders
from pipeloom.schedule.search import greedy as g
from pipeloom.schedule.search import lockstep, portfolio, vblock
from pipeloom.sim import kernel
from pipeloom.sim.simulate import simulate

UNEVEN = Costs(F=(1.0, 1.5, 1.0, 2.0, 1.0, 1.25), B=(2.0, 1.0, 3.0, 2.0, 2.5, 2.0), W=(1.0, 0.5, 1.0, 1.5, 2.0, 1.0),
               comm=0.5)
EVEN = Costs(F=1.0, B=2.0, W=1.0, comm=0.25)


def _check_lists(prob, seqs, *, times=None, peak=None, held=False):
    """``seqs`` valid for the oracle, within the limit; ``times`` (makespan, per-device last end) and ``peak``
    as the oracle computes them (``held``: the engine may keep a device idle on purpose, so its times are a
    valid but not the earliest execution of the order: at least the oracle's)."""
    s = make_schedule("x", prob.pp, prob.vpp, prob.m, prob.placement, seqs)
    assert oracle_valid(s), "the oracle finds the job lists invalid"
    pk = oracle_peaks(seqs, prob.a, prob.b)
    assert max(pk) <= prob.limit + 1e-9
    if peak is not None:
        assert list(peak) == pk
    if times is not None:
        _s, end = oracle_time(seqs, prob.nc, prob.pp, prob.placement, chunk_dur(prob.dF, prob.dB, prob.dW),
                              prob.comm)
        if held:
            assert times[0] >= max(e[-1] for e in end) - 1e-9
        else:
            assert times[0] == max(e[-1] for e in end)
            assert list(times[1]) == [e[-1] for e in end]


def _problems():
    yield g.make_problem(3, 2, 6, Placement.V, UNEVEN, MemModel(), 4.5)
    yield g.make_problem(3, 2, 7, Placement.V, EVEN, MemModel(), None)
    yield g.make_problem(3, 1, 6, Placement.INTERLEAVED, Costs(F=(1, 2, 1), B=(2, 2, 3), W=(1, 1, 0.5), comm=0.5),
                         MemModel(), 3.0)
    yield g.make_problem(2, 3, 5, Placement.INTERLEAVED, UNEVEN, MemModel(), 3.5)


@pytest.mark.parametrize("prob", list(_problems()), ids=lambda p: f"pp{p.pp}v{p.vpp}m{p.m}{p.placement.value}")
@pytest.mark.parametrize("impl", ["python", "c"])
def test_greedy_pass(prob, impl):
    if impl == "c" and g._accel is None:
        pytest.skip("C extension not built")
    run = g._run_pass_py if impl == "python" else g._run_pass_c
    ran = 0
    for pol in portfolio.policy_grid(prob)[:25]:
        r = run(prob, pol)
        if r is None:
            continue
        ran += 1
        # (lookahead holds a device free for a coming B: its starts are then not the earliest possible)
        _check_lists(prob, r.seqs, times=(r.makespan, r.ends), peak=r.peak, held=pol.lookahead > 0)
    assert ran >= 5


@pytest.mark.parametrize("prob", [p for p in _problems() if p.placement is Placement.INTERLEAVED and p.vpp >= 2],
                         ids=lambda p: f"pp{p.pp}v{p.vpp}m{p.m}")
def test_zb_looped_template_pass(prob):
    res = zb_looped.template_candidates(prob, 10 ** 6)
    assert res
    for r in res:
        _check_lists(prob, r.seqs, times=(r.makespan, r.ends), peak=r.peak)


@pytest.mark.parametrize("prob", [p for p in _problems() if p.placement is Placement.V],
                         ids=lambda p: f"pp{p.pp}m{p.m}")
def test_lockstep_and_vblock(prob):
    got = list(lockstep.candidates(prob)) + list(lockstep.candidates(prob, uniform_costs=True))
    assert got
    for seqs, _pol in got:
        _check_lists(prob, seqs)
    tight = g.make_problem(prob.pp, 2, prob.m, Placement.V, prob_costs(prob), MemModel(), prob.pp / 2 + 1)
    blocks = list(vblock.candidates(tight, 10 ** 6))
    assert blocks
    for seqs, _blk in blocks:
        _check_lists(tight, seqs)


def prob_costs(prob) -> Costs:
    return Costs(F=prob.dF, B=prob.dB, W=prob.dW, comm=prob.comm)


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("f_first", [True, False])
def test_solver_warm_start(split, f_first):
    prob = next(_problems())
    seqs = _greedy_orders(prob.pp, prob.m, prob.nc, prob.placement, split, prob.dF, prob.dB, prob.dW, prob.comm,
                          prob.a, prob.b, prob.limit, f_first)
    _check_lists(prob, seqs)


@pytest.mark.parametrize("name", registry.names())
def test_every_builder_through_the_kernel(name):
    if name == "optimal":
        pytest.skip("CP-SAT: covered by tests/schedule/test_optimal.py")
    info = registry.get(name)
    vpp = registry.default_vpp(name)
    costs = Costs(F=UNEVEN.F[:3 * vpp], B=UNEVEN.B[:3 * vpp], W=UNEVEN.W[:3 * vpp], comm=0.5) if 3 * vpp <= 6 else EVEN
    spec = make_spec(pp=3, microbatches=6, vpp=vpp, costs=costs, options={"effort": "fast"} if any(
        o.name == "effort" for o in info.options) else None)
    s = plan(name, spec)
    assert oracle_valid(s)
    nc = s.num_chunks
    dF, dB, dW = costs.per_chunk(nc)
    dur = chunk_dur(dF, dB, dW)
    pairs = {}
    for d, i in s.overlapped:
        d1, d2 = dur(d, i, s.devices[d][i]), dur(d, i + 1, s.devices[d][i + 1])
        pairs[(d, i)] = (d1, d2, costs.overlap * min(d1, d2))
    _st, end = oracle_time(s.devices, nc, s.pp, s.placement, dur, costs.comm, pairs=pairs)
    r = simulate(s, costs, spec.mem)
    assert r.end == end
    a, b = spec.mem.per_chunk(nc, s.vpp)
    assert r.peak_memory == oracle_peaks(s.devices, a, b)


def test_a_mutated_rule_is_caught(monkeypatch):
    """The check above can fail: drop the backward's wait for the next chunk's grad from core/rules.py (which
    the kernel reads) and the simulator no longer agrees with the oracle."""
    spec = make_spec(pp=3, microbatches=4, costs="F=1,B=2,W=1,comm=0.5")
    s = plan("1f1b", spec)
    _st, want = oracle_time(s.devices, 3, 3, s.placement, chunk_dur(*spec.costs.per_chunk(3)), 0.5)
    assert simulate(s, spec.costs).end == want
    orig = rules.needs
    monkeypatch.setattr(rules, "needs", lambda kind, mb, c, nc: orig(kind, mb, c, nc)[:1])
    kernel._make_rules.cache_clear()
    try:
        assert simulate(s, spec.costs).end != want
    finally:
        monkeypatch.undo()
        kernel._make_rules.cache_clear()


def test_a_mutated_memory_rule_is_caught(monkeypatch):
    """The same for the memory rule: W freeing a instead of a - b changes the greedy's peaks."""
    prob = next(_problems())
    r = g._run_pass_py(prob, g.Policy())
    _check_lists(prob, r.seqs, peak=r.peak)
    orig = rules.memory_delta
    monkeypatch.setattr(rules, "memory_delta", lambda k, a, b: -a if k.value == "W" else orig(k, a, b))
    bad = g.make_problem(prob.pp, prob.vpp, prob.m, prob.placement, prob_costs(prob), MemModel(), prob.limit)
    r2 = g._run_pass_py(bad, g.Policy())
    with pytest.raises(AssertionError):
        _check_lists(prob, r2.seqs, peak=r2.peak)
