"""Expert parallelism, context parallelism, light recompute and FP8 in the analytic memory model, each term
against a hand computation (pipeloom.memory.moe, pipeloom.models.moe)."""
from __future__ import annotations

import dataclasses
import json

import pytest
from clirun import pipeloom

from pipeloom.memory import analytic as an
from pipeloom.memory.budget import device_budget
from pipeloom.models.config import ModelConfig
from pipeloom.models.families.deepseek import mla_params
from pipeloom.models.hf_config import resolve_model
from pipeloom.models.moe import ParallelLayoutError, check_ep, ep_ranks_per_node, group_sizes, load_factor

MOE = ModelConfig(name="moe", hidden=64, layers=4, heads=4, kv_heads=2, ffn=96, vocab=128, seq=32,
                  experts=8, experts_per_token=2, expert_ffn=48)
ROUTED = 8 * 3 * 64 * 48  # one layer's routed experts: experts * (gate, up, down) * h * f_e


def _budget(model=MOE, pp=2, **kw):
    return device_budget(model, an.TrainConfig(**kw), pp=pp)


def test_ep_holds_experts_over_ep_and_shards_their_optimizer_over_dp_over_ep():
    base, ep = _budget(dp=8, zero=1), _budget(dp=8, zero=1, ep=4)
    for d in range(2):  # 2 layers per device, each with 3/4 of its routed experts elsewhere
        assert base.params[d] - ep.params[d] == 2 * ROUTED * 3 // 4
        expert = 2 * ROUTED // 4
        dense = ep.params[d] - expert
        # bf16 weights 2 + fp32 grads 4 per parameter; Adam 12 / (dp = 8) dense, 12 / (dp / ep = 2) experts
        assert ep.static[d] == (2 * ep.params[d], 4 * ep.params[d], -(-12 * dense // 8) + -(-12 * expert // 2))


def test_ep_layout_rules():
    check_ep(MOE, ep=8, dp=8)
    with pytest.raises(ParallelLayoutError, match="does not divide the 8 routed experts"):
        check_ep(MOE, ep=3, dp=3)
    with pytest.raises(ParallelLayoutError, match="carved out of the data-parallel"):
        check_ep(MOE, ep=4, dp=2)
    check_ep(MOE, ep=4, dp=2, cp=2)  # ep from dp * cp
    dense = dataclasses.replace(MOE, experts=0, experts_per_token=0)
    with pytest.raises(ParallelLayoutError, match="is dense"):
        check_ep(dense, ep=2, dp=2)
    with pytest.raises(ValueError, match="carved out"):
        _budget(dp=2, ep=4)
    assert group_sizes(tp=2, cp=2, ep=8, dp=16, pp=4) == {"world": 256, "tp": 2, "cp": 2, "pp": 4, "dp": 32,
                                                         "ep": 8, "expert_dp": 4}
    # ranks of an EP group inside one node of 8 GPUs: tp * cp apart
    assert ep_ranks_per_node(64, 1, 8) == 8 and ep_ranks_per_node(4, 2, 8) == 4 and ep_ranks_per_node(8, 8, 8) == 1


def test_capacity_factor_and_imbalance_scale_the_routed_items_only():
    assert load_factor(None, 1.0) == 1.0 and load_factor(1.25, 3.0) == 1.25 and load_factor(None, 1.5) == 1.5
    items = {it.name: it.bytes for it in an.layer_activations(MOE, an.TrainConfig())}
    cf = {it.name: it.bytes for it in an.layer_activations(MOE, an.TrainConfig(capacity_factor=1.5))}
    for name, b in items.items():
        assert cf[name] == pytest.approx(b * (1.5 if name.startswith("experts.") else 1.0))
    # expert input of a routed copy: tokens * k * h * 2 bytes * load
    assert cf["experts.fc1.input"] == 32 * 2 * 64 * 2 * 1.5
    with pytest.raises(an.MemoryConfigError, match=">= 1"):
        an.TrainConfig(moe_imbalance=0.5)


def test_routing_buffers_in_the_transient():
    tr = an.TrainConfig(dp=2)
    chunks = an.chunk_memory(MOE, tr, [2, 2])
    ep = an.TrainConfig(dp=2, ep=2)
    cf = an.TrainConfig(dp=2, ep=2, capacity_factor=2.0)
    # send + receive buffers of tokens * k * h values (bf16) with ep > 1, times the load: 2 * 2 * 32 * 2 * 64 * load
    assert an.transient_bytes(MOE, ep, chunks[:1]) - an.transient_bytes(MOE, tr, chunks[:1]) == 2 * 2 * 32 * 2 * 64
    assert an.transient_bytes(MOE, cf, chunks[:1]) - an.transient_bytes(MOE, tr, chunks[:1]) == 2 * 2 * 32 * 2 * 64 * 2


def test_context_parallel_halves_the_activations_and_needs_a_zigzag_split():
    one, two = _budget(seq=32), _budget(seq=32, cp=2)
    assert two.unit_bytes == pytest.approx(_budget(seq=16).unit_bytes)  # seq / cp tokens per rank
    assert two.unit_bytes < one.unit_bytes
    with pytest.raises(ParallelLayoutError, match="2\\*cp=8"):
        _budget(seq=36, cp=4)
    with pytest.raises(an.MemoryConfigError, match="flash"):
        an.TrainConfig(cp=2, attention="math")


def test_fp8_caches_gemm_inputs_in_one_byte_and_keeps_an_fp8_weight_copy():
    bf, f8 = an.TrainConfig(), an.TrainConfig(fp8=True)
    a = {it.name: it.bytes for it in an.layer_activations(MOE, bf)}
    b = {it.name: it.bytes for it in an.layer_activations(MOE, f8)}
    assert b["qkv.input"] == a["qkv.input"] / 2 and b["proj.input"] == a["proj.input"] / 2
    assert b["experts.swiglu.gate_up"] == a["experts.swiglu.gate_up"] / 2
    assert b["attn.q"] == a["attn.q"] and b["router.probs_fp32"] == a["router.probs_fp32"]
    x, y = _budget(), _budget(fp8=True)
    assert y.static[0][0] - x.static[0][0] == x.params[0]  # 1 byte per parameter


def test_light_recompute_drops_norm_outputs_from_f_but_w_still_holds_them():
    plain = an.TrainConfig()
    light = an.TrainConfig(recompute_norms=True)
    names = {it.name for it in an.layer_activations(MOE, light)}
    assert "qkv.input" not in names and "router.input" not in names and "experts.fc2.input" not in names
    assert "attn_norm.input" in names
    assert an.layer_w_held(MOE, light) == an.layer_w_held(MOE, plain)


def test_mla_items_by_hand():
    v3 = resolve_model("DeepSeek-V3")
    tr = an.TrainConfig(seq=8)
    items = {it.name: it.bytes for it in an.layer_activations(v3, tr)}
    tokens, H = 8, 128
    assert items["attn.q"] == items["attn.k"] == 2 * H * 192 * tokens        # d_nope + d_rope = 192
    assert items["attn.v"] == items["proj.input"] == 2 * H * 128 * tokens    # v_head_dim
    assert items["mla.q_latent"] == 2 * 1536 * tokens and items["mla.kv_b.input"] == 2 * 512 * tokens


def test_deepseek_v3_published_setup_fits_in_80_gb():
    """DeepSeek-V3 (arXiv 2412.19437): PP16 DualPipe, EP64, ZeRO-1, TP1 on 2048 H800 80GB, sequence 4096, with
    its memory savings (sec. 3.2.3 recompute of RMSNorm / MLA up-projections, sec. 3.3.3 FP8 caching). DualPipeV
    is DualPipe cut in half: the same activation peak (PP + 1 microbatches), one parameter copy."""
    v3 = resolve_model("DeepSeek-V3")
    train = an.TrainConfig(seq=4096, dp=128, zero=1, ep=64, recompute_norms=True, fp8=True)
    rep = an.estimate(v3, train, schedule="dualpipev", pp=16, microbatches=32, gpu_bytes="80GB")
    assert rep.fits and max(d.peak_bytes for d in rep.devices) <= 80e9
    # the MTP module (one MoE layer + eh_proj + 3 norms, experts / 64 here) sits with the head on the last chunk
    no_mtp = an.estimate(dataclasses.replace(v3, mtp_layers=0), train, schedule="dualpipev", pp=16, microbatches=32)
    h = v3.hidden
    routed = 256 * 3 * h * 2048
    mtp = (v3.hidden * 256 + 3 * h * 2048 + mla_params(v3) + 2 * h) + routed // 64 + 2 * h * h + 3 * h
    assert rep.devices[0].params - no_mtp.devices[0].params == mtp
    dense = an.estimate(v3, dataclasses.replace(train, ep=1), schedule="dualpipev", pp=16, microbatches=32,
                        gpu_bytes="80GB")
    assert not dense.fits  # priced dense, the experts alone are over the GPU


def test_memory_cli_ep_json_and_errors():
    cmd = ["memory", "--model", "Qwen3-30B-A3B", "--pp", "4", "-m", "8",
           "--dp", "16", "--zero", "1", "--seq", "4096"]
    out = pipeloom(*cmd, "--ep", "8", "--json", check=True)
    d = json.loads(out.stdout)
    assert d["ep"] == 8 and d["groups"]["expert_dp"] == 2 and d["groups"]["dp"] == 16
    dense = json.loads(pipeloom(*cmd, "--json", check=True).stdout)
    assert d["devices"][1]["params"] < dense["devices"][1]["params"]
    bad = pipeloom(*cmd, "--ep", "3")
    assert bad.returncode == 2 and bad.stderr.startswith("pipeloom: error: ep=3 does not divide the 128 routed")
    assert "Traceback" not in bad.stderr
