"""Analytic memory estimator and `pipeloom memory` CLI (no torch needed)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.cli import main
from pipeloom.memory import analytic as an
from pipeloom.memory.analytic import ModelConfig, TrainConfig
from pipeloom.core.ir import B, F, W, make_schedule
from pipeloom.core.costs import MemModel
from pipeloom.sim.simulate import memory_profile

GiB = 1024 ** 3


# ---------------------------------------------------------------- published parameter counts
@pytest.mark.parametrize("name,count", [
    # exact counts of the released Hugging Face checkpoints
    ("llama2-7b", 6_738_415_616), ("llama2-13b", 13_015_864_320), ("llama2-70b", 68_976_648_192),
    ("llama3-8b", 8_030_261_248), ("llama3-70b", 70_553_706_496),
])
def test_llama_param_counts_match_release(name, count):
    assert an.total_params(an.preset(name)) == count


@pytest.mark.parametrize("name,billions", [("gpt3-125m", 0.125), ("gpt3-350m", 0.35), ("gpt3-760m", 0.76),
                                           ("gpt3-1.3b", 1.3), ("gpt3-2.7b", 2.7), ("gpt3-6.7b", 6.7),
                                           ("gpt3-13b", 13.0), ("gpt3-175b", 175.0)])
def test_gpt3_param_counts_near_published(name, billions):
    # Brown et al. 2020 Table 2.1 rounds the counts; 3% covers the rounding
    assert an.total_params(an.preset(name)) == pytest.approx(billions * 1e9, rel=0.03)


def test_tiny_preset_matches_llama_config_formula():
    # LlamaConfig.num_params formula written out: 2*V*d + L*(2d^2 + 2d*kv + 3*d*f + 2d) + d
    V, d, L, kv, f = 256, 64, 8, 32, 176
    assert an.total_params(an.preset("llama-tiny")) == 2 * V * d + L * (2 * d * d + 2 * d * kv + 3 * d * f + 2 * d) + d


# ---------------------------------------------------------------- Korthikanti et al. 2022
def _gpt_layer(h, a, s):
    return ModelConfig(name="gpt", hidden=h, layers=2, heads=a, ffn=4 * h, vocab=1000, seq=s, mlp="gelu",
                       norm="layernorm", bias=True, tied_embeddings=True, learned_positions=True, dropout=0.1)


@settings(max_examples=60)
@given(h_per_head=st.sampled_from([32, 64, 128]), heads=st.sampled_from([4, 8, 16, 32]),
       s=st.sampled_from([128, 512, 2048]), b=st.integers(1, 4), t=st.sampled_from([1, 2, 4]),
       sp=st.booleans(), rc=st.sampled_from(["none", "selective", "full"]))
def test_layer_activations_reproduce_korthikanti(h_per_head, heads, s, b, t, sp, rc):
    h = h_per_head * heads
    m = _gpt_layer(h, heads, s)
    tr = TrainConfig(seq=s, micro_batch=b, dtype="bf16", tp=t, sequence_parallel=sp, recompute=rc,
                     attention="math", impl="fused")
    got = sum(i.bytes for i in an.layer_activations(m, tr))
    sbh, a = s * b * h, heads
    sp = sp and t > 1
    if rc == "full":
        want = 2 * sbh / (t if sp else 1)
    elif rc == "selective":
        want = sbh * 34 / t if sp else sbh * (10 + 24 / t)
    elif sp:
        want = sbh * (34 / t + 5 * a * s / (h * t))
    else:
        want = sbh * (10 + 24 / t + 5 * a * s / (h * t))
    # our list also keeps the two LayerNorms' fp32 mean/rstd (8 bytes per token each) the paper ignores
    stats = 0 if rc == "full" else 2 * 8 * s * b / (t if sp else 1)
    assert got == pytest.approx(want + stats, rel=1e-12)


def test_w_held_is_zero_bubble_32sbh():
    # Qi et al. 2024, Table 1: W of a GPT layer needs 32*s*b*h (GEMM inputs 14 + output grads 18)
    m = _gpt_layer(1024, 16, 512)
    tr = TrainConfig(seq=512, micro_batch=2, dtype="bf16", attention="math")
    assert an.layer_w_held(m, tr) == 32 * 512 * 2 * 1024


def test_gqa_and_flash_shrink_attention():
    base = dict(hidden=1024, layers=2, heads=16, ffn=2816, vocab=1000, seq=1024)
    mha, gqa = ModelConfig(**base), ModelConfig(kv_heads=4, **base)
    tr = TrainConfig(attention="flash", impl="fused")
    k_mha = {i.name: i.bytes for i in an.layer_activations(mha, tr)}
    k_gqa = {i.name: i.bytes for i in an.layer_activations(gqa, tr)}
    assert k_gqa["attn.k"] == k_mha["attn.k"] / 4
    assert "attn.softmax" not in k_mha
    assert sum(i.bytes for i in an.layer_activations(mha, TrainConfig(attention="math"))) > sum(k_mha.values())


# ---------------------------------------------------------------- static bytes (Megatron table)
@pytest.mark.parametrize("dtype,per_param", [("fp32", 16), ("bf16", 18), ("fp16", 20)])
def test_bytes_per_param_without_sharding(dtype, per_param):
    assert sum(an.static_bytes(1000, TrainConfig(dtype=dtype))) == per_param * 1000


@pytest.mark.parametrize("dtype,fixed,sharded", [("fp32", 8, 8), ("bf16", 6, 12), ("fp16", 4, 16)])
@pytest.mark.parametrize("d", [2, 4, 8])
def test_bytes_per_param_distributed_optimizer(dtype, fixed, sharded, d):
    # Megatron-LM distrib_optimizer.md: fp16 4 + 16/d, bf16 6 + 12/d, fp32 8 + 8/d
    P = 8000
    assert sum(an.static_bytes(P, TrainConfig(dtype=dtype, dp=d, zero=1))) == P * fixed + P * sharded // d


# ---------------------------------------------------------------- schedule-driven peak
def _small(vocab=64):
    return ModelConfig(name="small", hidden=256, layers=8, heads=4, kv_heads=2, ffn=704, vocab=vocab, seq=128)


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 3), (3, 7)])
def test_1f1b_peak_counts_in_flight_microbatches(pp, m):
    model = _small()
    tr = TrainConfig(seq=128, micro_batch=2)
    rep = an.estimate(model, tr, schedule="1f1b", pp=pp, microbatches=m)
    chunks = an.chunk_memory(model, tr, an.split_layers(8, pp))
    for d, dev in enumerate(rep.devices):
        # 1F1B keeps min(pp - d, m) microbatches alive on device d
        assert dev.activations_bytes == pytest.approx(min(pp - d, m) * chunks[d].activation_bytes)
        assert dev.peak_bytes == pytest.approx(dev.params_bytes + dev.grads_bytes + dev.optimizer_bytes
                                               + dev.activations_bytes + dev.transient_bytes)


def test_fthenb_holds_every_microbatch_and_more_than_1f1b():
    model, tr = _small(), TrainConfig(seq=128)
    g = an.estimate(model, tr, schedule="fthenb", pp=4, microbatches=8)
    o = an.estimate(model, tr, schedule="1f1b", pp=4, microbatches=8)
    for dg, do in zip(g.devices, o.devices):
        assert dg.peak_units == pytest.approx(8 * an.mem_model_for(
            an.chunk_memory(model, tr, an.split_layers(8, 4)), 4)[1][dg.device])
        assert dg.activations_bytes > do.activations_bytes


def test_activation_trace_matches_simulator_and_handles_negative_b():
    s = make_schedule("t", 1, 1, 2, "interleaved", [[F(0, 0), F(1, 0), B(0, 0), W(0, 0), B(1, 0), W(1, 0)]])
    a, b = [1.0], [0.25]
    assert an.activation_trace(s, a, b) == memory_profile(s, MemModel(a=(1.0,), b=(0.25,)))
    # B allocating (b < 0): 1, 2, 2.5, 1.5, 2.0, 1.0 -> wait: W frees a - b = 1.5
    peaks, tr = an.activation_trace(s, [1.0], [-0.5])
    assert tr[0] == [1.0, 2.0, 2.5, 1.0, 1.5, 0.0]
    assert peaks == [2.5]


def test_full_recompute_lowers_activations():
    model = an.preset("llama2-7b")
    none = an.estimate(model, TrainConfig(), schedule="1f1b", pp=4, microbatches=8)
    full = an.estimate(model, TrainConfig(recompute="full"), schedule="1f1b", pp=4, microbatches=8)
    assert full.devices[0].activations_bytes < none.devices[0].activations_bytes / 5


# ---------------------------------------------------------------- bytes -> schedule units
def test_parse_bytes_units():
    assert an.parse_bytes("80GiB") == 80 * GiB
    assert an.parse_bytes("80GB") == 80 * 10 ** 9
    assert an.parse_bytes("512 MiB") == 512 * 1024 ** 2
    assert an.parse_bytes("1234") == 1234
    with pytest.raises(ValueError, match="not understood"):
        an.parse_bytes("80 gigs")


@settings(max_examples=25)
@given(k=st.floats(0.5, 12.0), pp=st.sampled_from([2, 4]), reserve=st.integers(0, 3))
def test_mem_limit_units_inverts_the_budget(k, pp, reserve):
    model, tr = an.preset("llama2-7b"), TrainConfig()
    chunks = an.chunk_memory(model, tr, an.split_layers(model.layers, pp))
    U = sum(c.activation_bytes for c in chunks) / pp
    # the tightest device: largest static + transient
    need = max(sum(an.static_bytes(c.params, tr)) + an.transient_bytes(model, tr, [c], split=True) for c in chunks)
    gpu = int(need + reserve * GiB + k * U)
    got = an.mem_limit_units(model, tr, pp=pp, gpu_bytes=gpu, reserve_bytes=reserve * GiB)
    assert got == pytest.approx(k, abs=1e-6)


def test_byte_mem_limit_is_converted_into_units():
    model, tr = an.preset("llama2-7b"), TrainConfig(recompute="selective")
    rep = an.estimate(model, tr, schedule="1f1b", pp=4, microbatches=8, mem_limit="60GiB")
    assert rep.mem_limit_units == pytest.approx(an.mem_limit_units(model, tr, pp=4, gpu_bytes="60GiB"))
    rep2 = an.estimate(model, tr, schedule="1f1b", pp=4, microbatches=8, mem_limit="1.5p")
    assert rep2.mem_limit_units == 6.0


# ---------------------------------------------------------------- errors
def test_config_errors_are_one_line():
    with pytest.raises(ValueError, match="unknown model preset 'gpt5'"):
        an.preset("gpt5")
    with pytest.raises(ValueError, match="not divisible by tp=3"):
        an.estimate("llama2-7b", TrainConfig(tp=3), pp=2, microbatches=4)
    with pytest.raises(ValueError, match="kv_heads"):
        ModelConfig(hidden=64, layers=2, heads=4, kv_heads=3, ffn=128, vocab=10)
    with pytest.raises(ValueError, match="recompute"):
        TrainConfig(recompute="some")
    with pytest.raises(ValueError, match="cannot fill"):
        an.estimate("llama-tiny", TrainConfig(), pp=4, vpp=4, schedule="interleaved", microbatches=4)


# ---------------------------------------------------------------- CLI
def _cli_json(capsys, *argv):
    rc = main(["memory", *argv, "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out)


def test_cli_json_contract(capsys):
    rc, d = _cli_json(capsys, "--model", "llama2-7b", "--pp", "4", "--vpp", "2", "--microbatches", "8",
                      "--schedule", "interleaved", "--tp", "1", "--gpu-memory", "80GiB")
    assert rc == 0
    assert isinstance(d["total_params"], int) and d["total_params"] == 6_738_415_616
    assert len(d["devices"]) == 4
    for dev in d["devices"]:
        for k in ("params", "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "peak_bytes"):
            assert isinstance(dev[k], int) and dev[k] > 0
        assert dev["params_bytes"] == 2 * dev["params"]  # bf16
    assert sum(dev["params"] for dev in d["devices"]) == d["total_params"]
    assert d["fits"] is True and d["largest_limit_level"] in ("1p", "1.5p", "2p")


def test_cli_recompute_full_and_not_fitting(capsys):
    rc, d = _cli_json(capsys, "--model", "llama2-70b", "--pp", "4", "-m", "8", "--recompute", "full",
                      "--gpu-memory", "80GiB")
    assert rc == 1 and d["fits"] is False  # 70B on 4 GPUs: ~16 bytes/param * 17B params per device
    assert d["largest_limit_level"] is None


def test_cli_table_runs(capsys):
    assert main(["memory", "--model", "gpt3-1.3b", "--pp", "2", "-m", "4", "--gpu-memory", "40GiB"]) == 0
    out = capsys.readouterr().out
    assert "fits" in out and "gpt3-1.3b" in out


@pytest.mark.parametrize("argv,msg", [
    (["--model", "nope", "--pp", "2", "-m", "4"], "unknown model preset"),
    (["--model", "llama2-70b", "--pp", "2", "-m", "4", "--tp", "3"], "not divisible by tp=3"),
    (["--model", "llama2-7b", "--pp", "2", "-m", "4", "--gpu-memory", "lots"], "not understood"),
    (["--model", "llama2-7b", "--pp", "2", "-m", "4", "--layers-per-chunk", "8,8"], "must be >= 0 and sum"),
    (["--model", "llama2-7b", "--pp", "2", "-m", "4", "--schedule", "nosuch"], "unknown schedule"),
])
def test_cli_errors(capsys, argv, msg):
    assert main(["memory", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pipeloom: error:") and msg in err and "\n" not in err


def test_analytic_does_not_import_torch():
    code = ("import sys, pipeloom.memory.analytic as a; a.estimate('llama2-7b', pp=4, microbatches=8); "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_memory_aware_schedule_meets_a_byte_limit():
    rep = an.estimate("llama2-7b", TrainConfig(), schedule="zbv", pp=4, microbatches=8, mem_limit="45GiB")
    assert max(d.peak_units for d in rep.devices) <= rep.mem_limit_units + 1e-9
    for d in rep.devices:  # bytes -> units -> schedule -> bytes again: every device within 45 GiB
        assert d.peak_bytes <= 45 * GiB
    unlimited = an.estimate("llama2-7b", TrainConfig(), schedule="zbv", pp=4, microbatches=8)
    assert max(d.peak_bytes for d in unlimited.devices) > 45 * GiB


def test_non_memory_aware_schedule_over_limit_is_reported():
    rep = an.estimate("llama2-7b", TrainConfig(), schedule="1f1b", pp=4, microbatches=8, mem_limit="45GiB")
    assert any("above the limit" in n for n in rep.notes)
