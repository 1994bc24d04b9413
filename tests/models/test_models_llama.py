"""The example Llama decoder: chunks compose to the reference, deterministic per-chunk init."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.memory.analytic import total_params
from pipeloom.models.llama import (LlamaConfig, apply_rope, build_chunk_modules, build_reference,
                                   even_layer_split, loss_fn, synthetic_batch)

CFG = LlamaConfig(n_layers=6, dim=32, n_heads=4, n_kv_heads=2, max_seq_len=16)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only add contention on a shared CI box
    yield
    torch.set_num_threads(threads)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 40), c=st.integers(1, 40))
def test_even_layer_split(n, c):
    if n < c:
        with pytest.raises(ValueError):
            even_layer_split(n, c)
        return
    split = even_layer_split(n, c)
    assert [i for s in split for i in s] == list(range(n))
    sizes = [len(s) for s in split]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    assert sizes == sorted(sizes, reverse=True)  # round-robin fill: extras go to the first chunks


def test_seed_split_example():
    # MISSION capability 5: 7 layers over 4 chunks -> 2,2,2,1
    assert [len(s) for s in even_layer_split(7, 4)] == [2, 2, 2, 1]


@pytest.mark.parametrize("nchunks", [1, 2, 3, 6])
def test_chunks_compose_to_reference_forward_and_grads(nchunks):
    split = even_layer_split(CFG.layers, nchunks)
    chunks = build_chunk_modules(CFG, split, seed=7)
    ref = build_reference(CFG, seed=7)
    x, y = synthetic_batch(CFG, 3, 12, seed=1)
    h = x
    for c in chunks:
        h = c(h)
    out_ref = ref(x)
    torch.testing.assert_close(h, out_ref, rtol=0, atol=1e-6)
    loss_fn(h, y).backward()
    loss_fn(out_ref, y).backward()
    ref_grads = dict(ref.named_parameters())
    names = set()
    for c in chunks:
        for name, p in c.named_parameters():
            names.add(name)
            torch.testing.assert_close(p.grad, ref_grads[name].grad, rtol=0, atol=1e-6)
    assert names == set(ref_grads)


def test_subset_build_is_identical_and_independent_of_global_rng():
    split = even_layer_split(CFG.layers, 3)
    torch.manual_seed(123)
    full = build_chunk_modules(CFG, split, seed=3)
    torch.manual_seed(999)
    (only,) = build_chunk_modules(CFG, split, seed=3, chunks=[1])
    for (n1, p1), (n2, p2) in zip(full[1].named_parameters(), only.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)
    other = build_chunk_modules(CFG, split, seed=4, chunks=[1])[0]
    assert not torch.equal(other.layers['2'].attn.wq.weight, only.layers['2'].attn.wq.weight)


def test_first_and_last_chunk_roles():
    chunks = build_chunk_modules(CFG, even_layer_split(CFG.layers, 3))
    assert chunks[0].is_first and not chunks[0].is_last
    assert chunks[-1].is_last and not chunks[-1].is_first
    assert not chunks[1].is_first and not chunks[1].is_last
    # the torch model has exactly the parameters the analytic model counts for the same description
    assert sum(p.numel() for c in chunks for p in c.parameters()) == total_params(CFG)


def test_bf16_build_is_rounded_fp32():
    split = even_layer_split(CFG.layers, 2)
    a = build_chunk_modules(CFG, split, seed=1)[0]
    b = build_chunk_modules(CFG, split, seed=1, dtype=torch.bfloat16)[0]
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert pb.dtype == torch.bfloat16 and torch.equal(pa.to(torch.bfloat16), pb)


def test_causal():
    ref = build_reference(CFG, seed=0)
    x, _ = synthetic_batch(CFG, 1, 10, seed=0)
    x2 = x.clone()
    x2[0, 7:] = (x2[0, 7:] + 1) % CFG.vocab
    torch.testing.assert_close(ref(x)[:, :7], ref(x2)[:, :7])
    assert not torch.allclose(ref(x)[:, 7:], ref(x2)[:, 7:])


def test_rope_preserves_norm_and_position_zero():
    q = torch.randn(2, 5, 3, 8)
    from pipeloom.models.llama import rope_tables
    cos, sin = rope_tables(8, 5, 10000.0)
    r = apply_rope(q, cos, sin)
    torch.testing.assert_close(r.norm(dim=-1), q.norm(dim=-1))
    torch.testing.assert_close(r[:, 0], q[:, 0])


def test_synthetic_batch_is_shifted_progression():
    x, y = synthetic_batch(CFG, 4, 9, seed=5)
    assert x.shape == y.shape == (4, 9)
    torch.testing.assert_close(x[:, 1:], y[:, :-1])
    step = (x[:, 1] - x[:, 0]) % CFG.vocab
    assert torch.equal((x[:, 2] - x[:, 1]) % CFG.vocab, step)
    assert torch.equal(synthetic_batch(CFG, 4, 9, seed=5)[0], x)


@pytest.mark.parametrize("kw,msg", [(dict(dim=30, n_heads=4), "divisible"), (dict(n_kv_heads=3), "divide"),
                                    (dict(n_layers=0), "n_layers"), (dict(dim=12, n_heads=4), "even")])
def test_config_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        LlamaConfig(**kw)


def test_bad_split_and_seq():
    with pytest.raises(ValueError, match="every layer"):
        build_chunk_modules(CFG, [[0, 1], [3, 4, 5]])
    with pytest.raises(ValueError, match="max_seq_len"):
        synthetic_batch(CFG, 1, 17)


def test_the_torch_llama_refuses_what_it_cannot_build():
    from pipeloom.models.presets import preset

    with pytest.raises(ValueError, match="mlp='gelu', norm='layernorm', bias=True, tied_embeddings=True"):
        build_chunk_modules(preset("gpt3-125m"), [list(range(12))])
