"""`pipeloom run --calibrate FILE` writes a calibration that `pipeloom tune --calibration FILE` uses."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeloom.models import flops
from pipeloom.models.presets import preset
from pipeloom.tune import Calibration, CalibrationError, gpu_preset


def _pipeloom(*args):
    return subprocess.run([sys.executable, "-m", "pipeloom", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.dist
def test_run_calibrate_feeds_tune_explain(tmp_path):
    cal = tmp_path / "cal.json"
    r = _pipeloom("run", "--schedule", "1f1b", "--pp", "2", "--dp", "2", "--microbatches", "4", "--steps", "3",
                  "--microbatch-size", "2", "--seq-len", "16", "--calibrate", str(cal), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["calibration_file"] == str(cal)
    data = json.loads(cal.read_text())
    meas = data["measured"]
    assert data["device"]["type"] == "cpu"
    # the FLOPs of a chunk pass are the example model's (8 layers of llama-tiny's shape, 4 per chunk, head on
    # the last): counted here from pipeloom.models.flops, not taken from the file
    model = preset("llama-tiny")
    f, b, w = flops.layer_flops(model, 2 * 16, seq=16)
    hf = flops.head_flops(model, 2 * 16)[0]
    assert meas["flops_per_chunk_pass"]["F"] == pytest.approx((8 * f + hf) / 2)
    assert meas["flops_per_chunk_pass"]["W"] == pytest.approx((8 * w + hf) / 2)
    secs = sum(sum(meas["seconds_per_chunk_pass"][k]) for k in "FBW")
    assert data["achieved_flops"] == pytest.approx(2 * sum(meas["flops_per_chunk_pass"].values()) / secs)
    # dp 2: the all-reduce's bus bandwidth (ring: 2 (n-1)/n bytes / s) is the intra-node link
    ar = meas["dp_allreduce"]
    assert ar["ranks"] == 2 and data["intra"]["bandwidth"] == pytest.approx(ar["bytes"] / ar["seconds"])
    assert meas["p2p"]["bytes"] == 2 * 16 * 64 * 4 and meas["p2p"]["seconds"] > 0

    r = _pipeloom("tune", "--model", "llama2-7b", "--gpus", "8", "--global-batch", "16", "--tp", "1",
                  "--schedules", "1f1b", "--calibration", str(cal), "--explain", "--json")
    assert r.returncode == 0, r.stderr
    ex = json.loads(r.stdout)["explain"]
    # measured on a CPU, tuned for an H100: the CPU's FLOP/s stand in for the peak, at efficiency 1
    assert ex["calibration"]["achieved_flops"] == data["achieved_flops"]
    assert "not on a h100" in ex["calibration"]["note"]
    assert ex["efficiency"] == 1.0 and ex["gpu"]["peak_flops"] == data["achieved_flops"]
    assert ex["gpu"]["intra"]["bandwidth"] == pytest.approx(data["intra"]["bandwidth"])
    lf = flops.layer_flops(preset("llama2-7b"), 4096, seq=4096)[0]
    assert ex["layer"]["compute_F_s"] == pytest.approx(lf / data["achieved_flops"])


def test_measured_on_the_gpu_gives_an_efficiency():
    h100 = gpu_preset("h100")
    cal = Calibration.from_dict({"achieved_flops": 0.4 * h100.peak_flops,
                                 "device": {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}})
    c, g = cal.resolve(h100)
    assert c.efficiency == pytest.approx(0.4) and g == h100 and "efficiency" in c.note
    # an A100 measurement tuned for an H100: its FLOP/s, not an efficiency of the H100's peak
    c, g = Calibration.from_dict({"achieved_flops": 1e14, "device": {"type": "cuda", "name": "NVIDIA A100-SXM4-80GB"}}
                                 ).resolve(h100)
    assert c.efficiency == 1.0 and g.peak_flops == 1e14 and g.memory == h100.memory
    assert Calibration.from_dict({"achieved_flops": 1e14, "device": {"type": "cuda", "name": "NVIDIA A100-SXM4-80GB"}}
                                 ).resolve(gpu_preset("a100-80g"))[0].efficiency == pytest.approx(1e14 / 312e12)
    with pytest.raises(CalibrationError, match="achieved_flops"):
        Calibration.from_dict({"achieved_flops": -1})


@pytest.mark.slow
def test_calibrate_bad_path_is_one_line_before_the_run(tmp_path):
    r = _pipeloom("run", "--pp", "2", "--calibrate", str(tmp_path / "no" / "cal.json"))
    assert r.returncode != 0 and r.stderr.startswith("pipeloom: error: --calibrate") and r.stderr.count("\n") == 1
