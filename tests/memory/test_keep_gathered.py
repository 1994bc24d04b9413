"""memory --keep-gathered-input: with sequence parallelism the column-parallel GEMMs' inputs counted all-gathered
(pipeloom's TP runtime keeps them from F to W) instead of Megatron's saved sequence shard."""
from __future__ import annotations

import json

from clirun import pipeloom

from pipeloom.memory import layers as an
from pipeloom.models.presets import preset as get_preset


def _mem(*extra):
    r = pipeloom("memory", "--model", "llama-tiny", "--pp", "2", "-m", "4", "-s", "1f1b", "--tp", "2", "--dtype",
                 "fp32", "--sequence-parallel", "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_keep_gathered_input_adds_the_other_shards_of_qkv_and_fc1_inputs():
    m = get_preset("llama-tiny")
    base = dict(seq=m.seq, micro_batch=1, dtype="fp32", tp=2, sequence_parallel=True)
    meg = {it.name: it.bytes for it in an.layer_activations(m, an.TrainConfig(**base))}
    keep = {it.name: it.bytes for it in an.layer_activations(m, an.TrainConfig(**base, keep_gathered_input=True))}
    full = 4 * m.hidden * m.seq
    assert keep["qkv.input"] == keep["fc1.input"] == full and meg["qkv.input"] == meg["fc1.input"] == full / 2
    assert {k: v for k, v in keep.items() if k not in ("qkv.input", "fc1.input")} == \
        {k: v for k, v in meg.items() if k not in ("qkv.input", "fc1.input")}
    # without sequence parallelism nothing changes (the input is whole anyway)
    nosp = dict(base, sequence_parallel=False)
    assert an.layer_w_held(m, an.TrainConfig(**nosp)) == an.layer_w_held(m, an.TrainConfig(**nosp, keep_gathered_input=True))
    a, b = _mem(), _mem("--keep-gathered-input")
    for da, db in zip(a["devices"], b["devices"]):
        assert db["activations_bytes"] > da["activations_bytes"] and db["params_bytes"] == da["params_bytes"]
