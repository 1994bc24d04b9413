"""Traced vs analytic memory on transformers' own modules (impl='hf'), per chunk, dense and MoE."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch import nn  # noqa: E402

import pipeloom.memory.analytic as an  # noqa: E402
from pipeloom.memory.traced import trace_chunk  # noqa: E402
from pipeloom.models.hf_config import from_hf_config  # noqa: E402


class _Chunk(nn.Module):
    """Layers ``lo:hi`` of a transformers decoder (+ embedding on the first chunk, final norm and head on the
    last), called the way the decoder calls them: rotary tables computed once per forward, causal SDPA."""

    def __init__(self, hf, lo: int, hi: int, first: bool, last: bool):
        super().__init__()
        base = hf.model
        self.embed = base.embed_tokens if first else None
        self.layers = nn.ModuleList(base.layers[lo:hi])
        self.rotary = base.rotary_emb
        self.norm = base.norm if last else None
        self.head = hf.lm_head if last else None

    def forward(self, x):
        h = self.embed(x) if self.embed is not None else x
        pos = torch.arange(h.shape[1])[None]
        pe = self.rotary(h, pos)
        for layer in self.layers:
            h = layer(h, attention_mask=None, position_ids=pos, position_embeddings=pe)
            h = h[0] if isinstance(h, tuple) else h
        return self.head(self.norm(h)) if self.head is not None else h


def _loss(out, y):
    return nn.functional.cross_entropy(out.float().flatten(0, 1), y.flatten())


_BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, vocab_size=128,
             max_position_embeddings=64)
DENSE = {
    "llama": dict(model_type="llama", num_key_value_heads=2, **_BASE),
    "mistral": dict(model_type="mistral", num_key_value_heads=1, **_BASE),
    "qwen2": dict(model_type="qwen2", num_key_value_heads=2, **_BASE),
    "qwen3": dict(model_type="qwen3", num_key_value_heads=2, head_dim=32, **_BASE),
}
MOE = {
    "mixtral": dict(model_type="mixtral", num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                    **_BASE),
    "qwen3_moe": dict(model_type="qwen3_moe", num_key_value_heads=2, head_dim=16, num_experts=6,
                      num_experts_per_tok=2, moe_intermediate_size=40, **_BASE),
    "qwen2_moe": dict(model_type="qwen2_moe", num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=24, shared_expert_intermediate_size=48, **_BASE),
}


def _compare(cfg: dict, dtype, *, fake: bool, b: int = 2, s: int = 16):
    conf = transformers.AutoConfig.for_model(**cfg)
    conf._attn_implementation = "sdpa"
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(conf).to(dtype).train()
    L = conf.num_hidden_layers
    cuts = [(0, 1, True, False), (1, L - 1, False, False), (L - 1, L, False, True)]
    train = an.TrainConfig(seq=s, micro_batch=b, dtype="fp32" if dtype == torch.float32 else "bf16", impl="hf")
    analytic = an.chunk_memory(from_hf_config(cfg), train, [hi - lo for lo, hi, _, _ in cuts])
    x = torch.randint(0, conf.vocab_size, (b, s))
    target = torch.randint(0, conf.vocab_size, (b, s))
    out = []
    for (lo, hi, first, last), a in zip(cuts, analytic):
        chunk = _Chunk(hf, lo, hi, first, last)
        tc = trace_chunk(chunk, x, target=target if last else None, loss_fn=_loss if last else None, fake=fake)
        out.append((tc, a))
        if not last:
            with torch.no_grad():
                x = chunk(x).detach()
    return out


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("arch", list(DENSE))
def test_dense_transformers_chunks_traced_equal_analytic(arch, dtype):
    for tc, a in _compare(DENSE[arch], torch.float32 if dtype == "fp32" else torch.bfloat16, fake=True):
        assert tc.activation_bytes == pytest.approx(a.activation_bytes, rel=1e-3)  # the loss scalar differs
        assert tc.w_held_bytes == a.w_held_bytes


@pytest.mark.parametrize("arch", list(MOE))
def test_moe_transformers_chunks_traced_within_2_percent(arch):
    # real tensors: the routing is data-dependent (fake tensors cannot run it)
    for tc, a in _compare(MOE[arch], torch.bfloat16, fake=False):
        assert tc.activation_bytes == pytest.approx(a.activation_bytes, rel=0.02)
        # the runtime's split: the routed experts' weight grads in B, router and shared experts deferred to W
        assert tc.w_held_bytes == pytest.approx(a.w_held_bytes, rel=0.02)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_gpt2_chunks_traced_within_2_percent(dtype):
    """GPT-2 (learned positions, LayerNorm, Conv1D, gelu_new written out in PyTorch ops) cut by pipeloom's own
    ``integrations.hf.pipeline_chunks``: activations within 2%, bytes held for W (Conv1D deferred) equal."""
    from pipeloom.integrations.hf import pipeline_chunks

    cfg = dict(model_type="gpt2", n_embd=64, n_inner=96, n_layer=4, n_head=4, vocab_size=128, n_positions=64,
               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    conf = transformers.AutoConfig.for_model(**cfg)
    conf._attn_implementation = "sdpa"
    torch.manual_seed(0)
    tdtype = torch.float32 if dtype == "fp32" else torch.bfloat16
    hf = transformers.AutoModelForCausalLM.from_config(conf).to(tdtype).train()
    b, s = 2, 16
    cuts = [[0], [1, 2], [3]]
    train = an.TrainConfig(seq=s, micro_batch=b, dtype=dtype, impl="hf")
    analytic = an.chunk_memory(from_hf_config(cfg), train, [len(c) for c in cuts])
    x = torch.randint(0, 128, (b, s))
    y = torch.randint(0, 128, (b, s))
    chunks = pipeline_chunks(hf, cuts)
    for i, (chunk, a) in enumerate(zip(chunks, analytic)):
        last = i == len(cuts) - 1
        tc = trace_chunk(chunk, x, target=y if last else None, loss_fn=_loss if last else None, fake=True)
        assert tc.activation_bytes == pytest.approx(a.activation_bytes, rel=0.02), i
        assert tc.w_held_bytes == a.w_held_bytes, i
        if not last:
            with torch.no_grad():
                x = chunk(x).detach()
