"""Stage shapes in the memory model: uneven end stages, embedding-only and loss-only chunks, Megatron layouts,
early freeing of stage outputs, interleaving with microbatches not a multiple of pp."""
from __future__ import annotations

import json

import pytest

from pipeloom.cli import main
from pipeloom.memory.analytic import TrainConfig, chunk_memory, estimate
from pipeloom.models.presets import preset
from pipeloom.partition.layout import PartitionError, end_stage_counts, ends_as_layers
from pipeloom.partition.megatron import LayoutError, layout_chunk_counts


def test_ends_as_layers_llama3_405b_split():
    # 126 layers + embedding + loss = 128 slots on pp 16 x vpp 8: one layer per chunk, the first chunk
    # only the embedding, the last only the loss (Llama 3 paper, sec. 3.3.2)
    assert ends_as_layers(126, 16, 8) == [0] + [1] * 126 + [0]
    # vpp 2: 4 slots per chunk, one layer less on the first and the last chunk
    assert ends_as_layers(126, 16, 2) == [3] + [4] * 30 + [3]
    assert ends_as_layers(10, 2, 1, embedding=1, loss=0) == [4, 6]  # 11 slots: 5, 6 (extra off chunk 0)


def test_ends_as_layers_refuses_empty_middle_chunks():
    with pytest.raises(PartitionError, match="without a layer"):
        ends_as_layers(4, 4, 2)


def test_end_stage_counts_first_and_last():
    assert end_stage_counts(126, 16, 1, first=7, last=7) == [7] + [8] * 14 + [7]
    seg = end_stage_counts(126, 16, 2, first=7, last=7)
    # stage 0 holds global chunks 0 and 16: the fewest (3) on chunk 0; stage 15 chunks 15 and 31: 3 on 31
    assert (seg[0], seg[16]) == (3, 4) and (seg[15], seg[31]) == (4, 3)
    assert sum(seg) == 126
    assert end_stage_counts(10, 3, 1, first=2) == [2, 4, 4]
    with pytest.raises(PartitionError, match="leave"):
        end_stage_counts(10, 3, 1, first=9, last=9)
    with pytest.raises(PartitionError, match="without a layer"):
        end_stage_counts(16, 4, 2, first=0)


def test_layout_with_embedding_and_loss_only_chunks():
    assert layout_chunk_counts("E|t*2|t*2|L", 2) == (2, [0, 2, 2, 0])
    with pytest.raises(LayoutError, match="stage 1 holds no decoder layer"):
        layout_chunk_counts("Et|E|t|L".replace("E|", "|", 1), 2)


def test_kept_stage_outputs_add_one_output_per_chunk_but_the_last():
    model = preset("llama3-405b")
    t = dict(seq=8192, tp=8, sequence_parallel=True)
    freed = chunk_memory(model, TrainConfig(**t), [42, 42, 42])
    kept = chunk_memory(model, TrainConfig(**t, free_stage_io=False), [42, 42, 42])
    out = 2 * 16384 * 8192 / 8  # bf16 hidden states of one sequence, split over tp 8 by sequence parallelism
    assert [k.activation_bytes - f.activation_bytes for f, k in zip(freed, kept)] == [out, out, 0.0]


def test_interleaved_takes_microbatches_not_a_multiple_of_pp():
    # Llama 3's flexible interleaving: any number of microbatches per round (here 6 on pp 4)
    rep = estimate("llama2-7b", TrainConfig(seq=4096), schedule="interleaved", pp=4, vpp=2, microbatches=6)
    assert rep.microbatches == 6 and len(rep.devices) == 4


def _json(capsys, *argv):
    rc = main(["memory", *argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_cli_account_for_embedding_and_loss(capsys):
    rc, d = _json(capsys, "--model", "llama2-7b", "--pp", "4", "-m", "8", "--account-for-embedding",
                  "--account-for-loss")
    assert rc == 0 and d["layers_per_chunk"] == [7, 9, 9, 7]  # 34 slots: 8, 9, 9, 8; minus one at each end


def test_cli_first_last_stage_layers_and_layout(capsys):
    rc, d = _json(capsys, "--model", "llama2-7b", "--pp", "4", "-m", "8", "--first-stage-layers", "6",
                  "--last-stage-layers", "6")
    assert rc == 0 and d["layers_per_chunk"] == [6, 10, 10, 6]
    rc, d = _json(capsys, "--model", "llama2-7b", "--pp", "2", "-m", "4", "-s", "interleaved",
                  "--megatron-layout", "E|t*16|t*16|L")
    assert rc == 0 and d["vpp"] == 2 and d["layers_per_chunk"] == [0, 16, 16, 0]
    # the embedding-only chunk holds the embedding's parameters, the loss-only chunk the head's
    assert d["devices"][0]["params"] > 0 and d["devices"][1]["params"] > 0


@pytest.mark.parametrize("argv,msg", [
    (["--layers-per-chunk", "16,16", "--account-for-loss"], "give one of them"),
    (["--megatron-layout", "E|t*16|t*16|L", "--vpp", "3"], "--vpp is 3"),
    (["--first-stage-layers", "40"], "leave"),
    (["--first-stage-layers", "4", "-s", "zbv"], "places its chunks otherwise"),
])
def test_cli_stage_shape_errors(capsys, argv, msg):
    assert main(["memory", "--model", "llama2-7b", "--pp", "2", "-m", "4", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pipeloom: error:") and msg in err and "\n" not in err


def test_one_verdict_in_the_table_output(capsys):
    # V-Min on pp 4 peaks below the free memory (40.8 GiB on device 0 with its own 2-unit limit used in full),
    # but the room left is under 1p: the old output said
    # "fits" and "largest standard limit that fits: none" side by side
    rc = main(["memory", "--model", "llama2-7b", "--pp", "4", "-m", "8", "-s", "vmin", "--gpu-memory", "42GiB"])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 0 and out.count("fits") == 2  # the column header and the one verdict
    assert "fits: vmin peaks at" in out and "that fits" not in out and "below 1p" in out


def test_long_context_default_seq_warns(capsys, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4,
                               "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 1024,
                               "vocab_size": 1000, "max_position_embeddings": 131072}))
    rc = main(["memory", "--model", str(cfg), "--pp", "2", "-m", "4", "--json"])
    cap = capsys.readouterr()
    assert rc == 0 and json.loads(cap.out)["seq"] == 8192
    err = cap.err.strip()
    assert err.startswith("pipeloom: warning:") and "131072" in err and "--seq" in err and "\n" not in err
    rc = main(["memory", "--model", str(cfg), "--pp", "2", "-m", "4", "--seq", "131072", "--json"])
    cap = capsys.readouterr()
    assert json.loads(cap.out)["seq"] == 131072 and cap.err == ""
