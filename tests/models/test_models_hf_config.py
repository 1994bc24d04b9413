"""models/hf_config.py: Hugging Face config.json -> ModelConfig, counted exactly as transformers builds it."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeloom.models.config import ModelConfig, ModelConfigError
from pipeloom.models.flops import total_params
from pipeloom.models.families import architectures
from pipeloom.models.hf_config import from_hf_config, hf_config_path, resolve_model, shipped_configs
from pipeloom.models.presets import PRESETS

_LLAMA = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
              max_position_embeddings=64)

#: tiny configs, one or more per architecture, with the fields that change the parameter count
TINY = {
    "llama": dict(model_type="llama", num_key_value_heads=2, **_LLAMA),
    "llama-biases-headdim-tied": dict(model_type="llama", num_key_value_heads=2, attention_bias=True, mlp_bias=True,
                                      head_dim=24, tie_word_embeddings=True, **_LLAMA),
    "mistral": dict(model_type="mistral", num_key_value_heads=1, **_LLAMA),
    "qwen2": dict(model_type="qwen2", num_key_value_heads=2, **_LLAMA),
    "qwen2-tied": dict(model_type="qwen2", num_key_value_heads=4, tie_word_embeddings=True, **_LLAMA),
    "qwen3": dict(model_type="qwen3", num_key_value_heads=2, head_dim=32, **_LLAMA),
    "qwen3-bias-default-headdim": dict(model_type="qwen3", num_key_value_heads=2, attention_bias=True, **_LLAMA),
    "gpt2": dict(model_type="gpt2", n_embd=48, n_layer=2, n_head=4, n_positions=40, vocab_size=100),
    "gpt2-ninner-untied": dict(model_type="gpt2", n_embd=48, n_layer=3, n_head=3, n_positions=16, n_inner=80,
                               vocab_size=90, tie_word_embeddings=False),
    "mixtral": dict(model_type="mixtral", num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                    **_LLAMA),
    "qwen3_moe": dict(model_type="qwen3_moe", num_key_value_heads=2, head_dim=16, num_experts=6,
                      num_experts_per_tok=2, moe_intermediate_size=40, **_LLAMA),
    "qwen3_moe-default-headdim-tied": dict(model_type="qwen3_moe", num_key_value_heads=4, num_experts=3,
                                           num_experts_per_tok=1, moe_intermediate_size=24, tie_word_embeddings=True,
                                           **_LLAMA),
    "mistral-headdim": dict(model_type="mistral", num_key_value_heads=2, head_dim=32, **_LLAMA),
    "mixtral-headdim": dict(model_type="mixtral", num_key_value_heads=2, head_dim=8, num_local_experts=3,
                            num_experts_per_tok=3, **_LLAMA),
    "qwen2_moe": dict(model_type="qwen2_moe", num_key_value_heads=2, num_experts=5, num_experts_per_tok=2,
                      moe_intermediate_size=24, shared_expert_intermediate_size=56, **_LLAMA),
    # MLA: low-rank q (q_lora_rank) or a full q_proj (null), one dense layer first, two shared experts
    "deepseek_v3": dict(model_type="deepseek_v3", n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=24,
                        first_k_dense_replace=1, n_shared_experts=2, q_lora_rank=40, kv_lora_rank=24,
                        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, **_LLAMA),
    "deepseek_v3-fullq-bias-tied-alldense": dict(model_type="deepseek_v3", n_routed_experts=6, num_experts_per_tok=2,
                                                 moe_intermediate_size=24, first_k_dense_replace=2, q_lora_rank=None,
                                                 kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                                 v_head_dim=12, attention_bias=True, tie_word_embeddings=True,
                                                 **_LLAMA),
    "deepseek_v2": dict(model_type="deepseek_v2", n_routed_experts=5, num_experts_per_tok=3, moe_intermediate_size=20,
                        first_k_dense_replace=0, n_shared_experts=1, q_lora_rank=None, kv_lora_rank=24,
                        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, **_LLAMA),
    "gemma": dict(model_type="gemma", num_key_value_heads=2, head_dim=24, **_LLAMA),
    "gemma-bias-untied": dict(model_type="gemma", num_key_value_heads=1, attention_bias=True,
                              tie_word_embeddings=False, **_LLAMA),
    "gemma2": dict(model_type="gemma2", num_key_value_heads=2, head_dim=16, **_LLAMA),
    "phi3": dict(model_type="phi3", num_key_value_heads=2, pad_token_id=0, **_LLAMA),
}


def _transformers_count(cfg: dict) -> int:
    """What transformers reports: the model built on the meta device, tied weights counted once."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    conf = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(conf)
    return sum(p.numel() for p in model.parameters())


def test_every_architecture_has_a_tiny_case():
    assert {c["model_type"] for c in TINY.values()} == set(architectures())


@pytest.mark.parametrize("key", list(TINY))
def test_tiny_config_counts_like_transformers(tmp_path, key):
    cfg = TINY[key]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = from_hf_config(tmp_path)               # a directory holding config.json
    assert model == from_hf_config(tmp_path / "config.json", name=tmp_path.name)
    assert total_params(model) == _transformers_count(cfg)


@pytest.mark.parametrize("name", sorted(shipped_configs()))
def test_published_config_counts_like_transformers(name):
    path = shipped_configs()[name]
    cfg = json.loads(path.read_text())
    assert total_params(from_hf_config(path)) == _transformers_count(cfg)


def test_shipped_configs_cover_the_architectures():
    types = {json.loads(p.read_text())["model_type"] for p in shipped_configs().values()}
    assert {"llama", "mistral", "qwen2", "qwen3", "gpt2", "mixtral", "qwen3_moe", "deepseek_v3", "gemma", "gemma2",
            "phi3"} <= types


def test_fields_read_from_the_config():
    q = from_hf_config(TINY["qwen3_moe"])
    assert (q.head_dim, q.q_dim, q.kv_dim, q.qk_norm) == (16, 64, 32, True)
    assert (q.experts, q.experts_per_token, q.expert_ffn, q.shared_experts) == (6, 2, 40, 0)
    g = from_hf_config(TINY["gpt2"])
    assert (g.mlp, g.norm, g.tied_embeddings, g.learned_positions, g.ffn, g.seq) == ("gelu", "layernorm", True,
                                                                                      True, 192, 40)
    m = from_hf_config(TINY["qwen2_moe"])
    assert (m.qkv_bias, m.proj_bias, m.shared_experts, m.shared_expert_ffn, m.shared_expert_gate) == (
        True, False, 1, 56, True)
    # transformers' defaults where the file is silent: qwen3 head_dim 128, llama kv heads = heads
    assert from_hf_config(TINY["qwen3-bias-default-headdim"]).head_dim == 128
    assert from_hf_config(dict(model_type="llama", **_LLAMA)).kv_heads == 4


def _write(tmp_path, obj) -> str:
    p = tmp_path / "config.json"
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(p)


@pytest.mark.parametrize("obj,msg", [
    ({**TINY["llama"], "model_type": "bert"}, "model_type 'bert' is not supported; supported are: llama"),
    ({k: v for k, v in TINY["llama"].items() if k != "model_type"}, "missing field 'model_type'"),
    ({k: v for k, v in TINY["llama"].items() if k != "intermediate_size"},
     "missing field 'intermediate_size' (needed for model_type 'llama')"),
    ({k: v for k, v in TINY["gpt2"].items() if k != "n_head"}, "missing field 'n_head'"),
    ({**TINY["llama"], "num_hidden_layers": "2"}, "field 'num_hidden_layers' must be an integer >= 1, got '2'"),
    ({**TINY["llama"], "tie_word_embeddings": 1}, "field 'tie_word_embeddings' must be true or false"),
    ({**TINY["qwen3_moe"], "mlp_only_layers": [0]}, "field 'mlp_only_layers' lists dense layers"),
    ({**TINY["qwen2_moe"], "decoder_sparse_step": 2}, "field 'decoder_sparse_step' is 2"),
    ({**TINY["mixtral"], "num_experts_per_tok": 9}, "experts_per_token (top-k) must lie in [1, experts=4]"),
    ({**TINY["gpt2"], "activation_function": "relu"}, "field 'activation_function' 'relu' is not a GeLU"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
])
def test_bad_config_is_one_line_error_naming_file_and_field(tmp_path, obj, msg):
    path = _write(tmp_path, obj)
    with pytest.raises(ModelConfigError) as e:
        from_hf_config(path)
    text = str(e.value)
    assert msg in text and path in text and "\n" not in text


def test_resolve_model(tmp_path):
    assert resolve_model("LLAMA2-7B") is PRESETS["llama2-7b"]
    m = PRESETS["gpt3-125m"]
    assert resolve_model(m) is m
    assert resolve_model("mixtral-8x7b-v0.1") == from_hf_config(shipped_configs()["mixtral-8x7b-v0.1"],
                                                                name="Mixtral-8x7B-v0.1")
    _write(tmp_path, TINY["qwen2"])
    assert resolve_model(str(tmp_path)) == from_hf_config(tmp_path / "config.json")
    (tmp_path / "sub").mkdir()
    with pytest.raises(ModelConfigError, match="holds no config.json"):
        resolve_model(str(tmp_path / "sub"))
    with pytest.raises(ModelConfigError, match="no such file or directory"):
        resolve_model(str(tmp_path / "missing.json"))
    with pytest.raises(ModelConfigError, match=r"unknown model preset 'gpt5' .*Mixtral-8x7B-v0.1.*config.json"):
        resolve_model("gpt5")


def test_hf_config_path(tmp_path):
    _write(tmp_path, TINY["gpt2"])
    assert hf_config_path(str(tmp_path)) == tmp_path / "config.json"
    assert hf_config_path(str(tmp_path / "config.json")) == tmp_path / "config.json"
    assert hf_config_path("QWEN3-8B") == shipped_configs()["qwen3-8b"]
    assert hf_config_path("llama2-7b") is None and hf_config_path(str(tmp_path / "nope")) is None


def test_hf_config_imports_neither_torch_nor_transformers():
    code = ("import sys; from pipeloom.models.hf_config import resolve_model; resolve_model('Qwen3-30B-A3B'); "
            "sys.exit(1 if {'torch', 'transformers'} & set(sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_model_config_still_builds_the_presets():
    assert all(isinstance(m, ModelConfig) and not m.moe for m in PRESETS.values())
