"""--config FILE: plan and run take a settings file; the command line wins; tune --out writes one."""
from __future__ import annotations

import json

import pytest

from pipeloom.cli import build_parser, main
from pipeloom.core.config import PipeloomConfig, read_config
from pipeloom.schedule.io import load


def _main(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _jobs(path) -> list:
    s = load(str(path))
    return [[str(j) for j in d] for d in s.devices]


def test_plan_config_equals_the_same_flags(tmp_path, capsys):
    cfg = tmp_path / "a.toml"
    cfg.write_text('[schedule]\nname = "zbv"\npp = 4\nmicrobatches = 8\nmem_limit = "0.75p"\n'
                   'costs = "F=1,B=1,W=1,comm=0.5"\noptions = {}\n')
    assert _main(capsys, "plan", "--config", str(cfg), "-o", str(tmp_path / "c.json"))[0] == 0
    assert _main(capsys, "plan", "-s", "zbv", "--pp", "4", "-m", "8", "--mem-limit", "0.75p",
                 "--costs", "F=1,B=1,W=1,comm=0.5", "-o", str(tmp_path / "f.json"))[0] == 0
    assert _jobs(tmp_path / "c.json") == _jobs(tmp_path / "f.json")
    assert load(str(tmp_path / "c.json")).meta["mem_limit"] == 3.0


def test_flags_win_over_the_file(tmp_path, capsys):
    cfg = tmp_path / "a.json"
    PipeloomConfig.from_dict({"schedule": {"name": "zbv", "pp": 4, "microbatches": 8}}).save(cfg)
    rc, out, _ = _main(capsys, "plan", "--config", str(cfg), "--pp", "2", "-m", "6", "--json")
    d = json.loads(out)
    assert rc == 0 and (d["schedule"], d["pp"], d["microbatches"]) == ("zbv", 2, 6)


def test_plan_without_shape_names_the_fields(tmp_path, capsys):
    cfg = tmp_path / "a.toml"
    cfg.write_text('[schedule]\nname = "zbv"\n')
    rc, _, err = _main(capsys, "plan", "--config", str(cfg), "--microbatches", "4")
    # schedule.pp is left out of the file: the default of the section applies only where the file sets it
    assert rc == 2 and err.startswith("pipeloom: error: plan needs --pp") and "[schedule]" in err


@pytest.mark.parametrize("text, words", [
    ('[schedule]\npp = 0\n', "schedule.pp must be an integer >= 1, got 0"),
    ('[training]\ndp = 2\nzero = 3\n', "training.zero must be 0"),
    ('[schedul]\n', "unknown section 'schedul'"),
    ('[schedule]\nname = "zbx"\n', "schedule.name: unknown schedule 'zbx'; choose one of: "),
])
def test_bad_file_is_one_line_naming_the_field(tmp_path, capsys, text, words):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    rc, _, err = _main(capsys, "run", "--config", str(cfg))
    assert rc == 2 and err.startswith(f"pipeloom: error: {cfg}: ") and words in err
    assert len(err.strip().splitlines()) == 1


def _run_config(argv):
    """The RunConfig 'pipeloom run ARGV' would start (nothing spawned)."""
    from pipeloom.cli.config_opts import apply_config
    from pipeloom.cli.run_cmd import run_config

    args = build_parser().parse_args(["run", *argv])
    if args.config:
        apply_config(args, args._subparsers.choices["run"], argv, args._config_flags)
    return run_config(args)


def test_run_config_maps_every_section(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text('[schedule]\nname = "zbv"\npp = 4\nmicrobatches = 8\nmem_limit = "1p"\n'
                   '[model]\ndim = 32\n'
                   '[training]\ndp = 2\nsteps = 5\nmicrobatch_size = 1\nseq_len = 8\nlr = 0.01\nseed = 3\n'
                   'dtype = "bf16"\nzero = 1\nrank_order = "pp-dp"\n'
                   '[job]\nverify = true\ntimeout_s = 30\nlog_dir = "logs"\nprofile_steps = "1:3"\n')
    rc = _run_config(["--config", str(cfg), "--steps", "4"])
    # the limit is parsed once, into the spec (line below); the run config carries no raw string beside it
    assert (rc.schedule, rc.pp, rc.microbatches, rc.mem_limit) == ("zbv", 4, 8, None)
    assert (rc.dp, rc.microbatch_size, rc.seq_len, rc.lr, rc.seed, rc.dtype, rc.zero, rc.rank_order, rc.dim) == \
        (2, 1, 8, 0.01, 3, "bf16", 1, "pp-dp", 32)
    assert (rc.verify, rc.timeout_s, rc.log_dir, rc.profile_steps) == (True, 30.0, "logs", "1:3")
    assert rc.steps == 4  # the command line wins
    assert rc.spec.mem_limit == 4.0


def test_tune_out_config_runs_the_exact_plan_and_plans_again(tmp_path, capsys):
    out = tmp_path / "plan"
    rc, _, err = _main(capsys, "tune", "--model", "llama-tiny", "--gpus", "8", "--gpus-per-node", "4",
                       "--gpu-flops", "2e9", "--gpu-memory", "24MiB", "--reserve", "0", "--global-batch", "16",
                       "--schedules", "zbv,interleaved", "--max-microbatch-size", "2", "--json", "--out", str(out))
    assert rc == 0, err
    cfg, fields = read_config(out / "pipeloom.toml")
    best = json.loads((out / "launch.json").read_text())["config"]
    assert (cfg.schedule.name, cfg.schedule.pp, cfg.schedule.vpp, cfg.schedule.microbatches) == \
        (best["schedule"], best["pp"], best["vpp"], best["microbatches"])
    assert list(cfg.partition.layers_per_chunk) == best["seg_layer_num"]
    assert (cfg.training.dp, cfg.training.zero, cfg.training.microbatch_size) == \
        (best["dp"], best["zero"], best["microbatch_size"])
    assert (cfg.tune.model, cfg.tune.gpus, cfg.tune.global_batch, cfg.tune.tp) == ("llama-tiny", 8, 16, best["tp"])
    assert cfg.tune.step_time_s == best["step_time_s"] and cfg.tune.mfu == best["mfu"]
    # the file round-trips: read and written again it is the same text below its comment header
    text = (out / "pipeloom.toml").read_text()
    body = text[text.index("["):]
    assert PipeloomConfig.from_toml(text).to_toml() == body
    # run --config: the tuner's exact plan file and its layer split
    rc_ = _run_config(["--config", str(out / "pipeloom.toml")])
    planned = load(str(out / "plan.json"))
    assert rc_.plan.devices == planned.devices and list(rc_.layers_per_chunk) == best["seg_layer_num"]
    assert rc_.dp == best["dp"] and rc_.zero == best["zero"] and rc_.dtype == "bf16"
    # plan --config: the same builder, shape and split planned again
    rc2, o, e = _main(capsys, "plan", "--config", str(out / "pipeloom.toml"), "--json")
    d = json.loads(o)
    assert rc2 == 0, e
    assert (d["schedule"], d["pp"], d["vpp"], d["microbatches"], d["valid"]) == \
        (best["schedule"], best["pp"], best["vpp"], best["microbatches"], True)
    assert d["partition"]["seg_layer_num"] == best["seg_layer_num"]
    # the whole question is recorded: hardware figures and search limits as [tune] fields
    assert (cfg.tune.gpus_per_node, cfg.tune.gpu_flops, cfg.tune.gpu_memory, cfg.tune.reserve, cfg.tune.schedules,
            cfg.tune.max_microbatch_size) == (4, 2e9, "24MiB", "0", "zbv,interleaved", 2)
    # tune --config alone: the [tune] record asks the same question again
    rc3, o3, e3 = _main(capsys, "tune", "--config", str(out / "pipeloom.toml"), "--json")
    assert rc3 == 0, e3
    again = json.loads(o3)["configs"][0]
    assert {k: again[k] for k in ("tp", "pp", "vpp", "dp", "schedule", "microbatches", "seg_layer_num")} == \
        {k: best[k] for k in ("tp", "pp", "vpp", "dp", "schedule", "microbatches", "seg_layer_num")}
    rc4, _, e4 = _main(capsys, "tune", "--gpus", "8")
    assert rc4 == 2 and "tune needs --model, --global-batch (or a --config FILE whose [tune] section" in e4


def test_layers_per_chunk_flag(capsys):
    rc, out, _ = _main(capsys, "plan", "-s", "interleaved", "--pp", "2", "--vpp", "2", "-m", "4",
                       "--layers-per-chunk", "3,1,2,2", "--json")
    assert rc == 0 and json.loads(out)["partition"]["seg_layer_num"] == [3, 1, 2, 2]
    rc, _, err = _main(capsys, "plan", "-s", "interleaved", "--pp", "2", "--vpp", "2", "-m", "4",
                       "--layers-per-chunk", "3,1,2")
    assert rc == 2 and "gives 3 counts but pp*vpp = 2*2 = 4 chunks" in err


@pytest.mark.dist
def test_run_with_a_settings_file_verifies(tmp_path):
    """End to end: 'pipeloom run --config FILE' spawns the ranks the file describes and passes --verify."""
    import subprocess
    import sys

    cfg = tmp_path / "run.toml"
    cfg.write_text('[schedule]\nname = "zbv"\npp = 2\nmicrobatches = 4\nmem_limit = "1p"\n'
                   '[training]\nsteps = 2\n[job]\nverify = true\ntimeout_s = 60\n')
    r = subprocess.run([sys.executable, "-m", "pipeloom", "run", "--config", str(cfg), "--steps", "1", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["schedule"], d["pp"], d["vpp"], d["microbatches"], d["steps"]) == ("zbv", 2, 2, 4, 1)
    assert d["verified"] is True and d["max_grad_diff"] <= 1e-5


def test_plan_on_the_command_line_wins_over_the_files_schedule(tmp_path, capsys):
    """--plan FILE fixes the schedule: the settings' [schedule] fields are not applied (nor refused as flags)."""
    plan_file = tmp_path / "p.json"
    assert main(["plan", "-s", "1f1b", "--pp", "2", "-m", "2", "-o", str(plan_file)]) == 0
    cfg = tmp_path / "s.toml"
    cfg.write_text('[schedule]\nname = "zbv"\npp = 4\nmicrobatches = 8\nplan = "other.json"\n[training]\ndp = 2\n')
    rc = _run_config(["--config", str(cfg), "--plan", str(plan_file)])
    assert rc.plan.name == "1f1b" and rc.pp == 2 and rc.dp == 2


def test_library_from_settings_matches_the_command_line(tmp_path):
    """pipeloom.runtime.config.from_settings: the same RunConfig as 'pipeloom run --config FILE' for the example."""
    from pipeloom.core.config import ConfigError
    from pipeloom.runtime.config import from_settings

    cfg = tmp_path / "run.toml"
    cfg.write_text('[schedule]\nname = "zbv"\npp = 4\nmicrobatches = 8\nmem_limit = "1p"\ncosts = "F=1,B=2,W=1,comm=0"\n'
                   '[partition]\nlayers_per_chunk = [2, 2, 2, 2, 2, 2, 2, 2]\n'
                   '[training]\ndp = 2\nsteps = 5\nzero = 1\n[job]\nverify = true\n')
    lib = from_settings(PipeloomConfig.load(cfg))
    cli = _run_config(["--config", str(cfg)])
    for f in ("schedule", "pp", "vpp", "microbatches", "dp", "steps", "zero", "verify", "layers_per_chunk", "dim"):
        assert getattr(lib, f) == getattr(cli, f), f
    assert lib.spec.costs == cli.spec.costs and lib.spec.mem_limit == cli.spec.mem_limit == 4.0
    with pytest.raises(ConfigError, match="partition.model 'llama2-7b': a run costs the layers of the model it"):
        from_settings(PipeloomConfig.from_dict({"partition": {"model": "llama2-7b"}}))
    with pytest.raises(ConfigError, match=r"partition\.layers_per_chunk gives 3 counts but pp\*vpp = 2\*2 = 4"):
        from_settings(PipeloomConfig.from_dict({"schedule": {"name": "zbv"}, "partition": {"layers_per_chunk": [1, 2, 3]}}))
    # a balanced split, as 'pipeloom run --balance' makes it
    bal = tmp_path / "bal.toml"
    bal.write_text('[schedule]\nname = "zbv"\npp = 2\nmicrobatches = 4\n[partition]\nlayers = 10\nvocab = 32000\n'
                   'hidden = 64\nbalance = "bottleneck"\n')
    a, b = from_settings(PipeloomConfig.load(bal)), _run_config(["--config", str(bal)])
    assert a.layers_per_chunk == b.layers_per_chunk and sum(a.layers_per_chunk) == 10 and a.spec.costs == b.spec.costs
    with pytest.raises(ConfigError, match="schedule.name: unknown schedule 'nope'"):
        from_settings(PipeloomConfig.from_dict({"schedule": {"name": "nope"}}))
