"""Sharded data parallelism (ZeRO-1/2/3) in the memory model: static bytes, transient, CLI and tuner input."""
from __future__ import annotations

import json
import math

import pytest

from pipeloom.cli import main
from pipeloom.memory.analytic import TrainConfig, MemoryConfigError
from pipeloom.memory.budget import device_budget
from pipeloom.memory.sharding import sharded, static_bytes
from pipeloom.models.presets import preset


# bytes per parameter by hand (Rajbhandari et al. 2020 sec. 5 with Megatron's fp32 main grads):
# (params, grads, optimizer) per level, "/d" written out: P = 1000 parameters, d = 8 replicas
@pytest.mark.parametrize("dtype,zero,expected", [
    ("bf16", 0, (2000, 4000, 12000)),
    ("bf16", 1, (2000, 4000, 1500)),
    ("bf16", 2, (2000, 500, 1500)),
    ("bf16", 3, (250, 500, 1500)),
    ("fp32", 2, (4000, 500, 1000)),
    ("fp32", 3, (500, 500, 1000)),
    ("fp16", 1, (2000, 2000 + 500, 1500)),   # fp16 grads whole, fp32 master grads sharded
    ("fp16", 2, (2000, 750, 1500)),          # both sharded: 6 bytes / 8
    ("fp16", 3, (250, 750, 1500)),
])
def test_static_bytes_per_zero_level(dtype, zero, expected):
    assert static_bytes(1000, TrainConfig(dtype=dtype, dp=8, zero=zero)) == expected


def test_one_replica_shards_nothing():
    for z in (1, 2, 3):
        t = TrainConfig(dp=1, zero=z)
        assert sharded(t) == frozenset()
        assert static_bytes(1000, t) == (2000, 4000, 12000)
    assert sharded(TrainConfig(dp=4, zero=2)) == {"optimizer", "grads"}


def test_bad_zero_level_names_every_level():
    with pytest.raises(MemoryConfigError, match="3 = the optimizer states, the gradients and the parameters"):
        TrainConfig(zero=4)


def test_transient_holds_one_chunk_unsharded():
    """ZeRO-2 adds the largest chunk's fp32 gradients, ZeRO-3 also its bf16 parameters, on every device."""
    model = preset("llama2-7b")
    base = device_budget(model, TrainConfig(dp=8, zero=1), pp=4, vpp=2)
    z2 = device_budget(model, TrainConfig(dp=8, zero=2), pp=4, vpp=2)
    z3 = device_budget(model, TrainConfig(dp=8, zero=3), pp=4, vpp=2)
    for d in range(4):
        biggest = max(c.params for c in base.chunks[d])
        assert z2.transient[d] - base.transient[d] == pytest.approx(4 * biggest)
        assert z3.transient[d] - base.transient[d] == pytest.approx(6 * biggest)
        assert z3.transient_fused[d] - base.transient_fused[d] == pytest.approx(6 * biggest)
        assert z3.static[d][0] == math.ceil(2 * base.params[d] / 8)


def test_cli_memory_zero3_json(capsys):
    rc = main(["memory", "--model", "llama2-7b", "--pp", "2", "-m", "4", "--dp", "16", "--zero", "3", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["zero"] == 3 and d["sharded"] == ["grads", "optimizer", "params"]
    for dev in d["devices"]:
        assert dev["params_bytes"] == math.ceil(2 * dev["params"] / 16)
        assert dev["grads_bytes"] == math.ceil(4 * dev["params"] / 16)
        assert dev["optimizer_bytes"] == math.ceil(12 * dev["params"] / 16)


def test_cli_memory_zero_help_says_what_each_level_shards(capsys):
    with pytest.raises(SystemExit):
        main(["memory", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    from pipeloom.memory.sharding import ZERO_LEVELS

    for z in (1, 2, 3):  # the help's words are the library's
        assert f"{z} {ZERO_LEVELS[z]}" in out


def test_cli_memory_zero_out_of_range(capsys):
    with pytest.raises(SystemExit) as e:
        main(["memory", "--model", "llama2-7b", "--pp", "2", "-m", "4", "--zero", "4"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeloom: error:") and "choose from 0, 1, 2, 3" in err


def test_collectives_each_level_implies():
    from pipeloom.memory.sharding import collectives

    P, m = 1000, 16
    assert collectives(TrainConfig(dp=1, zero=3), P, m) == []
    assert collectives(TrainConfig(dp=8, zero=0), P, m) == [("all-reduce", "grads", 4000, 1)]
    assert collectives(TrainConfig(dp=8, zero=1), P, m) == [("reduce-scatter", "grads", 4000, 1),
                                                            ("all-gather", "params", 2000, 1)]
    assert collectives(TrainConfig(dp=8, zero=2), P, m) == [("reduce-scatter", "grads", 4000, 16),
                                                            ("all-gather", "params", 2000, 1)]
    assert collectives(TrainConfig(dp=8, zero=3, dtype="fp32"), P, m) == [("reduce-scatter", "grads", 4000, 16),
                                                                          ("all-gather", "params", 4000, 32)]
