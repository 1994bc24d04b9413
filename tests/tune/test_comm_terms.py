"""The TP/SP communication terms of one layer and what each overlap mode exposes, against hand computations
(pipeloom.tune.comm_terms; formulas: Korthikanti et al. 2022 Sec. 4.2.2, Megatron-LM's async dgrad collective)."""
from __future__ import annotations

import pytest
from clirun import pipeloom

from pipeloom.models.config import ModelConfig
from pipeloom.sim.dp import Link
from pipeloom.tune import comm_terms as ct
from pipeloom.tune.comm_terms import TPOverlap, TPOverlapError
from pipeloom.tune.costs import layer_times, shape_efficiency
from pipeloom.tune.gpus import GPU

# GeLU MLP (2 matrices), MHA: q = kv = h
M = ModelConfig(name="t", hidden=1024, layers=4, heads=8, ffn=4096, vocab=1000, seq=512, mlp="gelu",
                norm="layernorm")
LINK = Link(bandwidth=1e9, latency=0.0)
T, TP = 512, 4
# one all-gather of the T x h bf16 activation over 4 ranks: 3/4 * 512*1024*2 / 1e9 s
G = 0.75 * T * 1024 * 2 / 1e9


def test_volumes_by_hand():
    assert ct.tp_forward(M, T, TP, LINK) == pytest.approx(4 * G)
    assert ct.tp_grad_gather(M, T, TP, LINK) == pytest.approx(2 * G)
    assert ct.tp_dgrad_reduce(M, T, TP, LINK) == pytest.approx(2 * G)
    assert ct.tp_input_regather(M, T, TP, LINK) == pytest.approx(2 * G)
    # latency: 3 ring steps per all-gather
    lat = Link(bandwidth=1e9, latency=1e-6)
    assert ct.tp_forward(M, T, TP, lat) == pytest.approx(4 * (G + 3e-6))
    assert ct.tp_forward(M, T, 1, LINK) == 0.0
    # column-parallel wgrad: QKV (h x 3h) and fc1 (h x 4h), 2 FLOPs per multiply-add
    assert ct.column_wgrad_flops(M, T) == pytest.approx(2 * T * (1024 * 3 * 1024 + 1024 * 4096))
    assert ct.gemm_flops(M, T) == pytest.approx(2 * T * (4 * 1024 * 1024 + 2 * 1024 * 4096))


def _terms(mode, fused, rate, ub=False):
    return ct.tp_layer_terms(M, T, TP, LINK, rate, TPOverlap.parse(mode, ub), fused=fused)


# a rate at which the column wgrad (per rank) takes exactly half the dgrad reduce-scatter: half stays exposed
RED = 2 * G
RATE_SLOW_GEMM = ct.column_wgrad_flops(M, T) / TP / (RED / 2)


def test_async_hides_the_dgrad_reduce_behind_the_wgrad_only_in_a_fused_backward():
    wcol = ct.column_wgrad_flops(M, T) / TP / RATE_SLOW_GEMM
    assert wcol == pytest.approx(RED / 2)
    fused = _terms("async", True, RATE_SLOW_GEMM)
    split = _terms("async", False, RATE_SLOW_GEMM)
    assert fused["B"]["tp_dgrad_reduce"] == pytest.approx((RED, RED - wcol))  # max(0, comm - wgrad)
    assert split["B"]["tp_dgrad_reduce"] == pytest.approx((RED, RED))         # nothing left to hide behind
    # the output-gradient all-gather is needed before the row dgrad: exposed in both
    assert fused["B"]["tp_grad_gather"][1] == pytest.approx(2 * G)
    # a fast GEMM hides all of it
    assert _terms("async", True, RATE_SLOW_GEMM * 1e-3)["B"]["tp_dgrad_reduce"][1] == 0.0
    # W re-gathers the column groups' inputs (split: in W; fused: in the BW's B part); kept inputs: no W term
    assert fused["W"] == {} and set(split["W"]) == {"tp_input_regather"}
    assert "tp_input_regather" in fused["B"]
    kept = ct.tp_layer_terms(M, T, TP, LINK, RATE_SLOW_GEMM, TPOverlap.parse("async"), fused=False, regather=False)
    assert kept["W"] == {} and "tp_input_regather" not in kept["B"]
    assert ct.exposed(_terms("off", False, RATE_SLOW_GEMM), "W") == pytest.approx(2 * G)


def test_regather_double_buffered_by_hand():
    # gathers 3, 3, 3 under GEMMs 1, 5: 3 + max(0, 3 - 1) + max(0, 3 - 5) = 5
    assert ct.regather_exposed([3.0, 3.0, 3.0], [1.0, 5.0, 9.0]) == pytest.approx(5.0)
    assert ct.regather_exposed([], []) == 0.0
    # per layer, steady state: QKV's gather under the previous layer's fc1 + fc2 wgrad, fc1's under QKV + proj
    ov = TPOverlap.parse("async")
    qkv = 2 * T * 1024 * 3 * 1024 / TP
    fc1, proj, fc2 = 2 * T * 1024 * 4096 / TP, 2 * T * 1024 * 1024 / TP, 2 * T * 4096 * 1024 / TP
    rate = (qkv + proj) / (G / 2)  # QKV + proj take G/2: fc1's gather half exposed; fc1 + fc2 (G) hide QKV's
    total, exp = ct.regather_layer(M, T, TP, LINK, rate, ov, fused=False)
    assert total == pytest.approx(2 * G)
    assert (fc1 + fc2) / rate == pytest.approx(G) and exp == pytest.approx(G / 2, abs=1e-12)
    # fused backward: each gather under its own group's dgrad GEMMs (QKV: G/2 * qkv/(qkv+proj))
    total, exp = ct.regather_layer(M, T, TP, LINK, rate, ov, fused=True)
    assert exp == pytest.approx(max(0.0, G - qkv / rate) + max(0.0, G - fc1 / rate))
    # blocking (off): the whole of both
    assert ct.regather_layer(M, T, TP, LINK, rate, TPOverlap.parse("off"), fused=False) == (2 * G, 2 * G)


def test_chunked_fused_backward_runs_as_async():
    """The runtime runs a fused BW (and a B fused with its W) under chunked:K as async: the wgrad GEMMs hide
    the whole collective, no token pieces (the old model charged chunked pieces, then took the wgrad off)."""
    for rate in (RATE_SLOW_GEMM, RATE_SLOW_GEMM * 0.3, RATE_SLOW_GEMM * 4):
        chunked = _terms("chunked:4", True, rate)["B"]["tp_dgrad_reduce"]
        assert chunked == pytest.approx(_terms("async", True, rate)["B"]["tp_dgrad_reduce"])
    # at this rate the old rule (pieces, then the wgrad) exposed less than the runtime does
    wcol = ct.column_wgrad_flops(M, T) / TP / RATE_SLOW_GEMM
    g_dgrad = ct.gemm_flops(M, T) / TP / RATE_SLOW_GEMM
    old = max(0.0, ct.chunked_exposed(RED, g_dgrad, 4) - wcol)
    now = _terms("chunked:4", True, RATE_SLOW_GEMM)["B"]["tp_dgrad_reduce"][1]
    assert now == pytest.approx(RED - wcol) and now > old


def test_off_exposes_everything():
    t = _terms("off", True, RATE_SLOW_GEMM)
    for kind in "FBW":
        for total, exp in t[kind].values():
            assert exp == total
    # B of a fused BW: the output-gradient gathers, the dgrad reduce-scatters and the inputs gathered again
    assert ct.exposed(t, "F") == pytest.approx(4 * G) and ct.exposed(t, "B") == pytest.approx(6 * G)


def test_chunked_by_hand():
    # k = 4 chunks of comm 8 over a GEMM of 4: c = 2 per chunk, GEMM 1 per chunk -> 2 + 3 * (2 - 1) = 5
    assert ct.chunked_exposed(8.0, 4.0, 4) == pytest.approx(5.0)
    # a GEMM longer than the collective: only the last chunk's collective shows
    assert ct.chunked_exposed(8.0, 100.0, 4) == pytest.approx(2.0)
    rate = RATE_SLOW_GEMM
    g_dgrad = ct.gemm_flops(M, T) / TP / rate
    split = _terms("chunked:4", False, rate)
    assert split["B"]["tp_dgrad_reduce"][1] == pytest.approx(ct.chunked_exposed(RED, g_dgrad, 4))
    assert split["B"]["tp_dgrad_reduce"][1] < RED  # beats the blocking split B


def test_fill_hides_behind_an_earlier_microbatchs_w_in_a_split_b():
    wcol = ct.column_wgrad_flops(M, T) / TP / RATE_SLOW_GEMM
    assert _terms("fill", False, RATE_SLOW_GEMM)["B"]["tp_dgrad_reduce"][1] == pytest.approx(RED - wcol)


def test_userbuffers_overlaps_the_forward():
    rate = RATE_SLOW_GEMM
    g_f = ct.gemm_flops(M, T) / TP / rate
    t = _terms("async", True, rate, ub=True)
    assert t["F"]["tp_forward"][1] == pytest.approx(max(4 * G / TP, 4 * G - g_f))
    assert t["F"]["tp_forward"][1] < 4 * G


def test_bad_modes_are_one_line():
    for bad in ("on", "chunked", "chunked:1", "chunked:x"):
        with pytest.raises(TPOverlapError) as e:
            TPOverlap.parse(bad)
        assert "\n" not in str(e.value)
    assert str(TPOverlap.parse("chunked:3")) == "chunked:3"


GPU_ = GPU(name="g", peak_flops=1e14, memory=80 * 2 ** 30, hbm_bandwidth=2e12, intra=LINK, inter=LINK)


def test_layer_times_charge_the_mode():
    """tp 4: the async fused backward is shorter than the blocking one by the hidden reduce-scatter; a split B
    keeps it (the old model charged every TP collective in full everywhere)."""
    kw = dict(tp=4, micro_batch=1, seq=512, recompute="none")
    off = layer_times(M, GPU_, 0.5, tp_overlap="off", fused=True, **kw)
    fused = layer_times(M, GPU_, 0.5, tp_overlap="async", fused=True, **kw)
    split = layer_times(M, GPU_, 0.5, tp_overlap="async", fused=False, **kw)
    b = fused.parts["tp_terms_s"]["B"]
    hidden = b["tp_dgrad_reduce"]["hidden"] + b["tp_input_regather"]["hidden"]
    assert b["tp_dgrad_reduce"]["hidden"] > 0 and b["tp_input_regather"]["hidden"] > 0
    assert off.B - fused.B == pytest.approx(hidden)
    # a split B keeps its reduce-scatter exposed; the re-gather moves with the weight gradients to W
    regather = off.parts["tp_terms_s"]["B"]["tp_input_regather"]["total"]
    assert split.B == pytest.approx(off.B - regather)
    w = split.parts["tp_terms_s"]["W"]["tp_input_regather"]
    assert w["total"] == pytest.approx(regather) and split.W - split.parts["compute_W_s"] == pytest.approx(w["exposed"])
    assert fused.F == off.F  # the forward is not overlapped without userbuffers


def test_shape_efficiency_by_hand():
    assert shape_efficiency(0.6, 0.0, 123.0) == 0.6
    assert shape_efficiency(0.6, 100.0, 100.0) == pytest.approx(0.3)
    assert shape_efficiency(0.6, 100.0, 300.0) == pytest.approx(0.45)
    kw = dict(tp=1, micro_batch=1, seq=512, recompute="none")
    flat = layer_times(M, GPU_, 0.5, **kw)
    curved = layer_times(M, GPU_, 0.5, half_hidden=1024, **kw)  # M's hidden size: half the rate
    assert curved.F == pytest.approx(2 * flat.F) and curved.parts["efficiency"] == pytest.approx(0.25)


def _cli(*args):
    return pipeloom("tune", *args)


def test_cli_explain_lists_every_communication_term_and_bad_modes_are_one_line():
    import json

    base = ["--model", "llama-tiny", "--gpus", "8", "--gpus-per-node", "4", "--gpu-flops", "2e9", "--gpu-memory",
            "24MiB", "--reserve", "0", "--global-batch", "16", "--schedules", "1f1b", "--tp", "2",
            "--max-microbatch-size", "1", "--recompute", "none"]
    r = _cli(*base, "--json", "--explain", "--tp-overlap", "chunked:2", "--dp-bucket-size", "1000",
             "--efficiency", "0.5", "--efficiency-half-hidden", "50")
    assert r.returncode == 0, r.stderr
    explain = json.loads(r.stdout)["explain"]
    h = 64  # llama-tiny's hidden size
    assert explain["layer"]["efficiency"] == pytest.approx(0.5 * h / (h + 50))
    comm = explain["communication"]
    assert comm["tp_overlap"] == "chunked:2" and comm["backward"] == "fused BW"
    per = comm["tp_per_layer_and_chunk_pass"]
    assert set(per) == {"F", "B (of a fused BW)", "W"}
    assert set(per["B (of a fused BW)"]) >= {"tp_grad_gather", "tp_dgrad_reduce", "tp_input_regather"}
    # a split schedule: the re-gather is W's term
    r = _cli(*[a if a != "1f1b" else "zbv" for a in base], "--json", "--explain")
    assert r.returncode == 0, r.stderr
    w = json.loads(r.stdout)["explain"]["communication"]["tp_per_layer_and_chunk_pass"]["W"]["tp_input_regather"]
    assert w["total"] == pytest.approx(w["exposed"] + w["hidden"]) and w["total"] > 0
    for term in per["B (of a fused BW)"]["tp_dgrad_reduce"], per["F"]["tp_forward"]:
        assert term["total"] == pytest.approx(term["exposed"] + term["hidden"]) and term["total"] > 0
    assert comm["dp"]["bucket_params"] == 1000
    assert comm["dp"]["busiest_link_s"] == pytest.approx(comm["dp"]["exposed_s"] + comm["dp"]["hidden_s"])
    for bad, words in (("chunked:1", "K >= 2"), ("sometimes", "choose off, async, chunked:K or fill")):
        r = _cli(*base, "--tp-overlap", bad)
        assert r.returncode == 2 and r.stderr.startswith("pipeloom: error:") and words in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
