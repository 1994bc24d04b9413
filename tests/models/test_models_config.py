"""The one model description (models/config.py) and its presets: validation, defaults, users."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from pipeloom.core.costs import Costs
from pipeloom.models.config import ModelConfig, ModelConfigError, default_ffn
from pipeloom.models.presets import PRESETS, preset
from pipeloom.partition.layer_costs import default_layer_costs
from pipeloom.partition.layout import PartitionError


@pytest.mark.parametrize("kw,msg", [
    (dict(hidden=0), "model hidden must be an integer >= 1, got 0"),
    (dict(layers=2.0), "model layers must be an integer >= 1, got 2.0"),
    (dict(kv_heads=3), "kv_heads must be an integer >= 1 dividing heads=4, got 3"),
    (dict(hidden=30), "hidden=30 must be divisible by heads=4"),
    (dict(mlp="relu"), "mlp must be 'swiglu' or 'gelu', got 'relu'"),
    (dict(ffn=-1), "model ffn must be an integer >= 1 or None, got -1"),
    (dict(dropout=1.0), r"dropout must lie in \[0, 1\), got 1.0"),
])
def test_bad_model_is_one_line_value_error(kw, msg):
    base = dict(hidden=64, layers=2, heads=4, vocab=10)
    with pytest.raises(ModelConfigError, match=msg) as e:
        ModelConfig(**{**base, **kw})
    assert isinstance(e.value, ValueError) and "\n" not in str(e.value)


def test_defaults_kv_heads_and_ffn():
    m = ModelConfig(hidden=64, layers=2, heads=4, vocab=10)
    assert m.kv_heads == 4 and m.kv_dim == 64 and m.head_dim == 16
    assert m.ffn == 176  # 8*64/3 = 170.7, up to a multiple of 16 (LLaMA)
    assert ModelConfig(hidden=64, layers=2, heads=4, vocab=10, mlp="gelu").ffn == 256  # 4h (GPT)
    assert default_ffn(4096, "swiglu") == 10928  # 8*4096/3 = 10922.7 -> 683*16
    assert ModelConfig(hidden=64, layers=2, heads=4, vocab=10, ffn=100).ffn == 100


def test_presets_are_model_configs_named_by_their_key():
    assert all(isinstance(m, ModelConfig) and m.name == k for k, m in PRESETS.items())
    assert preset("LLAMA2-7B") is PRESETS["llama2-7b"]
    with pytest.raises(ValueError, match="unknown model preset 'gpt5'; choose one of: llama2-7b, "):
        preset("gpt5")


def test_llama_tiny_preset_is_the_torch_example_model():
    llama = pytest.importorskip("pipeloom.models.llama")
    assert dataclasses.replace(llama.LlamaConfig(), name="llama-tiny") == preset("llama-tiny")


def test_layer_costs_take_the_model():
    # a GPT-3 layer (ffn = 4h, multi-head attention): the model's FLOPs give Narayanan et al.'s ratio
    m = preset("gpt3-1.3b")
    lc = default_layer_costs(24, 4, Costs(), model=m)
    ref = default_layer_costs(24, 4, Costs(), vocab=m.vocab, hidden=m.hidden, seq=m.seq)
    assert lc.layers == ref.layers
    # head/layer time V / (12 h (1 + s/(6h))) (Narayanan et al. 2021)
    assert lc.head.F / lc.layers[0].F == pytest.approx(m.vocab / (12 * 2048 * (1 + 2048 / (6 * 2048))), rel=1e-12)
    assert lc.head.F == pytest.approx(ref.head.F, rel=1e-12)
    # B carries the attention core's backward (twice its forward), W none of it
    assert lc.head.B / lc.layers[0].B == pytest.approx(m.vocab / (12 * 2048 * (1 + 2048 / (3 * 2048))), rel=1e-12)
    assert lc.head.W / lc.layers[0].W == pytest.approx(m.vocab / (12 * 2048), rel=1e-12)
    # Llama's SwiGLU layer (3 matrices of 11008 rather than 2 of 4h) costs more than the GPT formula says
    ll = preset("llama2-7b")
    lcl = default_layer_costs(32, 4, Costs(), model=ll)
    gpt_like = default_layer_costs(32, 4, Costs(), vocab=32000, hidden=4096, seq=4096)
    assert lcl.head.F < gpt_like.head.F
    with pytest.raises(PartitionError, match="not both"):
        default_layer_costs(32, 4, Costs(), model=m, vocab=10)


def test_model_description_imports_no_torch():
    code = ("import sys, pipeloom.models, pipeloom.models.config, pipeloom.models.presets, pipeloom.models.slicing, "
            "pipeloom.memory.analytic, pipeloom.partition.layer_costs; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
