"""The newcomer's path, end to end, on three tune problems: ``pipeloom tune ... --out DIR``, then torchtitan 0.3.0
loads DIR through its own config code (``ConfigManager``, ``--module pipeloom_torchtitan --config pipeloom_plan``),
its own pipeline code (``pipeline_llm``: stage split, placement, the schedule from the plan's CSV) builds the
plan's stages on the plan's ranks with the plan's layers and runs the CSV's first step on gloo with a tiny model of
the plan's depth (losses equal one process); and Megatron-Core accepts DIR's Megatron arguments with the plan's
split (``examples/torchtitan_plan.py`` and ``examples/megatron_args.py`` do the checks; they raise on any
difference).

The problems are the README's (70B on 1,024 H100s), Llama-3-70B on 512 and a 7B on 64, with the search narrowed
(``--tp``, ``--pp``, ``--vpp``, ``--schedules``, ``--partitions``, ...) to a looped, a V and an interleaved plan, so
that each takes seconds: a looped plan with an uneven split (pp 8 x 4 chunks of 2 and 3 layers: the chunks with the
embedding and the loss head hold 2), a V plan (pp 4 x 2) and an interleaved one (pp 2 x 4)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("typeguard")
pytest.importorskip("torchtitan.distributed.pipeline_parallel")

pytestmark = [pytest.mark.dist, pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

PROBLEMS = {
    "llama2-70b-1024-looped-uneven": (
        ["--model", "llama2-70b", "--gpus", "1024", "--global-batch", "1024", "--tp", "2", "--pp", "8",
         "--schedules", "zbvpp", "--recompute", "none", "--zero", "1", "--vpp", "4",
         "--partitions", "uniform,balanced"],
        dict(pp=8, vpp=4, schedule="zbvpp", placement="interleaved", split=[2] * 15 + [3] * 16 + [2])),
    "llama3-70b-512-v": (
        ["--model", "llama3-70b", "--gpus", "512", "--global-batch", "512", "--tp", "4", "--pp", "4",
         "--schedules", "zbv", "--recompute", "none", "--zero", "1", "--vpp", "2", "--partitions", "uniform,balanced"],
        dict(pp=4, vpp=2, schedule="zbv", placement="v", split=[10] * 8)),
    "llama2-7b-64-interleaved": (
        ["--model", "llama2-7b", "--gpus", "64", "--global-batch", "512", "--tp", "1", "--pp", "2",
         "--schedules", "interleaved,1f1b", "--recompute", "none", "--zero", "1", "--vpp", "4",
         "--partitions", "uniform,balanced"],
        dict(pp=2, vpp=4, schedule="interleaved", placement="interleaved", split=[4] * 8)),
}


def _run(*args, timeout=560):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_tune_out_runs_in_torchtitan_and_megatron_accepts_it(name, tmp_path):
    flags, want = PROBLEMS[name]
    out = tmp_path / "plan"
    r = _run("-m", "pipeloom", "tune", "--gpu", "h100", *flags, "--json", "--out", str(out))
    assert r.returncode == 0, r.stderr
    c = json.loads((out / "launch.json").read_text())["config"]
    s = json.loads((out / "plan.json").read_text())
    assert (c["pp"], c["vpp"], c["schedule"], c["seg_layer_num"]) == (want["pp"], want["vpp"], want["schedule"],
                                                                       want["split"])
    assert s["placement"] == want["placement"]
    r = _run(str(EXAMPLES / "torchtitan_plan.py"), str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "losses equal one process" in r.stdout
    for rank in range(want["pp"]):
        assert f"rank {rank}: stages" in r.stdout
    pytest.importorskip("megatron.core")
    r = _run(str(EXAMPLES / "megatron_args.py"), str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert f"decoder layers per chunk {want['split']} (the plan's)" in r.stdout
