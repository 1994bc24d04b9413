"""--model on the partition options: layer count and head cost from a model (dense and MoE FLOPs)."""
from __future__ import annotations

import json

import pytest

from pipeloom.cli import main


def _json(capsys, *argv):
    assert main(["partition", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_gpt2_head_from_flops_is_narayanan(capsys):
    d = _json(capsys, "--pp", "4", "--model", "gpt2")
    assert d["layers"] == 12 and d["seg_layer_num"] == [3, 3, 3, 3]
    h, V, s = 768, 50257, 1024
    head_f = d["chunk_costs"]["F"][3] - 1.0       # each chunk of 3 layers costs the average chunk, 1
    # one layer = 1/3; head/layer = V / (12 h (1 + s/(6h))) (Narayanan et al. 2021)
    assert head_f == pytest.approx(V / (12 * h * (1 + s / (6 * h))) / 3, rel=1e-9)
    assert d["chunk_costs"]["W"][3] - 1.0 == pytest.approx(V / (12 * h) / 3, rel=1e-9)


def test_moe_layer_cost_charges_top_k_experts(capsys):
    d = _json(capsys, "--pp", "4", "--model", "Mixtral-8x7B-v0.1", "--seq", "4096")
    h, q, kv, f, E, k, V, s = 4096, 4096, 1024, 14336, 8, 2, 32000, 4096
    layer_gemm = 2 * (h * q + 2 * h * kv + q * h + h * E + k * 3 * h * f)    # weight GEMMs one token goes through
    layer_w = layer_gemm - 2 * (k * 3 * h * f + h * E)  # router and routed experts' weight grads run in B
    head_w = 2 * h * V
    assert d["layers"] == 32
    assert d["chunk_costs"]["W"][3] - 1.0 == pytest.approx(head_w / layer_w / 8, rel=1e-9)
    layer_f = layer_gemm + 4 * s * q
    assert d["chunk_costs"]["F"][3] - 1.0 == pytest.approx(head_w / layer_f / 8, rel=1e-9)


@pytest.mark.slow
def test_model_balance_and_simulate(capsys):
    d = _json(capsys, "--pp", "4", "--vpp", "2", "-s", "zbv", "-m", "8", "--model", "Qwen3-30B-A3B", "--balance")
    assert sum(d["seg_layer_num"]) == 48 and d["how"].startswith("balanced")
    assert main(["simulate", "-s", "1f1b", "--pp", "4", "-m", "8", "--model", "gpt2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["valid"] is True


@pytest.mark.parametrize("extra,msg", [
    (["--layers", "10"], "--layers is 10 but model gpt2 has 12 layers"),
    (["--vocab", "5", "--hidden", "8"], "--model gives the vocabulary and hidden size"),
    (["--layers-per-device", "3,3,3,2"], "--layers-per-device sums to 11 layers but model gpt2 has 12"),
])
def test_model_conflicts_are_one_line_errors(capsys, extra, msg):
    assert main(["partition", "--pp", "4", "--model", "gpt2", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pipeloom: error:") and msg in err and "\n" not in err


def test_model_and_layer_cost_file_conflict(capsys, tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"layers": {"count": 12, "F": 1}}))
    assert main(["partition", "--pp", "4", "--model", "gpt2", "--layer-costs", str(p)]) == 2
    assert "use one of the two" in capsys.readouterr().err
