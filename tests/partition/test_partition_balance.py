"""Cost-balanced partitions: exact DP against brute force, makespan search, memory budget."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.partition import (LayerCost, LayerCosts, balance, bottleneck_dp, default_layer_costs, from_counts,
                                uniform)
from pipeloom.schedule import registry
from pipeloom.sim.simulate import simulate


def _compositions(L: int, k: int):
    """All ways to write L as k positive parts (brute force for the DP check)."""
    for cuts in itertools.combinations(range(1, L), k - 1):
        b = (0,) + cuts + (L,)
        yield [b[i + 1] - b[i] for i in range(k)]


def _max_chunk(lc: LayerCosts, counts, pp, vpp) -> float:
    t = [x.total for x in lc.layers]
    out, s = [], 0
    for k, n in enumerate(counts):
        c = sum(t[s:s + n])
        if k == 0:
            c += lc.embedding.total
        if k == len(counts) - 1:
            c += lc.head.total
        out.append(c)
        s += n
    return max(out)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), pp=st.integers(1, 3), vpp=st.integers(1, 2))
def test_bottleneck_dp_is_exact(data, pp, vpp):
    nc = pp * vpp
    L = data.draw(st.integers(nc, 9))
    fs = data.draw(st.lists(st.integers(0, 9), min_size=L, max_size=L))
    head = data.draw(st.integers(0, 20))
    emb = data.draw(st.integers(0, 5))
    lc = LayerCosts(tuple(LayerCost(F=float(f), B=1.0, W=0.0) for f in fs), embedding=LayerCost(F=float(emb)),
                    head=LayerCost(F=float(head)))
    best = min(_max_chunk(lc, c, pp, vpp) for c in _compositions(L, nc))
    p = bottleneck_dp(lc, pp, vpp)
    assert p.num_layers == L and len(p.chunks) == nc
    assert _max_chunk(lc, p.seg_layer_num, pp, vpp) == pytest.approx(best)


def _heavy_head(L=32, vocab=128000, hidden=4096):
    return default_layer_costs(L, 4, vocab=vocab, hidden=hidden)


def test_heavy_head_dp_moves_layers_off_the_last_stage():
    lc = _heavy_head()
    p = bottleneck_dp(lc, 4, 1)
    u = uniform(32, 4, 1)
    assert p.seg_layer_num[-1] < u.seg_layer_num[-1]
    assert max(lc.chunk_costs(p)["total"]) < max(lc.chunk_costs(u)["total"])


@pytest.mark.parametrize("schedule, vpp", [("1f1b", 1), ("interleaved", 2), ("zbh1", 1), ("zbv", 2)])
def test_makespan_balance_beats_uniform_with_heavy_head(schedule, vpp):
    if schedule not in registry.names():
        pytest.skip(f"{schedule} not registered")
    pp, m = 2, 4
    lc = _heavy_head(L=16)
    r = balance(lc, pp, vpp, objective="makespan", schedule=schedule, microbatches=m, max_evals=8)
    assert r.best.makespan <= r.dp.makespan + 1e-9
    assert r.best.makespan < r.uniform.makespan
    # re-time the returned partition independently of the search's cache
    p = r.partition
    spec = registry.PlanSpec(pp=pp, vpp=vpp, microbatches=m, costs=lc.costs(p), mem=lc.mem_model(p))
    sched = registry.build(schedule, spec)
    assert sched.placement == p.placement
    assert simulate(sched, spec.costs, spec.mem).makespan == pytest.approx(r.best.makespan)


def test_uniform_layers_no_head_balance_keeps_makespan():
    lc = default_layer_costs(16, 4)
    r = balance(lc, 4, 1, objective="makespan", schedule="1f1b", microbatches=8, head=False, embedding=False)
    assert r.best.makespan == pytest.approx(r.uniform.makespan)


def test_memory_budget_is_respected():
    # layers whose memory grows toward the end; time is uniform except a heavy first layer,
    # so the makespan wants few layers on device 0 (= more on later devices, more memory there)
    layers = [LayerCost(F=4.0 if i == 0 else 1.0, mem=1.0 + i) for i in range(16)]
    lc = LayerCosts(tuple(layers))
    free = balance(lc, 4, 1, objective="makespan", schedule="1f1b", microbatches=8)
    peak_free = max(free.best.peak_memory)
    limit = peak_free * 0.9
    r = balance(lc, 4, 1, objective="makespan", schedule="1f1b", microbatches=8, mem_limit=limit)
    assert r.best.overflow == 0.0
    assert max(r.best.peak_memory) <= limit + 1e-9
    assert r.best.makespan >= free.best.makespan - 1e-9


def test_balance_needs_schedule_for_makespan():
    from pipeloom.partition import PartitionError

    with pytest.raises(PartitionError, match="--schedule"):
        balance(default_layer_costs(8, 2), 2, 1, objective="makespan")
    with pytest.raises(PartitionError, match="objective"):
        balance(default_layer_costs(8, 2), 2, 1, objective="fastest")


def test_vpp2_bottleneck_polish_lowers_device_load():
    lc = _heavy_head(L=24)
    r = balance(lc, 3, 2, objective="bottleneck")
    assert max(r.best.device_load) <= max(r.dp.device_load) + 1e-12
    assert max(r.best.device_load) < max(r.uniform.device_load)
    assert from_counts(r.partition.seg_layer_num, 3, 2).num_layers == 24
