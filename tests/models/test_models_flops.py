"""models/flops.py: per-layer parameters and F/B/W FLOPs (dense and MoE) against published formulas."""
from __future__ import annotations

import dataclasses

import pytest

from pipeloom.models.config import ModelConfig, ModelConfigError
from pipeloom.models.flops import (active_layer_params, active_params, embedding_params, head_flops, head_params, layer_flops,
                                   layer_params, total_params)
from pipeloom.models.presets import PRESETS

GPT = PRESETS["gpt3-1.3b"]


@pytest.mark.parametrize("name", ["gpt3-125m", "gpt3-1.3b", "gpt3-175b"])
def test_gpt_layer_flops_match_narayanan(name):
    # Narayanan et al. 2021: forward of one GPT layer 24*b*s*h^2*(1 + s/(6h)); backward twice that
    m = PRESETS[name]
    b, s, h = 2, m.seq, m.hidden
    f, bb, w = layer_flops(m, b * s)
    assert f == pytest.approx(24 * b * s * h * h * (1 + s / (6 * h)))
    assert bb + w == pytest.approx(2 * f)
    assert w == pytest.approx(24 * b * s * h * h)          # weight grads: the GEMMs only, no attention core
    assert head_flops(m, b * s) == (2 * b * s * h * m.vocab,) * 3


def test_gpt_layer_params_is_12h2_plus_13h():
    # GPT layer: 12h^2 weights + 13h biases/LayerNorm (Narayanan et al. 2021 / Megatron's count)
    for name in ("gpt3-125m", "gpt3-175b"):
        h = PRESETS[name].hidden
        assert layer_params(PRESETS[name]) == 12 * h * h + 13 * h


def test_llama2_7b_total_is_published():
    # Llama-2-7b: 6,738,415,616 parameters (the released checkpoint's count)
    assert total_params(PRESETS["llama2-7b"]) == 6_738_415_616


def test_moe_counts_all_experts_but_flops_only_top_k():
    dense = ModelConfig(hidden=64, layers=2, heads=4, ffn=96, vocab=100)
    moe = dataclasses.replace(dense, experts=8, experts_per_token=2)
    mlp_one = 3 * 64 * 96
    router = 64 * 8
    assert layer_params(moe) - layer_params(dense) == 7 * mlp_one + router
    assert active_layer_params(moe) - active_layer_params(dense) == mlp_one + router
    fd, bd, wd = layer_flops(dense, 10)
    fm, bm, wm = layer_flops(moe, 10)
    assert fm - fd == bm - bd == wm - wd == 2 * 10 * (mlp_one + router)
    # all experts active = a dense MLP of experts * ffn plus the router
    full = dataclasses.replace(dense, experts=4, experts_per_token=4)
    wide = dataclasses.replace(dense, ffn=4 * 96)
    assert layer_flops(full, 10)[2] == layer_flops(wide, 10)[2] + 2 * 10 * 64 * 4


def test_shared_experts_and_gate():
    base = ModelConfig(hidden=32, layers=1, heads=2, ffn=48, vocab=50, experts=4, experts_per_token=1,
                       expert_ffn=16)
    shared = dataclasses.replace(base, shared_experts=1, shared_expert_ffn=40, shared_expert_gate=True)
    assert layer_params(shared) - layer_params(base) == 3 * 32 * 40 + 32
    assert active_layer_params(shared) - active_layer_params(base) == 3 * 32 * 40 + 32


def test_explicit_head_dim_and_qk_norm():
    # Qwen3-style: q projection heads*head_dim wide, not hidden
    m = ModelConfig(hidden=48, layers=1, heads=4, kv_heads=2, head_size=16, ffn=64, vocab=10, qk_norm=True)
    assert m.q_dim == 64 and m.kv_dim == 32
    attn = 48 * 64 + 2 * 48 * 32 + 64 * 48
    assert layer_params(m) == attn + 2 * 16 + 3 * 48 * 64 + 2 * 48
    f, b, w = layer_flops(m, 3, seq=5)
    assert f - w == 4 * 3 * 5 * 64 and b - w == 8 * 3 * 5 * 64


def test_tied_head_counted_once():
    m = PRESETS["gpt3-125m"]
    assert head_params(m, with_tied_copy=True) - head_params(m, with_tied_copy=False) == m.vocab * m.hidden
    assert total_params(m) == 12 * layer_params(m) + embedding_params(m) + 2 * m.hidden


@pytest.mark.parametrize("kw,msg", [
    (dict(experts=4), r"experts_per_token \(top-k\) must lie in \[1, experts=4\], got 0"),
    (dict(experts=4, experts_per_token=5), r"must lie in \[1, experts=4\], got 5"),
    (dict(experts_per_token=2), "need experts >= 1"),
    (dict(hidden=30, heads=4), "must be divisible by heads=4"),
    (dict(head_size=0), "head_size must be an integer >= 1"),
])
def test_bad_moe_or_head_fields(kw, msg):
    base = dict(hidden=64, layers=2, heads=4, vocab=10)
    with pytest.raises(ModelConfigError, match=msg):
        ModelConfig(**{**base, **kw})
    ModelConfig(**{**base, "hidden": 30, "head_size": 8})  # explicit head_dim: hidden need not divide


def test_negative_tokens_rejected():
    with pytest.raises(ValueError, match="tokens must be a number >= 0"):
        layer_flops(GPT, -1)


def test_active_params_is_the_model_with_only_top_k_experts():
    moe = ModelConfig(hidden=64, layers=3, heads=4, ffn=96, vocab=100, experts=8, experts_per_token=2, expert_ffn=32,
                      shared_experts=1, shared_expert_gate=True)
    only_k = dataclasses.replace(moe, experts=2)       # same model holding just the k experts it routes to
    assert active_params(moe) == total_params(only_k) + 3 * 64 * 6     # whose router is 6 columns narrower
    assert active_params(GPT) == total_params(GPT)
