"""tune --pair-fb: the F&B pairing pass (pipeloom.schedule.pairing) on schedules that do not pair by themselves,
when the configuration has an expert all-to-all to hide."""
from __future__ import annotations

import json

import pytest
from clirun import pipeloom

CMD = ["tune", "--model", "Qwen3-30B-A3B", "--gpus", "64", "--global-batch", "256",
       "--seq", "4096", "--schedules", "interleaved", "--max-vpp", "2", "--recompute", "none", "--top", "1",
       "--tp", "1", "--pp", "4", "--zero", "1", "--json", "--explain"]


def _run(cmd):
    return json.loads(pipeloom(*cmd, check=True).stdout)


def test_pair_fb_hides_the_all_to_all_in_interleaved():
    plain, paired = _run(CMD + ["--ep", "8"]), _run(CMD + ["--ep", "8", "--pair-fb"])
    a, b = plain["configs"][0], paired["configs"][0]
    assert (a["schedule"], a["ep"], b["schedule"], b["ep"]) == ("interleaved", 8, "interleaved", 8)
    assert plain["explain"]["parallel"]["fb_pairs"] == 0 and not plain["explain"]["parallel"]["pairs_hide_a2a"]
    assert paired["explain"]["parallel"]["fb_pairs"] > 0 and paired["explain"]["parallel"]["pairs_hide_a2a"]
    # the pairs hide all-to-all: the simulated pipeline gets shorter, at most by the all-to-all there is
    layer = plain["explain"]["layer"]
    assert layer["a2a_F_s"] > 0
    assert b["makespan_s"] < a["makespan_s"]
    assert b["step_time_s"] < a["step_time_s"]


def test_pair_fb_without_an_all_to_all_adds_no_pairs():
    """A dense model has no all-to-all: --pair-fb changes nothing."""
    cmd = ["tune", "--model", "llama-tiny", "--gpus", "8", "--global-batch", "16",
           "--schedules", "interleaved", "--pp", "4", "--top", "1", "--json", "--explain"]
    plain, paired = _run(cmd), _run(cmd + ["--pair-fb"])
    assert paired["explain"]["parallel"]["fb_pairs"] == 0
    assert paired["configs"][0]["step_time_s"] == plain["configs"][0]["step_time_s"]


@pytest.mark.slow  # 8-45 s on 2 busy cores: make test runs it, make test-fast does not
def test_pair_fb_is_recorded_and_asked_again(tmp_path):
    base = [a for a in CMD if a != "--explain"] + ["--ep", "8"]
    paired = _run(base + ["--pair-fb", "--out", str(tmp_path)])
    assert "pair_fb = true" in (tmp_path / "pipeloom.toml").read_text()
    again = _run(["tune", "--config", str(tmp_path / "pipeloom.toml"), "--json"])
    assert again["configs"][0]["step_time_s"] == paired["configs"][0]["step_time_s"]
