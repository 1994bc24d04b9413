"""``run --model PATH --tp N`` builds only its shards: the transformers model is made on ``meta`` and the seeded
initialization replayed one parameter at a time (:mod:`pipeloom.integrations.hf_meta`).

* The replay equals the whole seeded build bitwise (every parameter and buffer, through a slicing ``keep``), for
  each family the TP path shards: the oracle is ``AutoModelForCausalLM.from_config`` itself.
* With saved weights (``--weights``) the shards are read alone from the safetensors files: equal to the loaded
  model's slices, and the peak is the shards plus small working copies (no full parameter).
* Peak CPU bytes while a TP rank builds its chunk (torch's allocator records,
  :func:`pipeloom.memory.traced.live_bytes`) are at most what the chunk holds plus the largest single full parameter (plus the 5 KB of the random state
  saved while the stream is replayed); the whole build (the old path) holds the whole model, over that bound. Both TP ranks' shards equal the slices of the whole build.
"""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from pipeloom.integrations.hf import build_model, load_config  # noqa: E402
from pipeloom.integrations.hf_meta import meta_model, meta_tensors, seeded_init  # noqa: E402
from pipeloom.runtime.launch import spawn  # noqa: E402

BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            max_position_embeddings=32)
CONFIGS = {"llama": dict(model_type="llama", num_key_value_heads=2, **BASE),
           "mistral": dict(model_type="mistral", num_key_value_heads=1, sliding_window=4, **BASE)}
SPLIT = [[0], [1], [2], [3]]


def _spec(tmp_path, name: str) -> str:
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(CONFIGS[name]))
    return str(d)


def _rows(w):  # a cut that is neither the whole tensor nor a contiguous prefix
    return w[1:-1:2] if w.dim() else w


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_replayed_init_equals_the_whole_seeded_build(tmp_path, name):
    spec = _spec(tmp_path, name)
    ref = build_model(spec, seed=7)
    full = {**dict(ref.named_parameters()), **dict(ref.named_buffers())}
    model = meta_model(load_config(spec))
    state = torch.get_rng_state()
    got = seeded_init(model, 7, {n: _rows for n in full})
    assert torch.equal(torch.get_rng_state(), state)  # the process's random stream is left as it was
    assert got.keys() == full.keys()
    diff = [n for n in full if not torch.equal(got[n], _rows(full[n]).contiguous())]
    assert diff == []
    assert len(meta_tensors(model)) == len(full)  # the model itself stays on meta
    other = seeded_init(meta_model(load_config(spec)), 8, {"lm_head.weight": _rows})
    assert not torch.equal(other["lm_head.weight"], got["lm_head.weight"])  # the seed matters


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # bf16: numpy has no such dtype, torch's view reads it
def test_load_slices_reads_the_cut_of_each_tensor_from_several_files(tmp_path, dtype):
    from safetensors.torch import save_file

    from pipeloom.integrations.hf_meta import load_slices

    g = torch.Generator().manual_seed(0)
    full = {"a.weight": torch.randn(6, 4, generator=g), "b.weight": torch.randn(3, 8, generator=g),
            "c.weight": torch.randn(5, generator=g)}
    dt = getattr(torch, dtype)
    save_file({k: full[k].to(dt) for k in ("a.weight", "b.weight")}, str(tmp_path / "model-1.safetensors"))
    save_file({"c.weight": full["c.weight"].to(dt)}, str(tmp_path / "model-2.safetensors"))
    got = load_slices(str(tmp_path), {"a.weight": (0, 2, 3), "b.weight": (1, 4, 4), "c.weight": None})
    want = {"a.weight": full["a.weight"][2:5], "b.weight": full["b.weight"][:, 4:8], "c.weight": full["c.weight"]}
    for k, v in want.items():
        assert got[k].dtype == torch.float32 and got[k].is_contiguous()
        assert torch.equal(got[k], v.to(dt).float()), k
    with pytest.raises(KeyError, match="no safetensors file holds d.weight"):
        load_slices(str(tmp_path), {"d.weight": None})


def _build_peak(spec: str, weights: bool) -> dict:
    """On each TP rank: peak live CPU bytes while building chunk 1 (of 4) through ``HFRunModel.tp_chunks``, the
    bytes the chunk holds, the largest full parameter, and whether every shard equals the whole build's slice."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from pipeloom.integrations.hf import HFRunModel, pipeline_chunks
    from pipeloom.integrations.hf_tp import shard_hf_chunk_
    from pipeloom.memory.traced import live_bytes

    group = dist.group.WORLD
    run_model = HFRunModel(spec, weights=weights)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        chunk = run_model.tp_chunks(SPLIT, [1], seed=3, group=group)[0]
    _, peak = live_bytes(prof)
    held = sum(t.numel() * t.element_size() for t in (*chunk.parameters(), *chunk.buffers()))
    ref = build_model(spec, seed=3, weights=weights)
    largest = max(p.numel() * p.element_size() for p in ref.parameters())
    whole = sum(p.numel() * p.element_size() for p in ref.parameters())
    sliced = shard_hf_chunk_(pipeline_chunks(ref, SPLIT, [1])[0], group)
    mine, theirs = dict(chunk.named_parameters()), dict(sliced.named_parameters())
    equal = mine.keys() == theirs.keys() and all(torch.equal(mine[n], theirs[n]) for n in mine) and \
        all(getattr(mine[n], "tp_shard", 0) == getattr(theirs[n], "tp_shard", 0) for n in mine) and \
        all(torch.equal(a, b) for a, b in zip(chunk.buffers(), sliced.buffers()))
    out = [None] * dist.get_world_size()
    rng = torch.get_rng_state().numel()  # the generator's state, saved and restored around the replay
    dist.all_gather_object(out, dict(peak=peak, held=held, largest=largest, whole=whole, equal=equal, rng=rng))
    return out


@pytest.mark.dist
def test_a_tp_rank_builds_its_shards_within_one_full_parameter(tmp_path):
    for rank in spawn(_build_peak, 2, (_spec(tmp_path, "llama"), False), timeout_s=120):
        assert rank["equal"], rank
        assert rank["held"] < rank["whole"] // 4  # a quarter of the layers, half of each
        assert rank["held"] + rank["largest"] + rank["rng"] < rank["whole"]  # so the old whole build fails below
        assert 0 < rank["peak"] <= rank["held"] + rank["largest"] + rank["rng"], rank


@pytest.mark.dist
def test_with_saved_weights_a_tp_rank_reads_only_its_slices(tmp_path):
    """``--weights``: the shards are read alone from the safetensors file (the whole loaded model's slices,
    bitwise), so the peak is what the rank keeps plus the rotary buffers' working copies, no full parameter."""
    spec = _spec(tmp_path, "mistral")
    build_model(spec, seed=11).save_pretrained(spec)
    for rank in spawn(_build_peak, 2, (spec, True), timeout_s=120):
        assert rank["equal"], rank
        assert 0 < rank["peak"] < rank["held"] + rank["largest"] // 2, rank
