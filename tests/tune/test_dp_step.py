"""The tuner's DP reduction is pipeloom.sim.dp's (one model: buckets during the backward, ZeRO order), and with
pp = 1 Megatron's buckets hide most of it behind the last backward."""
from __future__ import annotations

import pytest

from pipeloom.models.config import ModelConfig
from pipeloom.models.presets import preset
from pipeloom.sim.dp import DPLink, Link, simulate_dp
from pipeloom.tune import Calibration, Problem, gpu_preset, tune, with_overrides
from pipeloom.tune.costs import GRAD_BYTES, PARAM_BYTES
from pipeloom.tune.space import _Space

GPT_1_7B = ModelConfig(name="gpt-1.7b", hidden=2304, layers=24, heads=24, ffn=4 * 2304, vocab=51200, seq=2048,
                       mlp="gelu", norm="layernorm", bias=True, learned_positions=True)


def _best(model, gpus, gb, tp, pp, zero=0, schedule="1f1b", **kw):
    gpu = kw.pop("gpu", "h100")
    prob = Problem(model=model, gpus=gpus, gpu=gpu_preset(gpu) if isinstance(gpu, str) else gpu, global_batch=gb,
                   seq=model.seq,
                   tp=tp, pp=pp, top=1, schedules=(schedule,), recompute=("none",), zero=(zero,),
                   microbatch_sizes=(1,), partitions=("uniform",), calibration=Calibration(efficiency=0.5), **kw)
    res = tune(prob)
    return prob, res.best


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_tuner_dp_equals_the_simulators(zero):
    if zero >= 2:  # the tuner searches ZeRO-2/3 once the memory model shards gradients and parameters
        pytest.importorskip("pipeloom.memory.sharding")
    prob, c = _best(preset("llama2-7b"), 32, 64, 1, 2, zero=zero)
    assert c is not None and c.dp == 16
    space = _Space(prob)
    chunks = space.budget(c).chunk_memory
    unit = max(c.detail["chunk_F_s"])
    # tp 1 x dp 16 > 8 GPUs per node: the inter-node link, 8 ranks of the group per node sending through 8 NICs
    assert c.detail["dp_link"] == "inter x 8 NICs"
    link = Link(bandwidth=min(space.gpu.intra.bandwidth, 8 * space.gpu.inter.bandwidth), latency=space.gpu.inter.latency)
    res = simulate_dp(c.sim, [ch.params * GRAD_BYTES for ch in chunks], c.dp,
                      DPLink(bandwidth=link.bandwidth, latency=link.latency, unit_s=unit), zero=zero,
                      param_bytes=[ch.params * PARAM_BYTES for ch in chunks],
                      bucket_bytes=max(40_000_000, 1_000_000 * c.dp) * GRAD_BYTES, units=c.seg_layer_num)
    assert res.step_time * unit + c.optimizer_s == pytest.approx(c.step_time_s, rel=1e-9)
    assert res.dp_exposed * unit == pytest.approx(c.exposed_comm_s, rel=1e-6, abs=1e-9)


def test_pp1_buckets_hide_most_of_the_reduction():
    """Narayanan et al.'s 1.7B row (TP1 PP1, 32 A100): with Megatron's 40M-parameter buckets the all-reduce runs
    during the last microbatch's backward; with one bucket per chunk (the old model) all of it follows."""
    # one NIC's worth for the 8 ranks of a node (22.5 GB/s in all): the reduction outlasts one backward
    kw = dict(gpu=with_overrides(gpu_preset("a100-80g"), inter_bandwidth=22.5e9 / 8))
    prob, bucketed = _best(GPT_1_7B, 32, 512, 1, 1, **kw)
    _, one = _best(GPT_1_7B, 32, 512, 1, 1, dp_bucket_params=10 ** 12, **kw)
    params = _Space(prob).budget(bucketed).chunk_memory[0].params
    dur = one.detail["chunk_B_s"][0] + one.detail["chunk_W_s"][0]  # the last backward's seconds
    b, nb = 40_000_000, -(-params // 40_000_000)
    lat = 2 * 31 * gpu_preset("a100-80g").inter.latency  # per ring all-reduce over 32 ranks
    # the link is the bottleneck (an all-reduce of 6.8 GB of fp32 gradients at 22.5 GB/s, 0.59 s, is longer than
    # one backward): the queue starts when the first bucket is ready and runs without a gap, so it ends
    # dur (1 - b/params) earlier than the one bucket, less the latency of the nb - 1 extra collectives
    hidden = one.exposed_comm_s - bucketed.exposed_comm_s
    assert hidden == pytest.approx(dur * (1 - b / params) - (nb - 1) * lat, rel=1e-6)
    assert hidden > 0.5 * dur and bucketed.step_time_s < one.step_time_s


def test_dp_tail_by_hand():
    """The DP seconds that must follow a chunk's last weight-gradient job (the tuner's bounds): 100M parameters in
    40M buckets (40, 40, 20) over a job of 1 s: the first bucket is ready 0.6 s before the end, so at least
    all three reductions - 0.6 s, and never less than the last bucket's."""
    from types import SimpleNamespace

    from pipeloom.sim.dp import Link
    from pipeloom.tune.costs import all_gather, all_reduce, dp_tail, reduce_scatter

    link = Link(bandwidth=4e9, latency=0.0)
    gpu = SimpleNamespace(intra=link, inter=link)
    space = SimpleNamespace(p=SimpleNamespace(dp_bucket_params=None, gpn=8), gpu=gpu)
    c = SimpleNamespace(zero=0, dp=4, tp=1)
    r40, r20 = all_reduce(40e6 * 4, 4, link), all_reduce(20e6 * 4, 4, link)
    assert dp_tail(space, c, 100e6, 0, 1.0) == pytest.approx(max(r20, 2 * r40 + r20 - 0.6))
    assert dp_tail(space, c, 100e6, 0, 100.0) == pytest.approx(r20)  # a long job hides all but the last
    z1 = SimpleNamespace(zero=1, dp=4, tp=1)
    rs40, rs20 = reduce_scatter(40e6 * 4, 4, link), reduce_scatter(20e6 * 4, 4, link)
    assert dp_tail(space, z1, 100e6, 300e6, 1.0) == pytest.approx(
        max(rs20, 2 * rs40 + rs20 - 0.6) + all_gather(300e6 * 2, 4, link))


def test_dp_link_counts_the_nics_of_the_groups_ranks_in_a_node():
    """NCCL drives one ring per NIC: a DP group with k ranks in each 8-GPU node sends through k NICs."""
    from types import SimpleNamespace

    from pipeloom.tune.costs import dp_link

    g = gpu_preset("h100")  # intra 360 GB/s, one NIC 45 GB/s
    space = SimpleNamespace(p=SimpleNamespace(gpn=8), gpu=g)
    for tp, dp, want in ((1, 32, 8 * 45e9), (2, 16, 4 * 45e9), (4, 64, 2 * 45e9), (8, 64, 45e9), (1, 8, 360e9),
                         (2, 4, 360e9)):
        assert dp_link(space, SimpleNamespace(tp=tp, dp=dp)).bandwidth == pytest.approx(want), (tp, dp)
    fast_nics = SimpleNamespace(p=SimpleNamespace(gpn=8), gpu=with_overrides(g, inter_bandwidth=100e9))
    assert dp_link(fast_nics, SimpleNamespace(tp=1, dp=32)).bandwidth == pytest.approx(360e9)  # NVLink caps it
