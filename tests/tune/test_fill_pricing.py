"""``--tp-overlap fill`` priced B by B from the plan (:func:`pipeloom.tune.comm_terms.fill_pricing`): a split B
hides its collective only under W work pending at its position (an earlier microbatch's W whose B has run), as
the runtime's fill takes it; hand-written job lists with the answers worked out by hand, and ``tune --explain``
printing the counts."""
from __future__ import annotations

import json

import pytest
from clirun import pipeloom

from pipeloom.core.ir import Job
from pipeloom.tune.comm_terms import fill_b_costs, fill_pricing


def _jobs(text: str) -> list[Job]:
    return [Job.parse(t) for t in text.split()]


# one device, one chunk: B0 finds only its own W0 after it; B1 finds W0 (B0 ran); B2 finds W1, then its own W2
STAGGERED = _jobs("F0.0 F1.0 F2.0 B0.0 B1.0 W0.0 B2.0 W1.0 W2.0")
# all Bs first: B1 takes W0's work, B2 finds W0 used up and takes W1's
BS_FIRST = _jobs("F0.0 F1.0 F2.0 B0.0 B1.0 B2.0 W0.0 W1.0 W2.0")


def test_a_b_without_pending_w_hides_nothing_and_one_with_it_hides_up_to_that_w():
    p = fill_pricing([STAGGERED], comm=[1.0], w=[0.6])
    assert (p.split_b, p.filled_b, p.split_per_chunk) == ((3,), (2,), (3,))
    assert p.hidden == pytest.approx((1.2,)) and p.exposed == pytest.approx((1.8,))  # 0 + 0.4 + 0.4 exposed
    long_w = fill_pricing([STAGGERED], comm=[1.0], w=[1.5])  # a W longer than the collective hides all of it
    assert long_w.hidden == pytest.approx((2.0,)) and long_w.exposed == pytest.approx((1.0,))  # B0's stays
    capped = fill_pricing([STAGGERED], comm=[1.0], w=[1.5], hideable=[0.5])
    assert capped.hidden == pytest.approx((1.0,)) and capped.exposed == pytest.approx((2.0,))


def test_each_w_is_taken_once():
    p = fill_pricing([BS_FIRST], comm=[1.0], w=[0.6])
    assert (p.split_b, p.filled_b) == ((3,), (2,))
    assert p.hidden == pytest.approx((1.2,))  # B1: 0.6 of W0; B2: W0 is spent, 0.6 of W1


def test_fused_pairs_are_not_split_and_a_bw_in_between_stops_the_fill():
    fused = fill_pricing([_jobs("F0.0 B0.0 W0.0 F1.0 B1.0 W1.0")], comm=[1.0], w=[1.0])
    assert (fused.split_b, fused.filled_b, fused.hidden) == ((0,), (0,), (0.0,))
    # B1 would take W0, but BW2 of the same chunk adds to those gradients first
    bw = fill_pricing([_jobs("F0.0 F1.0 F2.0 B0.0 B1.0 BW2.0 W0.0 W1.0")], comm=[1.0], w=[1.0])
    assert (bw.split_b, bw.filled_b, bw.exposed) == ((2,), (0,), (2.0,))


def test_two_devices_two_chunks_are_priced_apart():
    d0 = _jobs("F0.0 F1.0 B0.0 B1.0 W0.0 W1.0")          # B1 fills from W0
    d1 = _jobs("F0.1 B0.1 F1.1 B1.1 W0.1 W1.1")          # B1 fills from W0
    p = fill_pricing([d0, d1], comm=[1.0, 2.0], w=[0.5, 3.0])
    # device 1: B0.1 -> W0.1 is its own pair's (no fill); B1.1 -> W0.1 (B0.1 ran): min(2.0, 3.0)
    assert (p.split_b, p.filled_b) == ((2, 2), (1, 1))
    assert p.hidden == pytest.approx((0.5, 2.0)) and p.exposed == pytest.approx((1.5, 2.0))


def test_tuner_b_costs_move_by_the_exposed_difference_per_backward_job():
    # 2 layers of red 0.5 per B (collective 1.0); the layer model assumed 0.2 of each layer exposed (0.3 hidden),
    # so a B may hide at most 0.6: B0 hides 0, B1 0.6 of W0, B2 0.6 of W1 -> exposed 1.8 instead of 3 x 0.4
    out, p = fill_b_costs([STAGGERED], B=[10.0], W=[0.6], layers=[2], red=0.5, assumed=0.2)
    assert p.exposed == pytest.approx((1.8,))
    assert out == pytest.approx([10.0 + (1.8 - 1.2) / 3])
    # never cheaper than the layer model: W work beyond the cap hides no more
    out, _ = fill_b_costs([STAGGERED], B=[10.0], W=[5.0], layers=[2], red=0.5, assumed=0.2)
    assert out == pytest.approx([10.0 + (1.0 + 0.4 + 0.4 - 1.2) / 3])
    # re-gathered inputs: fill may run only a share of each W (here half: 0.3 of W0, then 0.3 of W1)
    out, p = fill_b_costs([STAGGERED], B=[10.0], W=[0.6], layers=[2], red=0.5, assumed=0.2, movable=0.5)
    assert p.hidden == pytest.approx((0.6,)) and out == pytest.approx([10.0 + (2.4 - 1.2) / 3])


def test_cli_tune_explain_prints_the_fill_counts():
    base = ["--model", "llama-tiny", "--gpus", "4", "--gpus-per-node", "4", "--gpu-flops", "2e9", "--gpu-memory",
            "24MiB", "--reserve", "0", "--global-batch", "8", "--schedules", "zbv", "--tp", "2", "--pp", "2",
            "--max-microbatch-size", "1", "--recompute", "none", "--json", "--explain", "--tp-overlap", "fill"]
    r = pipeloom("tune", *base)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    comm = out["explain"]["communication"]
    fill = comm["tp_fill"]
    assert len(fill["split_b_per_device"]) == 2 == len(fill["filled_b_per_device"])
    # zbv splits some Bs; the first Bs of the cool-down find no pending W: fewer filled than split
    assert sum(fill["split_b_per_device"]) > 0
    assert all(0 <= f <= s for f, s in zip(fill["filled_b_per_device"], fill["split_b_per_device"]))
    assert sum(fill["filled_b_per_device"]) < sum(fill["split_b_per_device"])
    # every split B's collective is either hidden or exposed: (split Bs) x (layers of its chunk) x red
    best = out["configs"][0]
    layers = [n for n in best["seg_layer_num"] if n]
    assert len(set(layers)) == 1  # every chunk with layers alike here, so each split B carries layers[0] x red
    red = comm["tp_per_layer_and_chunk_pass"]["B"]["tp_dgrad_reduce"]["total"]
    assert fill["hidden_s"] + fill["exposed_s"] == pytest.approx(red * layers[0] * sum(fill["split_b_per_device"]))
    # the tuner charges the sequence-parallel re-gather in W: fill may run only the row-parallel GEMMs of a W
    assert 0.0 < fill["w_share_fill_may_run"] < 1.0
