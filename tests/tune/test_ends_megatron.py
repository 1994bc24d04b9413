"""The 'ends' partition through Megatron-Core's own checks: a plan whose first chunk holds only the embedding and
whose last only the loss is written as a --pipeline-model-parallel-layout that Megatron-Core accepts with the
plan's layers per chunk (examples/megatron_args.py runs Megatron's argument checks and layer counting)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow  # two subprocesses, one importing megatron-core and torch: 15-40 s on 2 cores
def test_megatron_accepts_embedding_and_loss_only_stages(tmp_path):
    pytest.importorskip("megatron.core")
    out = tmp_path / "plan"
    r = subprocess.run([sys.executable, "-m", "pipeloom", "tune", "--model", "llama-tiny", "--gpus", "8",
                        "--gpus-per-node", "4", "--gpu-flops", "2e9", "--gpu-memory", "24MiB", "--reserve", "0",
                        "--global-batch", "16", "--tp", "1", "--pp", "4", "--vpp", "2", "--schedules", "interleaved",
                        "--partitions", "ends", "--max-microbatch-size", "1", "--workers", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, str(EXAMPLES / "megatron_args.py"), str(out)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    # 8 layers + embedding + loss = 10 slots on 8 chunks (see test_tune_pins.py)
    assert "Megatron-Core accepts" in r.stdout and "decoder layers per chunk [0, 2, 2, 1, 1, 1, 1, 0]" in r.stdout
