"""The overlap, bucket and efficiency-curve flags are part of the question a tune settings file records: `tune
--config DIR/pipeloom.toml` asks it again with them."""
from __future__ import annotations

import json

from clirun import pipeloom

from pipeloom.core.config import PipeloomConfig


def _cli(*args):
    return pipeloom("tune", *args)


def test_tune_records_and_asks_again_the_overlap_bucket_and_curve_flags(tmp_path):
    out = tmp_path / "plan"
    flags = ["--tp-overlap", "chunked:3", "--tp-comm-overlap", "--dp-bucket-size", "20000",
             "--efficiency-half-hidden", "48"]
    r = _cli("--model", "llama-tiny", "--gpus", "8", "--gpus-per-node", "4", "--gpu-flops", "2e9", "--gpu-memory",
             "24MiB", "--reserve", "0", "--global-batch", "16", "--schedules", "1f1b,zbv", "--max-microbatch-size", "1",
             "--recompute", "none", "--json", "--explain", "--out", str(out), *flags)
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout)
    cfg = PipeloomConfig.from_toml((out / "pipeloom.toml").read_text())
    assert (cfg.tune.tp_overlap, cfg.tune.tp_comm_overlap, cfg.tune.dp_bucket_size, cfg.tune.efficiency_half_hidden) \
        == ("chunked:3", True, 20000, 48)
    again = _cli("--config", str(out / "pipeloom.toml"), "--json", "--explain")
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert second["configs"][0]["step_time_s"] == first["configs"][0]["step_time_s"]
    assert second["explain"]["communication"]["tp_overlap"] == "chunked:3 + userbuffers"
    assert second["explain"]["communication"]["dp"]["bucket_params"] == 20000
