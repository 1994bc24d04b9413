"""Every example in examples/ runs (docs/torch.md quotes them): a pipeloom plan in torch's runtime on gloo, the files
``tune --out`` wrote run by torchtitan's own config and pipeline code, and Megatron's checks of its arguments. Each
example checks its own result (losses and gradients against one process, stages and layers against the plan) and
exits non-zero on a difference."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.dist

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY = ["--model", "llama-tiny", "--gpus", "8", "--gpus-per-node", "4", "--gpu-flops", "2e9", "--gpu-memory", "24MiB",
        "--reserve", "0", "--global-batch", "16", "--pp", "2", "--schedules", "zbv,vhalf", "--max-microbatch-size", "2"]


def _run(*args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)


def test_examples_are_all_tested():
    assert {p.name for p in EXAMPLES.glob("*.py")} == {"torch_plan.py", "torchtitan_plan.py", "megatron_args.py"}
    listed = (EXAMPLES / "README.md").read_text()
    assert all(f"`{p.name}" in listed for p in EXAMPLES.glob("*.py"))


def test_torch_plan_example(tmp_path):
    r = _run(str(EXAMPLES / "torch_plan.py"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rank 0: chunks [0, 3]" in r.stdout and "rank 1: chunks [1, 2]" in r.stdout  # ZB-V's V placement
    diff = float(r.stdout.split("largest difference to one process (losses, gradients):")[1].split()[0])
    assert diff < 1e-5


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    out = tmp_path_factory.mktemp("tune") / "plan"
    r = _run("-m", "pipeloom", "tune", *TINY, "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out


def test_torch_plan_example_runs_tunes_csv(tuned):
    r = _run(str(EXAMPLES / "torch_plan.py"), str(tuned / "plan.torch.csv"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "largest difference to one process" in r.stdout


def test_torchtitan_example(tuned):
    pytest.importorskip("typeguard")
    pytest.importorskip("torchtitan.distributed.pipeline_parallel")
    r = _run(str(EXAMPLES / "torchtitan_plan.py"), str(tuned))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "rank 0: stages [0, 3]" in r.stdout and "ZBVZeroBubble placement" in r.stdout
    assert "losses equal one process" in r.stdout


def test_megatron_example(tuned):
    pytest.importorskip("megatron.core")
    r = _run(str(EXAMPLES / "megatron_args.py"), str(tuned))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "Megatron-Core accepts" in r.stdout and "Megatron has no V placement" in r.stdout
