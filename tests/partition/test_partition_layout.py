"""Partition layouts (seed 002 rules), layer cost files and their reduction to per-chunk costs."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.partition import (LayerCost, LayerCosts, PartitionError, default_layer_costs, from_counts,
                                from_layers_per_device, head_ratios, layer_costs_from_csv, layer_costs_from_dict,
                                load_layer_costs, make_partition, parse_counts, uniform)
from pipeloom.core.ir import Placement, device_of

PLACEMENTS = [Placement.INTERLEAVED, Placement.V]


# ---------------------------------------------------------------------- seed 002 examples
def test_mission_example_user_layers_5_3():
    """MISSION.md (b)6: pp2 vpp2, 8 layers, GPU0 5 / GPU1 3 -> seg_layer_num [3,2,2,1]."""
    p = from_layers_per_device([5, 3], pp=2, vpp=2, num_layers=8)
    assert p.seg_layer_num == [3, 2, 2, 1]
    # layers 0-2 chunk0@GPU0, 3-4 chunk0@GPU1, 5-6 chunk1@GPU0, 7 chunk1@GPU1 (local chunk numbering)
    assert p.devices() == [[[0, 1, 2], [5, 6]], [[3, 4], [7]]]
    assert p.layers_per_device() == [5, 3]


def test_old_bug_user_counts_are_honoured():
    """Seed 002's bug: 5/3 became 4/4. Our split keeps the user's counts."""
    p = from_layers_per_device([5, 3], pp=2, vpp=2)
    assert p.layers_per_device() != [4, 4]


def test_uniform_one_layer_fewer_still_works():
    """Seed 002's bug: a fixed seg_layer_num broke with one layer fewer; 7 layers on 4 chunks is fine."""
    p = uniform(7, pp=2, vpp=2)
    assert p.seg_layer_num == [2, 2, 2, 1]
    assert p.num_layers == 7


def test_v_placement_round_robin_uses_device_chunks_in_order():
    # pp2 vpp2 V: device 0 holds chunks 0 and 3, device 1 holds chunks 1 and 2
    p = from_layers_per_device([5, 3], pp=2, vpp=2, placement="v")
    assert p.seg_layer_num == [3, 2, 1, 2]
    assert p.devices() == [[[0, 1, 2], [6, 7]], [[3, 4], [5]]]


def test_json_devices_matches_placement():
    p = uniform(10, pp=2, vpp=2, placement="v")
    d = p.to_dict()
    assert d["devices"] == p.devices()
    assert d["head"] == {"chunk": 3, "device": 0}  # V: last chunk comes back to device 0
    assert d["embedding"] == {"chunk": 0, "device": 0}


# ---------------------------------------------------------------------- properties
@settings(max_examples=60, deadline=None)
@given(pp=st.integers(1, 6), vpp=st.integers(1, 4), extra=st.integers(0, 40), placement=st.sampled_from(PLACEMENTS))
def test_uniform_counts_match_seg_layer_num_rule(pp, vpp, extra, placement):
    nc = pp * vpp
    L = nc + extra
    p = uniform(L, pp, vpp, placement)
    seg = [0] * nc
    for j in range(L):  # seed 002, written out independently
        seg[j % nc] += 1
    assert p.seg_layer_num == seg
    assert max(seg) - min(seg) <= 1
    flat = [x for c in p.chunks for x in c]
    assert flat == list(range(L))  # contiguous, in global chunk order


@settings(max_examples=60, deadline=None)
@given(data=st.data(), pp=st.integers(1, 5), vpp=st.integers(1, 4), placement=st.sampled_from(PLACEMENTS))
def test_layers_per_device_round_robin(data, pp, vpp, placement):
    counts = data.draw(st.lists(st.integers(vpp, vpp + 9), min_size=pp, max_size=pp))
    p = from_layers_per_device(counts, pp, vpp, placement)
    assert p.layers_per_device() == counts
    assert [x for c in p.chunks for x in c] == list(range(sum(counts)))
    for s in range(pp):
        mine = [c for c in range(pp * vpp) if device_of(c, pp, placement) == s]  # increasing = local order
        local = [p.seg_layer_num[c] for c in mine]
        # device s's i-th layer -> local chunk i % vpp: local counts q+1 for the first r chunks, q after
        q, r = divmod(counts[s], vpp)
        assert local == [q + 1] * r + [q] * (vpp - r)
        if placement == Placement.INTERLEAVED:
            assert mine == [v * pp + s for v in range(vpp)]


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize("call, fix", [
    (lambda: uniform(3, 2, 2), "--layers >= 4"),
    (lambda: from_layers_per_device([5, 4], 2, 2, num_layers=8), "sum to 8"),
    (lambda: from_layers_per_device([5, 1], 2, 2), ">= vpp"),
    (lambda: from_layers_per_device([5, 3, 1], 2, 2), "one count per device"),
    (lambda: from_counts([2, 0, 2, 2], 2, 2), ">= 1"),
    (lambda: from_counts([2, 2], 2, 2), "one per chunk"),
    (lambda: parse_counts("7,x,8"), "7,8,8,9"),
    (lambda: LayerCost(F=-1.0), ">= 0"),
    (lambda: layer_costs_from_dict({"layers": [{"F": 1}, {"F": -2}]}), "negative"),
    (lambda: layer_costs_from_dict({"layers": [{"B": 1}]}), "F is required"),
    (lambda: layer_costs_from_dict({"layers": [{"F": 1, "X": 2}]}), "allowed are"),
    (lambda: layer_costs_from_csv("name,F,Q\nl0,1,2\n"), "allowed are"),
    (lambda: make_partition(pp=2, vpp=2, layers=8, layer_costs=LayerCosts((LayerCost(F=1),) * 6)), "agree"),
    (lambda: make_partition(pp=2, layers=8, layers_per_device=[4, 4], balance="bottleneck"), "drop"),
    (lambda: make_partition(pp=2), "--layers"),
])
def test_bad_input_one_line_error_names_fix(call, fix):
    with pytest.raises(PartitionError) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg
    assert fix in msg


# ---------------------------------------------------------------------- layer costs
def test_chunk_costs_count_embedding_and_head():
    layers = tuple(LayerCost(F=float(i + 1), B=2.0, W=1.0, mem=1.0) for i in range(6))
    lc = LayerCosts(layers, embedding=LayerCost(F=10.0, mem=0.5), head=LayerCost(F=100.0, B=50.0, mem=3.0))
    p = from_counts([2, 1, 2, 1], pp=2, vpp=2)
    cc = lc.chunk_costs(p)
    assert cc["F"] == [1 + 2 + 10, 3, 4 + 5, 6 + 100]
    assert cc["B"] == [4, 2, 4, 2 + 50]
    assert cc["mem"] == [2.5, 1, 2, 4]
    mem = lc.mem_model(p)
    assert sum(mem.a) == pytest.approx(2)  # normalised: chunks sum to pp
    assert mem.a[3] / mem.a[1] == pytest.approx(4.0)
    assert mem.b == pytest.approx([x / 2 for x in mem.a])
    c = lc.costs(p, comm=0.5)
    assert c.F == (13.0, 3.0, 9.0, 106.0) and c.comm == 0.5


def test_no_head_no_embedding_flags():
    lc = LayerCosts((LayerCost(F=1.0),) * 4, embedding=LayerCost(F=5.0), head=LayerCost(F=7.0))
    p = uniform(4, 2, 1, embedding=False, head=False)
    assert lc.chunk_costs(p)["F"] == [2.0, 2.0]


def test_default_costs_average_chunk_equals_base():
    from pipeloom.core.costs import Costs

    lc = default_layer_costs(12, 4, Costs(F=2.0, B=3.0, W=1.0))
    p = uniform(12, 2, 2)
    cc = lc.chunk_costs(p)
    assert cc["F"] == pytest.approx([2.0] * 4) and cc["B"] == pytest.approx([3.0] * 4)
    assert lc.mem_model(p).a == pytest.approx((0.5,) * 4)  # = the default MemModel a = 1/vpp


def test_head_ratio_formula():
    # Narayanan et al. 2021: head 2bshV vs layer 24bsh^2(1 + s/6h) -> V / (12 h (1 + s/6h))
    t, m = head_ratios(128000, 4096)
    assert t == pytest.approx(128000 / (12 * 4096))
    assert m == pytest.approx(6 * 128000 / (34 * 4096))
    t2, _ = head_ratios(128000, 4096, seq=4096)
    assert t2 == pytest.approx(t / (1 + 4096 / (6 * 4096)))
    with pytest.raises(PartitionError):
        default_layer_costs(8, 2, vocab=1000)  # hidden missing


def test_cost_files_json_count_and_csv(tmp_path):
    j = tmp_path / "c.json"
    j.write_text(json.dumps({"layers": {"count": 5, "F": 1, "B": 2, "W": 0.5}, "head": {"F": 3, "mem": 2}}))
    lc = load_layer_costs(str(j))
    assert lc.num_layers == 5 and lc.layers[0].B == 2 and lc.layers[0].mem == 1 and lc.head.mem == 2
    c = tmp_path / "c.csv"
    c.write_text("name,F,B,W,mem\nembedding,0.5,,,\nl0,1,1,1,1\nl1,2,,,3\nhead,4,4,4,2\n")
    lc = load_layer_costs(str(c))
    assert lc.num_layers == 2
    assert lc.layers[1].B == 2 and lc.layers[1].mem == 3  # B defaults to F
    assert lc.embedding.F == 0.5 and lc.head.W == 4
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PartitionError, match="not valid JSON"):
        load_layer_costs(str(bad))
    with pytest.raises(PartitionError, match="cannot read"):
        load_layer_costs(str(tmp_path / "missing.json"))
