"""models/registry.py + models/families/: one family per model_type; a new one is one file + one registration."""
from __future__ import annotations

import dataclasses
import json

import pytest

from pipeloom.models import families, flops
from pipeloom.models.config import ModelConfigError
from pipeloom.models.hf_config import from_hf_config
from pipeloom.models.registry import Family, register, unregister

import dummy_family

# hidden 64, 3 layers, 4 heads, vocab 100, GeLU MLP 2 * 64 wide, no biases, untied
DUMMY = dict(model_type="pipeloom_dummy", d_model=64, n_layers=3, n_heads=4, vocab=100, mlp_ratio=2, context=32)
LAYER = 4 * 64 * 64 + 2 * 64 * 128 + 2 * 64    # q, k, v, o + fc1, fc2 + ONE LayerNorm (weight, bias) = 32,896
TOTAL = 3 * LAYER + 100 * 64 + (2 * 64 + 100 * 64)  # layers + embedding + final LayerNorm and head = 111,616


@pytest.fixture
def dummy():
    register(dummy_family.FAMILY)  # the one registration line
    try:
        yield dummy_family.FAMILY
    finally:
        unregister("pipeloom_dummy")


def test_the_existing_families_are_registered_in_order():
    assert families.architectures() == ("llama", "mistral", "qwen2", "qwen3", "gpt2", "mixtral", "qwen3_moe",
                                        "qwen2_moe", "deepseek_v3", "deepseek_v2", "gemma", "gemma2", "phi3")
    # every one of them runs under pipeloom run but DeepSeek's (estimates only)
    assert families.architectures(runnable=True) == tuple(a for a in families.architectures()
                                                          if not a.startswith("deepseek"))


def test_unknown_until_registered(dummy):
    unregister("pipeloom_dummy")
    with pytest.raises(ModelConfigError, match="model_type 'pipeloom_dummy' is not supported"):
        from_hf_config(DUMMY)
    register(dummy_family.FAMILY)
    assert from_hf_config(DUMMY).arch == "pipeloom_dummy"


def test_a_second_family_for_one_model_type_is_refused(dummy):
    with pytest.raises(ValueError, match="already registered"):
        register(Family(model_type="pipeloom_dummy", read=dummy_family.read, summary="", defaults={}))


def test_dummy_family_reads_its_own_field_names_and_defaults(tmp_path, dummy):
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in DUMMY.items() if k != "context"}))
    m = from_hf_config(tmp_path)
    assert (m.hidden, m.layers, m.heads, m.ffn, m.vocab, m.seq, m.mlp, m.norm) == (64, 3, 4, 128, 100, 256, "gelu",
                                                                                   "layernorm")
    assert "pipeloom_dummy" in families.architectures() and "pipeloom_dummy" not in families.architectures(
        runnable=True)
    with pytest.raises(ModelConfigError, match=r"config.json: missing field 'n_heads' \(needed for model_type "
                                               r"'pipeloom_dummy'\)"):
        (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in DUMMY.items() if k != "n_heads"}))
        from_hf_config(tmp_path)


def test_dummy_family_counts_its_own_layer(dummy):
    m = from_hf_config(DUMMY)
    assert flops.layer_params(m) == LAYER
    assert flops.total_params(m) == TOTAL
    # FLOPs: 2 * tokens * (4*64*64 + 2*64*128) per pass, no attention core (tokens 10, any seq)
    assert flops.layer_flops(m, 10, seq=32) == (655360.0, 655360.0, 655360.0)
    # the same shape without the family (arch "") is counted by the shared formulas: two norms, an s*s core
    plain = dataclasses.replace(m, arch="")
    assert flops.layer_params(plain) == LAYER + 2 * 64
    assert flops.layer_flops(plain, 10, seq=32)[0] == 655360.0 + 4 * 10 * 32 * 64


def test_memory_and_layer_costs_of_the_dummy_family(dummy):
    from pipeloom.memory.analytic import TrainConfig, estimate
    from pipeloom.partition.layer_costs import default_layer_costs

    m = from_hf_config(DUMMY)
    rep = estimate(m, TrainConfig(micro_batch=1, seq=32, dtype="fp32"), schedule="1f1b", pp=3, microbatches=4)
    assert rep.to_dict()["total_params"] == TOTAL
    # pp=3, 3 layers: device 1 holds one layer, no embedding, no head
    assert rep.devices[1].params == LAYER
    # the head's time from the family's FLOPs: head F = 2*h*V = 12800 per token, layer F = 65536 per token
    costs = default_layer_costs(3, 3, model=m)
    assert costs.head.F / costs.layers[0].F == pytest.approx(2 * 64 * 100 / 65536)


def test_cli_memory_reads_a_registered_family(tmp_path, dummy, capsys):
    from pipeloom.cli import main

    (tmp_path / "config.json").write_text(json.dumps(DUMMY))
    assert main(["memory", "--model", str(tmp_path), "--pp", "3", "--microbatches", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_params"] == TOTAL


def test_every_family_is_listed_in_the_docs():
    from pathlib import Path

    memory_md = (Path(__file__).resolve().parents[2] / "docs" / "memory.md").read_text()
    for fam in families.families():
        assert f"\n{fam.model_type} " in families.__doc__, f"{fam.model_type}: not in models/families' table"
        assert f"| `{fam.model_type}` |" in memory_md, f"{fam.model_type}: not in docs/memory.md's table"
        assert fam.summary and fam.defaults is not None
