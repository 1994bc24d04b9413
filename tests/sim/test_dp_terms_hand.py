"""The DP terms pipeloom.sim.dp charges that had no hand computation yet: one P2P send, ZeRO-1's bucketed
reduce-scatters followed by the parameter all-gather, ZeRO-2 without overlap (each backward waits for its
reduce-scatter), and ZeRO-2/3's unsharded working set per dtype (memory.sharding)."""
from __future__ import annotations

import pytest

from pipeloom.core.costs import Costs
from pipeloom.memory.layers import TrainConfig
from pipeloom.memory.sharding import shard_transient_bytes
from pipeloom.schedule import registry
from pipeloom.schedule.registry import PlanSpec
from pipeloom.sim.dp import DPLink, Link, p2p_seconds, simulate_dp
from pipeloom.sim.simulate import simulate

# 2 ranks at 1 byte/s: a reduce-scatter or all-gather of n bytes moves n/2 bytes (n/2 s), an all-reduce n (n s)
LINK = DPLink(bandwidth=1.0, latency=0.0, unit_s=1.0)


def _sim(m=2):
    sched = registry.build("1f1b", PlanSpec(pp=1, microbatches=m, costs=Costs(F=1, B=1, W=1)))
    return simulate(sched, Costs(F=1, B=1, W=1))  # F0 0-1, BW0 1-3, F1 3-4, BW1 4-6


def _flat(ivs):
    return [x for s, e, _ in ivs for x in (s, e)]


def test_p2p_send_is_latency_plus_bytes_over_bandwidth():
    assert p2p_seconds(4e9, Link(bandwidth=2e9, latency=5e-6)) == pytest.approx(2.0 + 5e-6)


def test_zero1_reduce_scatters_each_bucket_then_gathers_the_parameters():
    """4 bytes in 2-byte buckets through BW1 (4-6): ready at 5 and 6, each RS 1 s: 5-6, 6-7; then the updated
    parameters' all-gather of 4 bytes (2 s): 7-9."""
    res = simulate_dp(_sim(), [4.0], 2, LINK, zero=1, bucket_bytes=2.0)
    ivs = res.intervals[0]
    assert [lab for _, _, lab in ivs] == ["RS 0", "RS 0", "AG 0"]
    assert _flat(ivs) == pytest.approx([5, 6, 6, 7, 7, 9])
    assert res.step_time == pytest.approx(9.0)


def test_zero2_without_overlap_each_backward_waits_for_its_reduce_scatter():
    """BW0 1-3 then its RS 3-5 (the device waits: +2), F1 5-6, BW1 6-8, RS 8-10 (+2), the all-gather 10-12."""
    res = simulate_dp(_sim(), [4.0], 2, LINK, zero=2, overlap=False)
    assert _flat(res.intervals[0]) == pytest.approx([3, 5, 8, 10, 10, 12])
    assert res.step_time == pytest.approx(12.0)


@pytest.mark.parametrize("dtype,zero,per_param", [("bf16", 2, 4), ("bf16", 3, 6), ("fp16", 2, 6), ("fp16", 3, 8),
                                                  ("bf16", 1, 0), ("bf16", 0, 0)])
def test_shard_transient_by_hand(dtype, zero, per_param):
    """ZeRO-2: the chunk's unsharded fp32 main gradients (fp16: plus the fp16 copy, 6 B); ZeRO-3: plus the
    gathered parameters in the parameter dtype (2 B)."""
    train = TrainConfig(dp=8, zero=zero, dtype=dtype)
    assert shard_transient_bytes(train, 1000) == pytest.approx(per_param * 1000)
