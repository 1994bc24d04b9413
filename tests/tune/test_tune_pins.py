"""pipeloom tune: pinned degrees (tp, pp, vpp, dp, micro-batch size, schedule, recompute, ZeRO level), never a
pp 1 plan with vpp > 1, the 'ends' partition, ZeRO-2/3 in the space, --json obeying --top."""
from __future__ import annotations

import json

import pytest
from clirun import pipeloom

from pipeloom.models.presets import preset
from pipeloom.partition.layout import ends_as_layers
from pipeloom.tune import Problem, TuneError, tune
from pipeloom.tune.gpus import GPU, Link, MiB
from pipeloom.tune.search import Config, _Space, enumerate_space, evaluate

TINY_GPU = GPU(name="tiny", peak_flops=2e9, memory=24 * MiB, hbm_bandwidth=1e9,
               intra=Link(bandwidth=2e8, latency=2e-4), inter=Link(bandwidth=2e7, latency=1e-3), gpus_per_node=4)


def _problem(**kw):
    base = dict(model=preset("llama-tiny"), gpus=8, gpu=TINY_GPU, global_batch=16, seq=32, reserve=0,
                max_vpp=2, max_microbatch_size=2, recompute=("none",), top=3)
    base.update(kw)
    return Problem(**base)


def _space(prob):
    return enumerate_space(prob, _Space(prob), {})[0]


def test_no_pp1_plan_with_virtual_stages():
    cands = _space(_problem(gpus=4, global_batch=8))
    assert any(c.pp == 1 for c in cands) and any(c.vpp > 1 for c in cands)
    assert not [c for c in cands if c.pp == 1 and c.vpp > 1]


def test_pins_fix_vpp_dp_and_microbatch_size():
    cands = _space(_problem(vpp=2, dp=2, microbatch_sizes=(2,), schedules=("interleaved", "zbv", "1f1b")))
    assert cands
    assert {(c.vpp, c.dp, c.microbatch_size) for c in cands} == {(2, 2, 2)}
    assert {c.schedule for c in cands} == {"interleaved", "zbv"}  # 1f1b has no vpp 2


def test_pin_vpp_above_max_vpp_is_searched():
    cands = _space(_problem(vpp=4, max_vpp=2, pp=2, schedules=("interleaved",)))
    assert cands and {c.vpp for c in cands} == {4}


def test_vpp_on_pp1_is_refused():
    with pytest.raises(TuneError, match="virtual stages need a pipeline"):
        _problem(pp=1, vpp=2)


def test_ends_partition_trims_the_end_chunks():
    cands = _space(_problem(partitions=("ends",), schedules=("1f1b",), pp=2, tp=1))
    assert cands and all(c.seg_layer_num == tuple(ends_as_layers(8, 2, 1)) for c in cands)
    assert tuple(ends_as_layers(8, 2, 1)) == (4, 4)  # 10 slots, one given up at each end
    cands = _space(_problem(partitions=("ends",), schedules=("interleaved",), pp=4, vpp=2, tp=1))
    # 10 slots on 8 chunks: 1 each, the 2 extra on chunks 1 and 2; the first and the last chunk give one up
    assert cands and all(c.seg_layer_num == (0, 2, 2, 1, 1, 1, 1, 0) for c in cands)


def test_zero_levels_in_the_space_shrink_the_peak():
    prob = _problem(zero=(1, 2, 3), tp=1, pp=2, schedules=("1f1b",), partitions=("uniform",),
                    gpu=GPU(name="big", peak_flops=2e9, memory=4096 * MiB, hbm_bandwidth=1e9,
                            intra=TINY_GPU.intra, inter=TINY_GPU.inter, gpus_per_node=4))
    space = _Space(prob)
    cands = [c for c in enumerate_space(prob, space, {})[0] if c.microbatch_size == 1]
    peaks = {c.zero: evaluate(space, c).peak_bytes for c in cands}
    assert set(peaks) == {1, 2, 3}
    budget = {z: space.budget(next(c for c in cands if c.zero == z)) for z in (1, 2, 3)}
    for d in range(2):  # static: gradients /dp from ZeRO-2 on, parameters too with ZeRO-3
        p = budget[1].params[d]
        assert budget[2].static[d][1] == -(-4 * p // 4)
        assert budget[3].static[d][0] == -(-2 * p // 4)
    assert sum(budget[3].static[0]) < sum(budget[2].static[0]) < sum(budget[1].static[0])


def test_problem_zero_levels_checked():
    with pytest.raises(TuneError, match="2 = the optimizer states and the gradients"):
        _problem(zero=(4,))


def _cli(*args):
    return pipeloom("tune", *args)


TINY_ARGS = ["--model", "llama-tiny", "--gpus", "8", "--gpus-per-node", "4", "--global-batch", "16", "--seq", "32",
             "--gpu-memory", "64MiB", "--reserve", "0", "--workers", "1", "--max-vpp", "2"]


def test_cli_json_obeys_top():
    r = _cli(*TINY_ARGS, "--top", "1", "--json", "--schedules", "1f1b,interleaved")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert len(d["configs"]) == 1


def test_cli_pins():
    r = _cli(*TINY_ARGS, "--json", "--top", "50", "--tp", "1", "--pp", "4", "--vpp", "2", "--microbatch-size", "2",
             "--schedules", "interleaved,zbv", "--recompute", "selective", "--zero", "1", "--partitions", "ends")
    assert r.returncode == 0, r.stderr
    cs = json.loads(r.stdout)["configs"]
    assert cs and {(c["tp"], c["pp"], c["vpp"], c["dp"], c["microbatch_size"], c["recompute"], c["zero"],
                    c["partition"]) for c in cs} == {(1, 4, 2, 2, 2, "selective", 1, "ends")}


@pytest.mark.parametrize("args,words", [
    (["--pp", "1", "--vpp", "2"], "virtual stages need a pipeline"),
    (["--dp", "3"], "--dp 3 does not divide --gpus 8"),
    (["--zero", "4"], "allowed: 0, 1, 2, 3"),
    (["--partitions", "odd"], "allowed: uniform, balanced, ends"),
    (["--tp", "1", "--pp", "4", "--dp", "4"], "tp 1 x pp 4 x dp 4 = 16 is not the 8 GPUs"),
    (["--pp", "4", "--dp", "4"], "pp 4 x dp 4 = 16 does not divide the 8 GPUs"),
    (["--tp", "1", "--pp", "4", "--microbatch-size", "3"], "micro-batch size 3 divides no batch per replica "
                                                           "(global batch / dp = 8)"),
])
def test_cli_pin_errors_one_line(args, words):
    r = _cli(*TINY_ARGS, *args)
    assert r.returncode == 2
    err = r.stderr.strip()
    assert err.startswith("pipeloom: error:") and words in err and "\n" not in err


def test_cli_zero_help_says_what_each_level_shards():
    out = " ".join(_cli("--help").stdout.split())
    assert "1 = the optimizer states (fp32 master weights, Adam m and v) sharded over dp" in out
    assert "2 = the gradients too" in out and "3 = the parameters too (FSDP)" in out


def test_tune_with_pins_runs():
    res = tune(_problem(tp=1, pp=2, vpp=2, dp=4, schedules=("interleaved",)), workers=1)
    assert res.best is not None and (res.best.pp, res.best.vpp, res.best.dp) == (2, 2, 4)


def test_fits_nowhere_claims_only_what_it_checked():
    """The hint about more GPUs rests on the memory lower bound, not on a fit: the message says so (the old
    'or >= N GPUs' promised a fit that the larger job did not have)."""
    from pipeloom.tune import gpu_preset, with_overrides

    prob = Problem(model=preset("llama2-70b"), gpus=8, gpu=with_overrides(gpu_preset("h100"), memory=16 * 1024 ** 3),
                   global_batch=64, seq=4096, schedules=("1f1b",))
    with pytest.raises(TuneError) as e:
        tune(prob, workers=1)
    msg = str(e.value)
    assert "or >= " not in msg
    assert "passes the memory lower bound (tune --gpus" in msg and "\n" not in msg


def test_cli_defaults_are_the_problem_defaults():
    """The command line writes the tuner's defaults out (building the parser imports no memory model)."""
    from pipeloom.cli import build_parser
    from pipeloom.tune.space import DEFAULT_PARTITIONS, DEFAULT_ZERO

    args = build_parser().parse_args(["tune", "--model", "llama-tiny", "--gpus", "8", "--global-batch", "16"])
    assert args.zero == ",".join(map(str, DEFAULT_ZERO)) and args.partitions == ",".join(DEFAULT_PARTITIONS)


def test_cli_out_with_an_embedding_only_chunk_and_zero2(tmp_path):
    import tomllib

    r = _cli(*TINY_ARGS, "--tp", "1", "--pp", "4", "--vpp", "2", "--schedules", "interleaved", "--partitions", "ends",
             "--zero", "2", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "pipeloom.toml").read_text()
    cfg = tomllib.loads(text)
    assert cfg["training"]["zero"] == 1 and "planned with ZeRO-2" in text
    assert "layers_per_chunk" not in cfg.get("partition", {}) and "only the embedding" in text
    assert '"E|(tt|)*2,(t|)*4,L"' in (tmp_path / "megatron_args.txt").read_text()
    launch = json.loads((tmp_path / "launch.json").read_text())
    assert "(ZeRO-2)" in launch["megatron_note"] and "more memory than planned" in launch["megatron_note"]
    assert any("this ZeRO-2 plan" in n and "data_parallel_shard_degree = 2" in n for n in launch["torchtitan"]["notes"])
