"""The deepseek_v3/v2, gemma/gemma2 and phi3 families: published counts, MLA's FLOPs and TP split by hand,
the dense-then-MoE layer groups, the MTP modules against transformers, `pipeloom memory --model`, and the
chunks pipeloom cuts from gemma/gemma2/phi3 against the unsplit transformers model."""
from __future__ import annotations

import json

import pytest

from pipeloom.cli import main
from pipeloom.models import flops
from pipeloom.models.config import ModelConfigError
from pipeloom.models.families import deepseek
from pipeloom.models.hf_config import from_hf_config, shipped_configs

#: a tiny MLA model with round widths (the hand counts below use these)
MLA = dict(model_type="deepseek_v3", hidden_size=64, num_attention_heads=4, num_hidden_layers=5,
           intermediate_size=96, vocab_size=128, max_position_embeddings=64, q_lora_rank=40, kv_lora_rank=24,
           qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=6, num_experts_per_tok=2,
           moe_intermediate_size=24, n_shared_experts=2, first_k_dense_replace=2, num_nextn_predict_layers=1)

# MLA (DeepSeek-V2, arXiv 2405.04434, eq. 9-19) by hand for MLA above: h=64, H=4, r_q=40, r_kv=24, d_n=16, d_r=8,
# d_v=12, d_q = d_n + d_r = 24
ATTN_GEMMS = (64 * 40            # q_a_proj (W^DQ): h -> r_q                      2560
              + 40 * 4 * 24      # q_b_proj (W^UQ, W^QR): r_q -> H*d_q          3840
              + 64 * (24 + 8)    # kv_a_proj_with_mqa (W^DKV, W^KR): h -> r_kv + d_r  2048
              + 24 * 4 * (16 + 12)  # kv_b_proj (W^UK, W^UV): r_kv -> H*(d_n + d_v)  2688
              + 4 * 12 * 64)     # o_proj (W^O): H*d_v -> h                        3072
# DeepSeekMoE (DeepSeek-V3, arXiv 2412.19437, eq. 12-16): 6 routed experts of 24, top 2, shared MLP of 2*24 = 48
MOE_ACTIVE = 64 * 6 + 2 * 3 * 64 * 24 + 3 * 64 * 48       # router 384 + 2 experts 9216 + shared 9216 = 18816
MOE_ALL = 64 * 6 + 6 * 3 * 64 * 24 + 3 * 64 * 48          # router + all 6 experts + shared = 37248
DENSE_MLP = 3 * 64 * 96                                    # 18432
NORMS = 40 + 24 + 2 * 64                                   # q_a_layernorm, kv_a_layernorm, two layer norms


def _model(**kw):
    return from_hf_config(dict(MLA, **kw))


def test_mla_layer_parameters_by_hand():
    m = _model()
    assert ATTN_GEMMS == 14208
    assert flops.layer_params(m) == ATTN_GEMMS + MOE_ALL + NORMS
    assert flops.layer_params(deepseek.dense_layer(m)) == ATTN_GEMMS + DENSE_MLP + NORMS
    # 2 dense layers then 3 MoE layers; embedding and head 128*64 each
    assert flops.total_params(m) == (2 * (ATTN_GEMMS + DENSE_MLP + NORMS) + 3 * (ATTN_GEMMS + MOE_ALL + NORMS)
                                     + 2 * 128 * 64 + 64)
    # active: the MoE layers with 2 of 6 experts
    assert flops.active_params(m) == flops.total_params(m) - 3 * 4 * 3 * 64 * 24


def test_mla_tensor_parallel_split_by_hand():
    """Megatron-Core's MLA: down projections and the low-rank norms replicated, q_b/kv_b column-parallel, o row."""
    m = _model()
    tp = 2
    attn = 64 * 40 + 40 * 4 * 24 // tp + 64 * 32 + 24 * 4 * 28 // tp + 4 * 12 * 64 // tp
    moe = 6 * 3 * 64 * 24 // tp + 64 * 6 + 3 * 64 * 48 // tp
    assert flops.layer_params(m, tp) == attn + moe + NORMS


def test_mla_layer_flops_by_hand():
    """F = 2*tokens*(active weight-GEMM params) + core 2*tokens*s*H*(d_q + d_v); B = the GEMMs + twice the core +
    the router's and routed experts' weight grads (made in B); W = the rest of the weight grads."""
    m = _model()
    tokens, s = 10, 8
    gemm = 2 * tokens * (ATTN_GEMMS + MOE_ACTIVE)             # 660480
    core = 2 * tokens * s * 4 * (24 + 12)                     # Q K^T over d_q, P V over d_v: 23040
    in_b = 2 * tokens * (64 * 6 + 2 * 3 * 64 * 24)            # router + 2 routed experts: 192000
    assert flops.layer_flops(m, tokens, seq=s) == (683520.0, 898560.0, 468480.0)
    assert (gemm + core, gemm + 2 * core + in_b, gemm - in_b) == (683520, 898560, 468480)
    # one dense layer: no router, no B/W move
    d = deepseek.dense_layer(m)
    g = 2 * tokens * (ATTN_GEMMS + DENSE_MLP)
    assert flops.layer_flops(d, tokens, seq=s) == (g + core, g + 2 * core, g)


def test_full_query_projection_when_q_lora_rank_is_null():
    m = _model(q_lora_rank=None)
    attn = 64 * 4 * 24 + 64 * 32 + 24 * 4 * 28 + 4 * 12 * 64
    assert flops.layer_params(m) == attn + MOE_ALL + 24 + 2 * 64


def test_layer_groups_dense_first_then_moe():
    m = _model()
    (n0, d), (n1, moe) = flops.layer_groups(m)
    assert (n0, n1) == (2, 3) and not d.moe and moe is m
    assert flops.layer_groups(_model(first_k_dense_replace=0)) == ((5, _model(first_k_dense_replace=0)),)
    all_dense = _model(first_k_dense_replace=7)
    assert not all_dense.moe and flops.layer_groups(all_dense) == ((5, all_dense),)


def test_layers_params_counts_each_layer_as_its_kind():
    """A chunk of layers 1..3 holds 1 dense and 2 MoE layers (the split the memory model should price)."""
    m = _model()
    dense, moe = ATTN_GEMMS + DENSE_MLP + NORMS, ATTN_GEMMS + MOE_ALL + NORMS
    assert flops.layers_params(m, 1, 3) == dense + 2 * moe
    assert flops.layers_params(m, 0, 2) == 2 * dense and flops.layers_params(m, 2, 0) == 0
    assert sum(flops.layers_params(m, i, 1) for i in range(5)) == 2 * dense + 3 * moe
    v3 = from_hf_config(shipped_configs()["deepseek-v3"])
    # DeepSeek-V3 by hand: MLA h=7168, r_q=1536, H=128, d_q=192, r_kv=512, d_r=64, d_n+d_v=256, d_v=128
    mla = 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + 128 * 128 * 7168
    v3_dense = mla + 3 * 7168 * 18432 + 2 * 7168
    v3_moe = mla + 256 * 3 * 7168 * 2048 + 7168 * 256 + 3 * 7168 * 2048 + 2 * 7168
    assert (mla, v3_dense, v3_moe) == (187_107_328, 583_483_392, 11_507_286_016)
    assert flops.layers_params(v3, 0, 4) == 3 * v3_dense + v3_moe
    assert flops.total_params(v3) == 3 * v3_dense + 58 * v3_moe + 2 * 129280 * 7168 + 7168
    with pytest.raises(ValueError, match="not within the model's 5 layers"):
        flops.layers_params(m, 3, 3)


def test_reader_refusals_are_one_line():
    with pytest.raises(ModelConfigError, match="'n_shared_experts' is 0"):
        _model(n_shared_experts=0)
    with pytest.raises(ModelConfigError, match="'num_nextn_predict_layers' must be an integer >= 0"):
        _model(num_nextn_predict_layers=-1)
    with pytest.raises(ModelConfigError, match="'mlp_bias' is true"):
        from_hf_config(dict(MLA, model_type="deepseek_v2", mlp_bias=True))
    with pytest.raises(ModelConfigError, match="'num_experts_per_tok' must be an integer >= 1, got None"):
        from_hf_config({k: v for k, v in MLA.items() if k != "num_experts_per_tok"} | {"model_type": "deepseek_v2"})


# ------------------------------------------------------------------------- DeepSeek-V3 as published
def _v3():
    return from_hf_config(shipped_configs()["deepseek-v3"])


def test_deepseek_v3_published_sizes():
    """DeepSeek-V3 (arXiv 2412.19437, sec. 4.2; the repository's README_WEIGHTS.md): 671B total, 37B activated
    per token; the main model's 36.6B activated include the 0.9B output head (not the embedding lookup); the MTP
    module adds 11.5B unique parameters besides the shared embedding and head."""
    m = _v3()
    total, active = flops.total_params(m), flops.active_params(m)
    emb = 129280 * 7168
    assert total == 671_026_404_352                   # transformers' meta-device count, see the exact test
    assert round(total / 1e9) == 671
    assert round((active - emb) / 1e9, 1) == 36.6
    assert round((active - emb) / 1e9) == 37
    # the MTP module: one MoE layer + eh_proj (2h x h) + 3 norms; 11.6B here, of which the layer is 11.5B
    mtp = deepseek.mtp_params(m)
    assert mtp == flops.layer_params(m) + 2 * 7168 * 7168 + 3 * 7168
    assert round(flops.layer_params(m) / 1e9, 1) == 11.5
    assert m.mtp_layers == 1 and m.dense_layers == 3 and m.experts == 256 and m.experts_per_token == 8


def test_deepseek_v2_lite_published_sizes():
    """DeepSeek-V2-Lite (model card; arXiv 2405.04434 appendix B): 15.7B total, 2.4B activated; a full query
    projection (``q_lora_rank`` null), 1 dense layer then 26 MoE layers of 64 experts (top 6) + 2 shared."""
    m = from_hf_config(shipped_configs()["deepseek-v2-lite"])
    assert m.q_lora_rank is None and m.dense_layers == 1 and m.shared_expert_ffn == 2 * 1408
    assert round(flops.total_params(m) / 1e9, 1) == 15.7
    assert 2.4e9 <= flops.active_params(m) - 102400 * 2048 < 2.5e9  # 2.45B, published as 2.4B


def test_deepseek_v3_mtp_counts_like_transformers_mtp_model():
    """transformers' causal LM leaves the MTP module out; its ``MtpModel`` (speculative decoding) builds it."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_layers import MtpModel

    for cfg in (MLA, json.loads(shipped_configs()["deepseek-v3"].read_text())):
        conf = transformers.AutoConfig.for_model(**cfg)
        with torch.device("meta"):
            hf = transformers.AutoModelForCausalLM.from_config(conf)
            mtp = MtpModel(hf, conf.num_mtp_layers)
        main_ids = {id(p) for p in hf.parameters()}
        theirs = sum(p.numel() for p in mtp.parameters() if id(p) not in main_ids)
        assert deepseek.mtp_params(from_hf_config(cfg)) == theirs


def test_cli_memory_prices_deepseek_v3(capsys):
    rc = main(["memory", "--model", "DeepSeek-V3", "--pp", "16", "-m", "32", "--seq", "4096", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc in (0, 1) and out["total_params"] == 671_026_404_352
    rc = main(["memory", "--model", "DeepSeek-V3", "--pp", "16", "-m", "32", "--seq", "4096"])
    text = capsys.readouterr().out
    assert "DeepSeek-V3 (671.03B" in text and "not supported" not in text


@pytest.mark.parametrize("name,total", [("gemma-7b", 8_537_680_896), ("gemma-2-9b", 9_241_705_984),
                                        ("phi-3-mini-4k-instruct", 3_821_079_552)])
def test_published_dense_sizes(name, total):
    """transformers' meta-device counts (the exact test is in test_models_hf_config); Phi-3-mini: "3.8B"
    (arXiv 2404.14219, sec. 2)."""
    assert flops.total_params(from_hf_config(shipped_configs()[name])) == total
    assert round(total / 1e8) == {"gemma-7b": 85, "gemma-2-9b": 92, "phi-3-mini-4k-instruct": 38}[name]


def test_gemma_published_non_embedding_parameters():
    """The non-embedding parameter counts the reports publish, exactly: Gemma 7B 7,751,248,896 (arXiv 2403.08295,
    table 2), Gemma 2 9B 8,324,201,984 (arXiv 2408.00118, table 2, with 917,504,000 embedding parameters; Gemma 1's
    table counts its embedding over 256,128 rows, the released config has 256,000)."""
    for name, non_emb in (("gemma-7b", 7_751_248_896), ("gemma-2-9b", 8_324_201_984)):
        m = from_hf_config(shipped_configs()[name])
        assert m.tied_embeddings
        assert flops.total_params(m) - m.vocab * m.hidden == non_emb
    assert 256000 * 3584 == 917_504_000


def test_gemma_7b_layer_flops_by_hand():
    """Gemma 7B's heads are 256 wide whatever the hidden width (16 x 256 = 4096 > 3072, arXiv 2403.08295 table 1):
    F = 2*t*(h*q + 2*h*kv + q*h + 3*h*f) + 4*t*s*q (Narayanan et al. 2021's GEMM count; GeGLU has SwiGLU's three
    GEMMs), B = the same GEMMs + twice the core, W = the GEMMs."""
    m = from_hf_config(shipped_configs()["gemma-7b"])
    t, s = 4096, 4096
    q = kv = 16 * 256
    gemm = 2 * t * (3072 * q + 2 * 3072 * kv + q * 3072 + 3 * 3072 * 24576)
    core = 4 * t * s * q
    assert flops.layer_flops(m, t, seq=s) == (gemm + core, gemm + 2 * core, gemm)


def test_gemma2_has_four_norms_per_layer():
    g1 = from_hf_config(dict(model_type="gemma", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128))
    g2 = from_hf_config(dict(model_type="gemma2", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128))
    assert flops.layer_params(g2) - flops.layer_params(g1) == 2 * 64


# ------------------------------------------------------------------------- the torch chunks
_TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=32, pad_token_id=0, bos_token_id=0, eos_token_id=0)
CHUNKED = {
    "gemma": dict(model_type="gemma", head_dim=16, **_TINY),
    "gemma2": dict(model_type="gemma2", head_dim=16, sliding_window=4, final_logit_softcapping=0.5, **_TINY),
    "phi3": dict(model_type="phi3", **_TINY),
}


@pytest.mark.parametrize("name", list(CHUNKED))
def test_chunks_compose_to_the_model(tmp_path, name):
    """The chunks pipeloom cuts compute the model's own logits (gemma: the embedding scale inside transformers'
    embedding module; gemma2: its final soft-cap by the family's logits hook, a cap of 0.5 so that it matters,
    and its sliding-window layers' masks)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from pipeloom.integrations.hf import build_model, canonical_names, pipeline_chunks
    from pipeloom.models.slicing import even_layer_split

    (tmp_path / "config.json").write_text(json.dumps(CHUNKED[name]))
    model = build_model(str(tmp_path), seed=3)
    chunks = pipeline_chunks(model, even_layer_split(model.config.num_hidden_layers, 4))
    x = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    h = x
    for c in chunks:
        h = c(h)
    ref = model(input_ids=x).logits
    assert h.shape == ref.shape
    assert (h - ref).abs().max().item() <= 1e-6
    if name == "gemma2":
        assert ref.abs().max().item() <= 0.5
    names = {nm for c in chunks for nm, _ in c.named_parameters(remove_duplicate=False)}
    assert names == set(canonical_names(model))


def test_deepseek_v3_chunks_hold_the_models_parameters_once():
    """Each pipeline chunk counts its own layers as what they are: the first 3 dense layers are not priced as MoE
    layers (they were: 32.8B too many parameters on the first stage), and the chunks add up to the model."""
    from pipeloom.memory.layers import TrainConfig, chunk_memory

    m = _v3()
    split = [4] * 13 + [3] * 3  # 61 layers on 16 stages
    chunks = chunk_memory(m, TrainConfig(seq=4096), split)
    # the last chunk also holds the multi-token prediction module (report sec. 2.2: one MoE layer, the 2h x h
    # eh_proj and three RMSNorms; embedding and output head shared with the main model), which transformers'
    # model leaves out of its count
    mtp = m.mtp_layers * (flops.layer_params(m) + 2 * m.hidden * m.hidden + 3 * m.hidden)
    assert m.mtp_layers == 1
    assert sum(c.params for c in chunks) == flops.total_params(m) + mtp
    dense_first = flops.layers_params(m, 0, 4)
    assert chunks[0].params - flops.embedding_params(m) == dense_first < 4 * flops.layer_params(m)
