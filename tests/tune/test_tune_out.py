"""``pipeloom tune --out DIR`` writes its own files and touches nothing else in DIR (it used to delete a user's
plan.trace.json, plan.gantt.html and plan.gantt.svg there); it says which of its files it replaced."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from clirun import pipeloom

from pipeloom.tune.launch import FILES

TINY = ["--model", "llama-tiny", "--gpus", "8", "--gpus-per-node", "4", "--gpu-flops", "2e9", "--gpu-memory", "24MiB",
        "--reserve", "0", "--global-batch", "16", "--schedules", "1f1b,interleaved,zbv", "--max-microbatch-size", "2"]


def _tune(*args):
    return pipeloom("tune", *TINY, *args)


def test_out_never_deletes_or_changes_what_it_did_not_write(tmp_path):
    out = tmp_path / "plan"
    out.mkdir()
    mine = {"plan.trace.json": "my trace", "plan.gantt.html": "<p>mine</p>", "plan.gantt.svg": "<svg/>",
            "torchtitan.toml": "# my torchtitan settings", "notes.txt": "keep me"}
    for name, text in mine.items():
        (out / name).write_text(text)
    r = _tune("--json", "--out", str(out))
    assert r.returncode == 0, r.stderr
    for name, text in mine.items():
        assert (out / name).read_text() == text, name
    d = json.loads(r.stdout)
    written = {p.rsplit("/", 1)[1] for p in d["written"]}
    assert written <= set(FILES) and {"plan.json", "plan.torch.csv", "launch.json", "megatron_args.txt"} <= written
    assert d["replaced"] == []
    assert set(p.name for p in out.iterdir()) == set(mine) | written


@pytest.mark.slow  # 8-45 s on 2 busy cores: make test runs it, make test-fast does not
def test_out_says_which_files_it_replaced(tmp_path):
    out = tmp_path / "plan"
    out.mkdir()
    (out / "plan.json").write_text("{}")
    (out / "keep.json").write_text("{}")
    r = _tune("--out", str(out))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert f"replaced {out / 'plan.json'}" in lines
    assert f"wrote {out / 'launch.json'}" in lines
    assert (out / "keep.json").read_text() == "{}"
    r = _tune("--json", "--out", str(out))
    d = json.loads(r.stdout)
    assert sorted(d["replaced"]) == sorted(d["written"])  # the second run replaces exactly its own files


def test_the_launch_files_are_written_without_torch():
    # tune is core (no torch): its torchtitan and Megatron writers must not pull torch in
    code = ("import sys, pipeloom.tune.launch, pipeloom.integrations.torchtitan, pipeloom.integrations.megatron; "
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


def test_a_v_plan_torchtitan_cannot_place_gets_a_reason_and_no_config(tmp_path):
    from types import SimpleNamespace

    from pipeloom.core.ir import Placement
    from pipeloom.schedule.planning import make_spec, plan
    from pipeloom.tune.launch import write_plan
    from pipeloom.tune.search import Config

    s = plan("zbv", make_spec(pp=4, microbatches=8, vpp=3))
    c = Config(tp=1, pp=4, dp=2, vpp=3, microbatch_size=1, microbatches=8, schedule="zbv", recompute="none", zero=0,
               partition="uniform", mem_limit_mode="default", seg_layer_num=(2,) * 12, placement=Placement.V,
               schedule_obj=s)
    res = SimpleNamespace(best=c, problem=SimpleNamespace(global_batch=16, seq=128, model=SimpleNamespace(name="m"),
                                                          gpu=SimpleNamespace(gpus_per_node=8)))
    names = {p.rsplit("/", 1)[1] for p in write_plan(res, str(tmp_path))}
    assert "pipeloom_torchtitan.py" not in names and "torchtitan_args.txt" not in names
    assert {"plan.json", "plan.torch.csv", "megatron_args.txt", "launch.json"} <= names
    t = json.loads((tmp_path / "launch.json").read_text())["torchtitan"]
    assert "\n" not in t["unsupported"] and "3 chunks per device" in t["unsupported"]
    mg = json.loads((tmp_path / "launch.json").read_text())
    assert mg["megatron_vpp"] == 3 and mg["megatron_split"] == [2] * 12 and not mg["megatron_runs_this_order"]
