"""Analytic memory of Hugging Face configs (dense and MoE) and `pipeloom memory --model CONFIG`."""
from __future__ import annotations

import dataclasses
import json

import pytest

import pipeloom.memory.analytic as an
from pipeloom.cli import main
from pipeloom.models.config import ModelConfig
from pipeloom.models.flops import layer_params, total_params
from pipeloom.models.hf_config import from_hf_config, shipped_configs
from pipeloom.partition.layer_costs import activation_bytes_per_token

MOE = ModelConfig(name="moe", hidden=64, layers=4, heads=4, kv_heads=2, ffn=96, vocab=128, seq=32,
                  experts=8, experts_per_token=2, expert_ffn=48)


def _layer_bytes(model, train=None, **kw):
    return sum(it.bytes for it in an.layer_activations(model, train or an.TrainConfig(**kw)))


def test_moe_activations_follow_top_k_not_the_expert_count():
    base = _layer_bytes(MOE)
    # twice the experts, same top-k: only the router's fp32 probabilities grow (4 bytes per token per expert)
    more = dataclasses.replace(MOE, experts=16)
    assert _layer_bytes(more) - base == 4 * 8 * MOE.seq
    # twice the top-k: the routed copies (input, MLP activations; the output only where it is weighed outside
    # the expert, transformers' modules: Megatron's fused path applies the weight inside the SwiGLU) double
    k4 = dataclasses.replace(MOE, experts_per_token=4)
    per_copy = 2 * (64 + 2 * 48 + 48)             # bf16: gathered input, gate|up, fc2 input
    assert _layer_bytes(k4) - base == MOE.seq * (2 * per_copy + 12 * 2)
    hf = an.TrainConfig(impl="hf")
    per_copy_hf = 2 * (64 + 3 * 48 + 48 + 64)     # eager SwiGLU (gate, silu, up), fc2 input, expert output
    assert _layer_bytes(k4, hf) - _layer_bytes(MOE, hf) == MOE.seq * (2 * per_copy_hf + 12 * 2)
    # parameters hold all experts
    assert layer_params(more) - layer_params(MOE) == 8 * 3 * 64 * 48 + 8 * 64


@pytest.mark.parametrize("name", sorted(shipped_configs()))
def test_partition_per_token_bytes_equal_the_analytic_layer(name):
    # the layer-cost model's activation bytes (partition floor) and the memory model's list agree
    m = from_hf_config(shipped_configs()[name])
    tr = an.TrainConfig(seq=256, micro_batch=2)
    assert activation_bytes_per_token(m) * 512 == pytest.approx(_layer_bytes(m, tr), rel=1e-12)
    for k in (1, 3):
        moe = dataclasses.replace(MOE, experts_per_token=k, shared_experts=1, shared_expert_gate=True, dropout=0.1)
        assert activation_bytes_per_token(moe) * 512 == pytest.approx(_layer_bytes(moe, tr), rel=1e-12)


def test_per_device_params_follow_the_partition():
    m = from_hf_config(shipped_configs()["qwen3-30b-a3b"])
    rep = an.estimate(m, pp=4, microbatches=8, layers_per_chunk=[10, 14, 14, 10])
    assert [d.params for d in rep.devices] == [
        10 * layer_params(m) + m.vocab * m.hidden, 14 * layer_params(m), 14 * layer_params(m),
        10 * layer_params(m) + m.hidden + m.vocab * m.hidden]
    assert sum(d.params for d in rep.devices) == rep.total_params == total_params(m)


def test_moe_tp_checks_the_expert_width():
    m = dataclasses.replace(MOE, expert_ffn=51)
    with pytest.raises(an.MemoryConfigError, match="expert_ffn=51 of moe is not divisible by tp=2"):
        an.estimate(m, an.TrainConfig(tp=2), pp=2, microbatches=4)


def _transformers_count(cfg: dict) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(shipped_configs()))
def test_cli_memory_model_file_counts_like_transformers(capsys, name):
    path = shipped_configs()[name]
    assert main(["memory", "--model", str(path), "--pp", "4", "-m", "8", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["total_params"] == _transformers_count(json.loads(path.read_text()))
    assert d["model"] == path.stem
    kind = json.loads(path.read_text()).get("model_type", "")
    moe = kind.endswith("moe") or kind.startswith("deepseek") or name.startswith("mixtral")
    assert (d["active_params"] < d["total_params"]) == moe      # MoE: only the top-k experts are active


def test_cli_memory_model_directory_and_errors(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 64, "vocab_size": 10,
                                                      "num_hidden_layers": 4, "num_attention_heads": 4,
                                                      "num_key_value_heads": 2}))
    assert main(["memory", "--model", str(tmp_path), "--pp", "2", "-m", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pipeloom: error:") and "missing field 'intermediate_size'" in err and "\n" not in err
    assert str(tmp_path / "config.json") in err
