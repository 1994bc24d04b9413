"""Gradient groups in pipeloom.sim.dp (expert parallelism: dense gradients over dp x cp ranks, routed experts'
over dp x cp / ep), against hand computations, and the tuner's groups."""
from __future__ import annotations

import pytest

from pipeloom.core.costs import Costs
from pipeloom.schedule import registry
from pipeloom.schedule.registry import PlanSpec
from pipeloom.sim.dp import GradGroup, Link, device_dp
from pipeloom.sim.simulate import simulate


def _sim(pp=1, m=2):
    sched = registry.build("1f1b", PlanSpec(pp=pp, vpp=1, microbatches=m, costs=Costs(F=1, B=1, W=1)))
    return simulate(sched, Costs(F=1, B=1, W=1))


FAST, SLOW = Link(bandwidth=4.0, latency=0.0), Link(bandwidth=1.0, latency=0.5)


def test_two_groups_no_overlap_by_hand():
    """pp 1, 2 microbatches: the last job ends at 6. 80 bytes, 3/4 dense over 8 ranks on SLOW
    (2 * 7/8 * 60 / 1 + 2 * 7 * 0.5 = 105 + 7 = 112 s), 1/4 experts over 2 ranks on FAST
    (2 * 1/2 * 20 / 4 + 2 * 1 * 0 = 5 s): one all-reduce each, one after the other: 6 + 117."""
    sim = _sim()
    groups = [GradGroup(share=[0.75], ranks=8, link=SLOW), GradGroup(share=[0.25], ranks=2, link=FAST)]
    end, ivs = device_dp(sim, 0, [80.0], 8, SLOW, overlap=False, groups=groups)
    assert end == pytest.approx(6 + 117)
    assert [(s, e) for s, e, _ in ivs] == [(pytest.approx(6), pytest.approx(123))]
    # the old model: every byte over 8 ranks on SLOW: 2 * 7/8 * 80 + 7 = 147
    end1, _ = device_dp(sim, 0, [80.0], 8, SLOW, overlap=False)
    assert end1 == pytest.approx(6 + 147)


def test_one_rank_expert_group_costs_nothing_and_zero1_by_hand():
    """ep = dp x cp: every expert is on one rank, its gradients are not reduced. ZeRO-1 without overlap: the
    reduce-scatter of 3/4 of 80 bytes over 4 ranks on FAST (3/4 * 60 / 4 = 11.25) then the all-gather of 3/4 of
    40 parameter bytes (3/4 * 30 / 4 = 5.625) after the last job (6)."""
    sim = _sim()
    groups = [GradGroup(share=[0.75], ranks=4, link=FAST), GradGroup(share=[0.25], ranks=1, link=SLOW)]
    end, ivs = device_dp(sim, 0, [80.0], 4, FAST, overlap=False, zero=1, param_bytes=[40.0], groups=groups)
    assert end == pytest.approx(6 + 11.25 + 5.625)
    assert [lab for _, _, lab in ivs] == ["RS 0", "AG 0"]
    groups1 = [GradGroup(share=[1.0], ranks=1, link=FAST)]
    assert device_dp(sim, 0, [80.0], 4, FAST, overlap=False, groups=groups1) == (6.0, [])


def test_grad_group_rejects_bad_values():
    with pytest.raises(ValueError, match="ranks >= 1"):
        GradGroup(share=[1.0], ranks=0, link=FAST)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        GradGroup(share=[1.5], ranks=2, link=FAST)


def test_tuner_groups_by_hand():
    """tp 1, dp 16, ep 4, 8 GPUs a node, NVLink 100 B/s, NIC 10 B/s: the dense group (16 ranks, 8 in a node)
    gets min(100, 8 x 10) = 80 B/s; the expert-data-parallel group (16 / 4 = 4 ranks, tp x ep = 4 apart, so 2 in
    a node) min(100, 2 x 10) = 20 B/s; a chunk of 100 parameters of which 25 are routed experts: shares 3/4, 1/4."""
    from types import SimpleNamespace

    from pipeloom.tune.moe_costs import grad_groups

    space = SimpleNamespace(p=SimpleNamespace(gpn=8), gpu=SimpleNamespace(intra=Link(bandwidth=100.0, latency=1.0),
                                                                          inter=Link(bandwidth=10.0, latency=2.0)))
    chunks = [SimpleNamespace(params=100, expert_params=25), SimpleNamespace(params=40, expert_params=0)]
    dense, expert = grad_groups(space, SimpleNamespace(tp=1, dp=16, cp=1, ep=4), chunks)
    assert (dense.ranks, dense.link.bandwidth, list(dense.share)) == (16, 80.0, [0.75, 1.0])
    assert (expert.ranks, expert.link.bandwidth, expert.link.latency, list(expert.share)) == (4, 20.0, 2.0, [0.25, 0.0])
    # context parallel: the dense group is dp x cp = 8 ranks, the experts' 8 / 4 = 2, tp x ep = 8 apart: one a node
    dense, expert = grad_groups(space, SimpleNamespace(tp=2, dp=4, cp=2, ep=4), chunks)
    assert (dense.ranks, expert.ranks, expert.link.bandwidth) == (8, 2, 10.0)
    # no expert parallelism: one group of every byte
    (one,) = grad_groups(space, SimpleNamespace(tp=1, dp=16, cp=1, ep=1), chunks)
    assert (one.ranks, list(one.share)) == (16, [1.0, 1.0])


def test_tune_explain_shows_both_groups():
    import json

    from clirun import pipeloom

    cmd = ["tune", "--model", "Qwen3-30B-A3B", "--gpus", "64", "--global-batch",
           "256", "--seq", "4096", "--schedules", "dualpipev", "--max-vpp", "2", "--recompute", "none",
           "--top", "1", "--tp", "1", "--ep", "8", "--json", "--explain"]
    d = json.loads(pipeloom(*cmd, check=True).stdout)
    groups = d["explain"]["parallel"]["groups"]
    dense, expert = d["explain"]["dp_grad_groups"]
    assert (dense["ranks"], expert["ranks"]) == (groups["dp"], groups["expert_dp"])
    assert sum(expert["params_per_chunk"]) > 0 and all(x >= 0 for x in dense["params_per_chunk"])
