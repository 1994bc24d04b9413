"""pipeloom's torchtitan files, loaded by torchtitan 0.3.0's own config code (``ConfigManager``: ``--module
pipeloom_torchtitan --config pipeloom_plan``, and the command-line overrides), then read by torchtitan's own
pipeline helpers: the stages each rank builds and the layers of each stage are the plan's, for every builder
pipeloom has. No processes (tests/integrations/test_tune_to_torchtitan.py runs the step)."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
pytest.importorskip("typeguard")  # tyro's; torchtitan's ConfigManager parses nothing without it
titan_pp = pytest.importorskip("torchtitan.distributed.pipeline_parallel")
titan_cfg = pytest.importorskip("torchtitan.config")

from pipeloom.core.ir import Placement  # noqa: E402
from pipeloom.integrations import torchtitan as tt  # noqa: E402
from pipeloom.partition import uniform  # noqa: E402
from pipeloom.schedule import io as schedule_io  # noqa: E402
from pipeloom.schedule.planning import make_spec, plan  # noqa: E402

#: (builder, pp, vpp): every pipeloom builder at a small shape (optimal: CP-SAT, slow, and its placement
#: is interleaved like zbh1's)
PLANS = [("1f1b", 4, 1), ("eager1f1b", 4, 1), ("fthenb", 4, 1), ("zbh1", 4, 1), ("zbh2", 4, 1),
         ("interleaved", 4, 2), ("interleaved", 4, 3), ("zbvpp", 4, 2), ("zbvpp", 2, 4),
         ("zbv", 4, 2), ("vhalf", 4, 2), ("vmin", 4, 2), ("dualpipev", 4, 2)]


def _splits(pp: int, vpp: int) -> dict:
    n = pp * vpp
    even = uniform(2 * n, pp, vpp, Placement.INTERLEAVED).seg_layer_num
    uneven = [3] * (n // 2) + [2] * (n - n // 2)  # tune's 70B pick has this shape
    heavy_ends = [1] + [3] * (n - 2) + [1] if n > 2 else [2] * n
    return {"even": list(even), "uneven": uneven, "heavy-ends": heavy_ends}


def _load(tmp_path, monkeypatch, job: tt.TitanJob, csv: str = "plan.torch.csv"):
    """Write the config module for ``job`` and load it with torchtitan's ConfigManager."""
    (tmp_path / "pipeloom_torchtitan.py").write_text(tt.config_module_text(job, csv))
    # no .pyc of it: the next call rewrites the file within the same second and often at the same size, and a
    # cached .pyc would then be taken for it (bytecode is checked by mtime in seconds and size)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(tt.BASE_ENV, "titan_standin:base")
    sys.modules.pop("pipeloom_torchtitan", None)
    return titan_cfg.ConfigManager().parse_args(["--module", "pipeloom_torchtitan", "--config", "pipeloom_plan"])


def _stage_names(par, layers: int) -> list[list[str]]:
    """The module names per stage torchtitan's pipeline_llm uses (its own default when none are given)."""
    if par.module_fqns_per_model_part is not None:
        return par.module_fqns_per_model_part
    meta = titan_pp._get_pipeline_metadata(SimpleNamespace(pp=par.pipeline_parallel_degree), par,
                                           SimpleNamespace(layers=[None] * layers))
    return titan_pp._generate_llm_fqn_per_model_part(*meta)


@pytest.mark.parametrize("builder, pp, vpp", PLANS, ids=[f"{b}-pp{p}-vpp{v}" for b, p, v in PLANS])
def test_torchtitan_builds_the_plans_stages_on_the_plans_ranks(builder, pp, vpp, tmp_path, monkeypatch):
    s = plan(builder, make_spec(pp=pp, microbatches=8, vpp=vpp))
    schedule_io.save(s, tmp_path / "plan.torch.csv", fmt="torch")
    for name, split in _splits(pp, vpp).items():
        job = tt.TitanJob.from_schedule(s, split, dp=2, zero=1)
        cfg = _load(tmp_path, monkeypatch, job)
        par = cfg.parallelism
        names = _stage_names(par, sum(split))
        got = [sum(1 for x in part if x.startswith("layers.")) for part in names]
        assert got == split, (name, got)
        assert names[0][0] == "tok_embeddings" and names[-1][-2:] == ["norm", "lm_head"]
        flat = [x for part in names for x in part if x.startswith("layers.")]
        assert flat == [f"layers.{i}" for i in range(sum(split))]  # model order, each layer once
        for rank in range(pp):
            built = titan_pp._get_pp_rank_to_stage_indices_mapping(rank, pp, par.pipeline_parallel_schedule,
                                                                   len(names))
            assert sorted(built) == s.chunks_of(rank), (name, rank, built)
        assert par.pipeline_parallel_schedule_csv == str(tmp_path / "plan.torch.csv")
        assert cfg.training.local_batch_size == s.microbatches  # torchtitan: n_microbatches = local / mbs


def test_the_default_split_is_torchtitans_own():
    for layers in range(2, 40):
        for stages in (1, 2, 3, 4, 6, 8, 16):
            try:
                names = titan_pp._generate_llm_fqn_per_model_part(stages, layers, 1, 1)
            except ValueError:
                assert tt.default_split(stages, layers) is None, (stages, layers)
                continue
            want = [sum(1 for x in part if x.startswith("layers.")) for part in names]
            assert tt.default_split(stages, layers) == want, (stages, layers)


def test_fqns_written_only_where_torchtitans_default_differs(tmp_path, monkeypatch):
    s = plan("1f1b", make_spec(pp=4, microbatches=8))
    default = tt.default_split(4, 14)  # [3, 4, 4, 3]: first and last one layer less
    job = tt.TitanJob.from_schedule(s, default)
    assert "module_fqns_per_model_part" not in tt.settings(job, "x.csv")["parallelism"]
    assert _load(tmp_path, monkeypatch, job).parallelism.module_fqns_per_model_part is None
    job = tt.TitanJob.from_schedule(s, [4, 3, 4, 3])
    assert _load(tmp_path, monkeypatch, job).parallelism.module_fqns_per_model_part is not None


def test_overrides_give_the_same_config_as_the_module(tmp_path, monkeypatch):
    s = plan("zbv", make_spec(pp=4, microbatches=8, vpp=2))
    job = tt.TitanJob.from_schedule(s, [3, 2, 2, 2, 2, 2, 2, 3], dp=4, tp=2, zero=1, recompute="full", seq=512,
                                    global_batch=32)
    from_module = _load(tmp_path, monkeypatch, job)
    st = tt.settings(job, str(tmp_path / "plan.torch.csv"))
    from_cli = titan_cfg.ConfigManager().parse_args(["--module", "titan_standin", "--config", "base",
                                                     *tt.overrides(st)])
    assert from_cli.parallelism == from_module.parallelism
    assert from_cli.training == from_module.training
    assert type(from_cli.activation_checkpoint).__qualname__ == "FullAC.Config"
    assert type(from_module.activation_checkpoint).__qualname__ == "FullAC.Config"


def test_zero1_is_written_as_replication_not_fsdp(tmp_path, monkeypatch):
    from torchtitan.distributed import ParallelDims

    s = plan("interleaved", make_spec(pp=4, microbatches=8, vpp=2))
    job = tt.TitanJob.from_schedule(s, [2] * 8, dp=8, tp=2, zero=1)
    par = _load(tmp_path, monkeypatch, job).parallelism
    assert (par.data_parallel_replicate_degree, par.data_parallel_shard_degree) == (8, 1)
    dims = ParallelDims.from_config(par, world_size=2 * 4 * 8)  # torchtitan's own check of the degrees
    assert not dims.dp_shard_enabled and dims.dp_replicate_enabled
    assert any("no ZeRO-1" in n for n in tt.notes(job))


def test_v_placement_with_more_than_two_chunks_is_refused_in_one_line():
    s = plan("zbv", make_spec(pp=4, microbatches=8, vpp=3))
    assert s.placement is Placement.V and s.vpp == 3
    with pytest.raises(tt.TorchtitanUnsupported) as e:
        tt.settings(tt.TitanJob.from_schedule(s, [2] * 12), "x.csv")
    msg = str(e.value)
    assert "\n" not in msg and "2 per rank" in msg and "_get_pp_rank_to_stage_indices_mapping" in msg
    with pytest.raises(AssertionError):  # and torchtitan itself would refuse it
        titan_pp._get_pp_rank_to_stage_indices_mapping(0, 4, "ZBVZeroBubble", 12)


def test_another_torchtitan_version_is_refused(tmp_path, monkeypatch):
    import torchtitan

    tt.check_version(tt.TORCHTITAN_VERSION)
    tt.check_version(tt.TORCHTITAN_VERSION + "+git1234")
    with pytest.raises(tt.TorchtitanUnsupported, match="0.4.0"):
        tt.check_version("0.4.0")
    s = plan("1f1b", make_spec(pp=2, microbatches=4))
    monkeypatch.setattr(torchtitan, "__version__", "0.4.0")
    with pytest.raises(RuntimeError, match="torchtitan 0.3.0; torchtitan 0.4.0 is installed"):
        _load(tmp_path, monkeypatch, tt.TitanJob.from_schedule(s, [3, 3]))


def test_a_base_config_of_another_depth_is_refused(tmp_path, monkeypatch):
    s = plan("1f1b", make_spec(pp=2, microbatches=4))
    (tmp_path / "pipeloom_torchtitan.py").write_text(tt.config_module_text(tt.TitanJob.from_schedule(s, [3, 3]),
                                                                           "plan.torch.csv"))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("pipeloom_torchtitan", None)
    import pipeloom_torchtitan

    cfg = SimpleNamespace(model_spec=SimpleNamespace(model=SimpleNamespace(layers=[None] * 80)))
    with pytest.raises(ValueError, match="80 layers; this plan splits 6"):
        pipeloom_torchtitan.apply_plan(cfg)


def test_tune_notes_an_installed_torchtitan_of_another_version(monkeypatch):
    s = plan("1f1b", make_spec(pp=2, microbatches=4))
    job = tt.TitanJob.from_schedule(s, [3, 3])
    assert tt.installed_version() == tt.TORCHTITAN_VERSION
    assert not any("installed" in n for n in tt.notes(job))
    monkeypatch.setattr(tt, "installed_version", lambda: "0.4.1")
    assert any("torchtitan 0.4.1 is installed" in n for n in tt.notes(job))


@pytest.mark.parametrize("builder, vpp, layers", [("zbv", 2, 30), ("interleaved", 3, 26)])
def test_plan_torchtitan_writes_files_torchtitan_loads(builder, vpp, layers, tmp_path, monkeypatch, capsys):
    """`pipeloom plan --format torch --out X.csv --torchtitan` writes torchtitan's config module beside the CSV;
    torchtitan's ConfigManager loads it, and its pipeline helpers give the plan's split and placement."""
    from pipeloom.cli import main

    out = tmp_path / "p.csv"
    rc = main(["plan", "-s", builder, "--pp", "4", "-m", "8", "--vpp", str(vpp), "--layers", str(layers),
               "--format", "torch", "--out", str(out), "--torchtitan"])
    printed = capsys.readouterr().out
    assert rc == 0 and "torchtitan.train --module pipeloom_torchtitan" in printed
    assert (tmp_path / "torchtitan_args.txt").read_text().startswith("--module llama3 --config ")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(tt.BASE_ENV, "titan_standin:base")
    sys.modules.pop("pipeloom_torchtitan", None)
    cfg = titan_cfg.ConfigManager().parse_args(["--module", "pipeloom_torchtitan", "--config", "pipeloom_plan"])
    par = cfg.parallelism
    s = schedule_io.load(str(out))
    names = _stage_names(par, layers)
    split = uniform(layers, 4, vpp, Placement(s.placement)).seg_layer_num
    assert [sum(1 for x in part if x.startswith("layers.")) for part in names] == list(split)
    for rank in range(4):
        built = titan_pp._get_pp_rank_to_stage_indices_mapping(rank, 4, par.pipeline_parallel_schedule, len(names))
        assert sorted(built) == s.chunks_of(rank)
    assert par.pipeline_parallel_schedule_csv == str(out)


def test_plan_torchtitan_refuses_before_writing(tmp_path, capsys):
    """A V plan with 3 chunks per device has no torchtitan placement: one line, and nothing written."""
    from pipeloom.cli import main

    rc = main(["plan", "-s", "zbv", "--pp", "4", "-m", "8", "--vpp", "3", "--layers", "36", "--format", "torch",
               "--out", str(tmp_path / "d" / "p.csv"), "--torchtitan"])
    err = capsys.readouterr().err
    assert rc == 2 and "torchtitan cannot run this plan" in err and "--vpp 2" in err
    assert not (tmp_path / "d").exists()
