"""DP gradient buckets reduced during the backward (Megatron's --overlap-grad-reduce) and ZeRO-2/3 timing in
pipeloom.sim.dp, against hand computations; the tuner and the simulator's --dp share the model."""
from __future__ import annotations

import pytest

from pipeloom.core.costs import Costs
from pipeloom.schedule import registry
from pipeloom.schedule.registry import PlanSpec
from pipeloom.sim.dp import DPLink, bucket_ready, default_bucket_params, simulate_dp
from pipeloom.sim.simulate import simulate


def _sim(name="1f1b", pp=1, m=2, vpp=1):
    sched = registry.build(name, PlanSpec(pp=pp, vpp=vpp, microbatches=m, costs=Costs(F=1, B=1, W=1)))
    return simulate(sched, Costs(F=1, B=1, W=1))


# 2 ranks: an all-reduce of n bytes moves 2 * 1/2 * n = n bytes: 1 byte/s -> n seconds (unit 1 s)
LINK = DPLink(bandwidth=1.0, latency=0.0, unit_s=1.0)


def _flat(ivs):
    return [x for s, e, _ in ivs for x in (s, e)]


def test_bucket_ready_by_hand():
    assert bucket_ready(10.0, 20.0, 100.0, 40.0) == [(14.0, 40.0), (18.0, 40.0), (20.0, 20.0)]
    assert bucket_ready(10.0, 20.0, 100.0, None) == [(20.0, 100.0)]
    assert bucket_ready(10.0, 20.0, 100.0, 500.0) == [(20.0, 100.0)]
    assert bucket_ready(10.0, 20.0, 0.0, 40.0) == []


def test_megatron_default_bucket():
    assert default_bucket_params(8) == 40_000_000
    assert default_bucket_params(128) == 128_000_000


def test_pp1_buckets_hide_behind_the_last_backward():
    """pp 1, two microbatches: F0 0-1, BW0 1-3, F1 3-4, BW1 4-6. 4 bytes of gradients in buckets of 1 byte are
    ready at 4.5, 5, 5.5, 6 and each takes 1 s: the last ends at 8.5; one bucket: 6 + 4 = 10."""
    sim = _sim()
    assert sim.makespan == 6.0
    one = simulate_dp(sim, [4.0], 2, LINK)
    assert one.step_time == pytest.approx(10.0)
    buck = simulate_dp(sim, [4.0], 2, LINK, bucket_bytes=1.0)
    assert _flat(buck.intervals[0]) == pytest.approx([4.5, 5.5, 5.5, 6.5, 6.5, 7.5, 7.5, 8.5])
    assert buck.step_time == pytest.approx(8.5) and buck.dp_exposed == pytest.approx(2.5)


def test_zero2_reduce_scatters_after_every_backward_then_gathers():
    """ZeRO-2: the gradients are sharded, so each BW reduce-scatters its chunk (2 ranks: RS of n bytes = n/2 s),
    then the updated parameters' all-gather (n/2 s)."""
    sim = _sim()
    res = simulate_dp(sim, [4.0], 2, LINK, zero=2)
    ivs = res.intervals[0]
    assert [lab for _, _, lab in ivs] == ["RS 0", "RS 0", "AG 0"]
    assert _flat(ivs) == pytest.approx([3, 5, 6, 8, 8, 10])
    assert res.step_time == pytest.approx(10.0)


def test_zero3_gathers_parameters_before_every_pass_and_late_ones_delay_the_device():
    """ZeRO-3: all-gather (2 s for 4 bytes on 2 ranks) before each F and BW, prefetched when the previous job
    starts. F0 waits for its gather (0-2): F0 2-3; BW0's gather 2-4 (ready at F0's start): BW0 4-6 (shift 3);
    its RS 6-8; F1's gather ready at BW0's start 4, link free at 8: 8-10, F1 10-11; BW1's gather ready at
    F1's start 10: 10-12, BW1 12-14; its RS 14-16."""
    sim = _sim()
    res = simulate_dp(sim, [4.0], 2, LINK, zero=3)
    ivs = res.intervals[0]
    assert [lab for _, _, lab in ivs] == ["AG 0", "AG 0", "RS 0", "AG 0", "AG 0", "RS 0"]
    assert _flat(ivs) == pytest.approx([0, 2, 2, 4, 6, 8, 8, 10, 10, 12, 14, 16])
    assert res.step_time == pytest.approx(16.0)
    fast = simulate_dp(sim, [4.0], 2, DPLink(bandwidth=1e12, latency=0.0, unit_s=1.0), zero=3)
    assert fast.step_time == pytest.approx(6.0, abs=1e-6)


def test_bad_zero_and_bucket_are_errors():
    sim = _sim()
    with pytest.raises(ValueError, match="zero must be"):
        simulate_dp(sim, [4.0], 2, LINK, zero=4)
    with pytest.raises(ValueError, match="bucket"):
        simulate_dp(sim, [4.0], 2, LINK, bucket_bytes=0.0)


def test_zero3_gathers_one_unit_ahead():
    """ZeRO-3 with 2 units (layers) per chunk, one microbatch (F 0-1, BW 1-3 planned): each unit's gather (half
    the parameters, 1 s) is issued when the previous unit starts. F: gathers 0-1 and 1-2, units 1-1.5 and
    2-2.5; BW: gathers 2-3 (issued at F's start) and 3-4, units 3-4 and 4-5; the per-unit reduce-scatters are
    ready at 4 and 5: 4-5, 5-6. One unit per chunk: 8."""
    sim = _sim(m=1)
    assert sim.makespan == 3.0
    res = simulate_dp(sim, [4.0], 2, LINK, zero=3, units=[2])
    assert [lab for _, _, lab in res.intervals[0]] == ["AG 0"] * 4 + ["RS 0"] * 2
    assert _flat(res.intervals[0]) == pytest.approx([0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6])
    assert res.step_time == pytest.approx(6.0)
    assert simulate_dp(sim, [4.0], 2, LINK, zero=3).step_time == pytest.approx(8.0)
