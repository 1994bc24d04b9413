"""transformers models run for real: chunks equal the unsplit model, tied weights across stages,
split backward beyond nn.Linear, --weights and --data (pipeloom run --model PATH).

The distributed part is ONE 4-rank gloo process group running every case in sequence (process start
and the transformers import dominate): llama (zbv and 1f1b at pp 2 x dp 2, interleaved at pp 4), a
tied-embedding gpt2 (pp 2 x dp 2, pp 4) and qwen2 (zbh1 pp 4, its tied head deferred to W), an MoE
model (mixtral), saved weights and a token file. Every case compares the first step's loss and
every gradient with the unsplit transformers model's own forward.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from pipeloom.cli import main  # noqa: E402
from pipeloom.integrations.hf import (HFRunModel, build_model, canonical_names, pipeline_chunks,  # noqa: E402
                                      tied_parameters)
from pipeloom.models.slicing import even_layer_split  # noqa: E402
from pipeloom.autograd.splitgrad import deferred_share  # noqa: E402

TOL = 1e-5
VOCAB = 96

CONFIGS = {
    "llama": dict(model_type="llama", vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=8,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32),
    "gpt2": dict(model_type="gpt2", vocab_size=VOCAB, n_embd=32, n_layer=4, n_head=4, n_positions=32,
                 bos_token_id=0, eos_token_id=0),
    "qwen2": dict(model_type="qwen2", vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=True),
    "mixtral": dict(model_type="mixtral", vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, num_local_experts=4,
                    num_experts_per_tok=2),
    "mistral": dict(model_type="mistral", vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=8,
                    num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=32, sliding_window=4),
    "qwen3": dict(model_type="qwen3", vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=32),
    "qwen3_moe": dict(model_type="qwen3_moe", vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      max_position_embeddings=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16),
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for name, cfg in CONFIGS.items():
        d = root / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        out[name] = str(d)
    return out


# ------------------------------------------------------------------------ one process
@pytest.mark.parametrize("name", list(CONFIGS))
def test_chunks_compose_to_the_model(model_dirs, name):
    """The chunks in a row compute the model's own logits; their parameter names are the model's."""
    model = build_model(model_dirs[name], seed=3)
    n = model.config.num_hidden_layers
    chunks = pipeline_chunks(model, even_layer_split(n, 4))
    x = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    h = x
    for c in chunks:
        h = c(h)
    ref = model(input_ids=x).logits
    assert h.shape == ref.shape
    assert (h - ref).abs().max().item() <= 1e-6
    names = {nm for c in chunks for nm, _ in c.named_parameters(remove_duplicate=False)}
    assert names == set(canonical_names(model))


def test_a_familys_torch_hooks_wrap_the_embedding_and_the_head(model_dirs):
    """A family's TorchChunks hooks (what a Gemma-like forward adds around its layers) run in the chunks: with the
    embedding scaled by 1 (a no-op) and the logits halved, the chunks give half the model's logits."""
    import dataclasses

    from pipeloom.models import families
    from pipeloom.models.registry import TorchChunks, register

    llama = families.get("llama")
    seen = []
    hooks = TorchChunks(embedding=lambda h, cfg: seen.append(cfg.model_type) or h * 1.0, logits=lambda y, cfg: y * 0.5)
    register(dataclasses.replace(llama, torch=hooks), replace=True)
    try:
        model = build_model(model_dirs["llama"], seed=3)
        x = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
        h = x
        for c in pipeline_chunks(model, even_layer_split(model.config.num_hidden_layers, 4)):
            h = c(h)
        assert (h - 0.5 * model(input_ids=x).logits).abs().max().item() <= 1e-6
        assert seen == ["llama"]  # the embedding hook ran once, in chunk 0
        register(dataclasses.replace(llama, torch=None), replace=True)  # estimates only: not cut for a run
        with pytest.raises(ValueError, match="model_type 'llama' is not supported; pipeloom cuts: mistral"):
            pipeline_chunks(model, even_layer_split(model.config.num_hidden_layers, 4))
    finally:
        register(llama, replace=True)


def test_tied_embedding_found_across_chunks(model_dirs):
    for name, tied in (("gpt2", True), ("qwen2", True), ("llama", False)):
        model = build_model(model_dirs[name])
        ties = tied_parameters(pipeline_chunks(model, even_layer_split(model.config.num_hidden_layers, 2)))
        if tied:
            assert len(ties) == 1 and ties[0].chunks == (0, 1)
            (k0, n0), (k1, n1) = ties[0].members
            assert model.get_parameter(n0) is model.get_parameter(n1)
        else:
            assert ties == []


@pytest.mark.slow
def test_deferred_share_sees_what_stays_in_b(model_dirs):
    """Linear and Conv1D weights all go to W (share 1); fused MoE experts stay in B (share well below 1)."""
    x = torch.randint(0, VOCAB, (2, 8))
    for name in ("llama", "gpt2", "mixtral"):
        model = build_model(model_dirs[name])
        c0, c1 = pipeline_chunks(model, even_layer_split(model.config.num_hidden_layers, 2))
        s0, s1 = deferred_share(c0, x), deferred_share(c1, c0(x).detach())
        for s in (s0, s1):
            assert s["wgrad_flops"] > 0
            if name == "mixtral":
                assert s["share"] < 0.7
            else:
                assert s["share"] == pytest.approx(1.0)


def test_hf_run_model_refuses_bad_specs(tmp_path, model_dirs):
    from pipeloom.integrations.hf import HFModelError
    with pytest.raises(HFModelError, match="no such file"):
        HFRunModel(str(tmp_path / "nope"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(HFModelError, match="not supported"):
        HFRunModel(str(tmp_path))
    with pytest.raises(HFModelError, match="safetensors"):
        HFRunModel(model_dirs["llama"], weights=True)


# ------------------------------------------------------------------------ CLI contract (no processes)
def _cli_error(capsys, argv) -> str:
    rc = main(["run"] + argv)
    err = capsys.readouterr().err.strip()
    assert rc != 0
    lines = [ln for ln in err.splitlines() if ln.startswith("pipeloom: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_cli_bad_data_and_model_are_one_line(tmp_path, capsys, model_dirs):
    short = tmp_path / "short.bin"
    np.arange(10, dtype=np.uint16).tofile(short)
    assert "too short" in _cli_error(capsys, ["--model", model_dirs["llama"], "--data", str(short), "--seq-len", "16"])
    big = tmp_path / "big.bin"
    np.full(100, VOCAB, dtype=np.uint16).tofile(big)
    assert f"token id {VOCAB}" in _cli_error(capsys, ["--model", model_dirs["llama"], "--data", str(big)])
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\0" * 7)
    assert "whole number" in _cli_error(capsys, ["--data", str(odd), "--data-dtype", "uint32"])
    assert "no such file" in _cli_error(capsys, ["--data", str(tmp_path / "missing.bin")])
    assert "no such file" in _cli_error(capsys, ["--model", str(tmp_path / "nope")])
    assert "--weights" in _cli_error(capsys, ["--weights"])
    assert "--dim" in _cli_error(capsys, ["--model", model_dirs["gpt2"], "--dim", "64"])
    assert "layers" in _cli_error(capsys, ["--model", model_dirs["gpt2"], "--pp", "4", "--schedule", "interleaved"])


# ------------------------------------------------------------------------ real processes
@pytest.mark.dist
@pytest.mark.slow
def test_hf_models_run_and_match_the_unsplit_model(tmp_path, model_dirs):
    """ONE 4-rank process group for every case (see the module docstring)."""
    from pipeloom.runtime.driver import cases_worker
    from pipeloom.runtime.launch import spawn

    saved = tmp_path / "saved"
    model = build_model(model_dirs["llama"], seed=11)
    model.save_pretrained(saved)
    tok = 7
    data = tmp_path / "tokens.bin"
    np.full(500, tok, dtype=np.uint16).tofile(data)  # every sampled row is [tok] * seq: its loss is known

    m = {k: HFRunModel(d) for k, d in model_dirs.items()}
    base = dict(verify=True, microbatch_size=1, seq_len=8, steps=2)
    cases = {
        "llama-zbv-pp2-dp2": dict(model=m["llama"], schedule="zbv", pp=2, dp=2, microbatches=4),
        "llama-1f1b-pp2-dp2": dict(model=m["llama"], schedule="1f1b", pp=2, dp=2, microbatches=4),
        "llama-interleaved-pp4": dict(model=m["llama"], schedule="interleaved", pp=4, microbatches=4),
        "gpt2-tied-1f1b-pp2-dp2": dict(model=m["gpt2"], schedule="1f1b", pp=2, dp=2, microbatches=4),
        "gpt2-tied-zbh1-pp4": dict(model=m["gpt2"], schedule="zbh1", pp=4, microbatches=4),
        "qwen2-tied-1f1b-pp4": dict(model=m["qwen2"], schedule="1f1b", pp=4, microbatches=4),
        "mixtral-zbv-pp2-dp2": dict(model=m["mixtral"], schedule="zbv", pp=2, dp=2, microbatches=4),
        "mistral-interleaved-pp4": dict(model=m["mistral"], schedule="interleaved", pp=4, microbatches=4),
        "qwen3-zbv-pp2-dp2": dict(model=m["qwen3"], schedule="zbv", pp=2, dp=2, microbatches=4),
        "qwen3_moe-1f1b-pp2-dp2": dict(model=m["qwen3_moe"], schedule="1f1b", pp=2, dp=2, microbatches=4),
        "weights-zbh1-pp2-dp2": dict(model=HFRunModel(str(saved), weights=True), schedule="zbh1", pp=2, dp=2,
                                     microbatches=2, steps=1, data=str(data)),
        "data-1f1b-pp2-dp2": dict(model=m["llama"], schedule="1f1b", pp=2, dp=2, microbatches=2, steps=1,
                                  data=str(data), seed=5),
    }
    res = dict(zip(cases, spawn(cases_worker, 4, ([base | c for c in cases.values()],), timeout_s=300)))
    for label, r in res.items():
        assert r["params_missing_grad"] == 0, label
        assert r["max_loss_diff"] <= TOL and r["max_grad_diff"] <= TOL, (label, r)
    # tied copies on different stages: summed, and the same weights after every step
    for label in ("gpt2-tied-1f1b-pp2-dp2", "gpt2-tied-zbh1-pp4", "qwen2-tied-1f1b-pp4"):
        assert res[label]["tied_across_stages"] == 1, label
        assert res[label]["tied_weight_diff"] == 0.0, label
    assert res["llama-zbv-pp2-dp2"]["tied_across_stages"] == 0
    # split backward: every Linear/Conv1D deferred; fused experts not
    assert set(res["gpt2-tied-zbh1-pp4"]["deferred_wgrad_share"].values()) == {1.0}
    assert max(res["mixtral-zbv-pp2-dp2"]["deferred_wgrad_share"].values()) < 0.7
    assert res["llama-1f1b-pp2-dp2"]["deferred_wgrad_share"] is None  # no W jobs
    # --weights and --data: rows of a constant token, so the first loss is known from transformers alone:
    # the saved model (seed 11) on [tok]*8 -> tok, and the run's seeded model (seed 5) likewise
    from transformers import AutoModelForCausalLM
    ids = torch.full((1, 8), tok)

    def loss_of(mod):
        return torch.nn.functional.cross_entropy(mod(input_ids=ids).logits.reshape(-1, VOCAB), ids.reshape(-1)).item()

    assert res["weights-zbh1-pp2-dp2"]["losses"][0] == pytest.approx(
        loss_of(AutoModelForCausalLM.from_pretrained(saved)), abs=1e-5)
    assert res["data-1f1b-pp2-dp2"]["losses"][0] == pytest.approx(loss_of(build_model(model_dirs["llama"], seed=5)),
                                                                   abs=1e-5)


def _torch_stage_rank(model_dir: str):
    """One rank of torch's own runtime (PipelineStage + Schedule1F1B) on a tied qwen2's chunks."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from pipeloom.models.llama import loss_fn
    from pipeloom.runtime.tied import TiedGrads

    rank = dist.get_rank()
    every = pipeline_chunks(build_model(model_dir, seed=2), even_layer_split(4, 2))
    mod = every[rank]
    runtime = Schedule1F1B(PipelineStage(mod, rank, 2, torch.device("cpu")), n_microbatches=4, loss_fn=loss_fn)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, VOCAB, (8, 8), generator=g), torch.randint(0, VOCAB, (8, 8), generator=g)
    losses: list = []
    runtime.step(x) if rank == 0 else runtime.step(target=y, losses=losses)
    tied = TiedGrads(tied_parameters(every), lambda k: k, [[0, 1]], {rank: mod}, pp_rank=rank, dp_rank=0)
    tied.reduce()
    out = [None, None]
    dist.all_gather_object(out, ({n: p.grad.tolist() for n, p in mod.named_parameters()},
                                 [float(v.detach()) for v in losses], len(tied.cross)))
    return out, x.tolist(), y.tolist()  # plain lists: tensors from a finished process are not readable


@pytest.mark.dist
@pytest.mark.slow
def test_chunks_run_in_torch_pipelinestage_with_tied_grads_summed(model_dirs):
    from pipeloom.models.llama import loss_fn
    from pipeloom.runtime.launch import spawn

    per_rank, x, y = spawn(_torch_stage_rank, 2, (model_dirs["qwen2"],), timeout_s=300)
    x, y = torch.tensor(x), torch.tensor(y)
    ref = build_model(model_dirs["qwen2"], seed=2)
    want = []
    for xm, ym in zip(x.chunk(4), y.chunk(4)):
        loss = loss_fn(ref(input_ids=xm).logits, ym)
        (loss / 4).backward()  # torch's runtime scales the grads by 1/microbatches
        want.append(loss.item())
    ref_grads = {n: p.grad for n, p in ref.named_parameters(remove_duplicate=False)}
    assert per_rank[1][1] == pytest.approx(want, abs=1e-5)
    names = set()
    for grads, _, cross in per_rank:
        assert cross == 1
        for n, gr in grads.items():
            assert (torch.tensor(gr) - ref_grads[n]).abs().max().item() <= TOL, n
            names.add(n)
    assert names == set(ref_grads)  # every parameter, the tied one under both of its names


def test_layer_partition_costs_the_models_own_head(tmp_path):
    """--balance with --model PATH: the model's vocabulary and width cost the head, so the last stage of a
    large-vocabulary model gets fewer layers; the split given by --layers-per-device is the one run."""
    from pipeloom.cli import build_parser
    from pipeloom.cli.run_cmd import run_config

    cfg = dict(CONFIGS["llama"], vocab_size=32000)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    p = build_parser()
    rc = run_config(p.parse_args(["run", "--model", str(tmp_path), "--pp", "2", "-s", "1f1b", "--balance"]))
    assert sum(rc.layers_per_chunk) == 8 and rc.layers_per_chunk[1] < rc.layers_per_chunk[0]
    rc = run_config(p.parse_args(["run", "--model", str(tmp_path), "--pp", "2", "--layers-per-device", "3,5"]))
    assert rc.layers_per_chunk == (3, 5)
    rc = run_config(p.parse_args(["run", "--model", str(tmp_path), "--pp", "2"]))
    assert rc.layers_per_chunk is None and rc.model.layers == 8  # an even split of the model's 8 layers
