"""CLI: pipeloom partition, and the --layers family on plan / simulate."""
from __future__ import annotations

import json

import pytest

from pipeloom.cli import main


def _json(capsys, argv) -> dict:
    rc = main(argv)
    out = capsys.readouterr().out
    assert rc == 0, out
    return json.loads(out)


def test_partition_json_devices_mission_example(capsys):
    d = _json(capsys, ["partition", "--layers", "8", "--pp", "2", "--vpp", "2", "--layers-per-device", "5,3",
                       "--json"])
    assert d["devices"] == [[[0, 1, 2], [5, 6]], [[3, 4], [7]]]
    assert d["seg_layer_num"] == [3, 2, 2, 1]
    assert d["simulated"]["valid"] and d["uniform"]["simulated"]["valid"]
    # device 0 does 5 of 8 layers: uneven -> slower than the uniform split
    assert d["simulated"]["makespan"] > d["uniform"]["simulated"]["makespan"]


def test_partition_balance_heavy_head_gains(capsys):
    d = _json(capsys, ["partition", "--layers", "32", "--pp", "4", "--vocab", "128000", "--hidden", "4096",
                       "--balance", "--json"])
    assert d["how"] == "balanced (makespan)"
    assert d["makespan_gain"] > 0.05
    assert sum(len(c) for dev in d["devices"] for c in dev) == 32
    assert d["layers_per_device"][-1] < 8  # the head's device gets fewer layers


def test_partition_text_output(capsys):
    assert main(["partition", "--layers", "9", "--pp", "2", "--vpp", "2"]) == 0
    out = capsys.readouterr().out
    assert "layers per global chunk): [3, 2, 2, 2]" in " ".join(out.split())
    assert "+head" in out and "makespan" in out


@pytest.mark.parametrize("argv, needle", [
    (["partition", "--layers", "3", "--pp", "2", "--vpp", "2"], "--layers >= 4"),
    (["partition", "--layers", "8", "--pp", "2", "--vpp", "2", "--layers-per-device", "5,4"], "sum to 8"),
    (["partition", "--layers", "8", "--pp", "2", "--vpp", "2", "--layers-per-device", "7,1"], ">= vpp"),
    (["partition", "--layers", "8", "--pp", "2", "--layers-per-device", "4,2,2"], "one count per device"),
    (["partition", "--pp", "2", "--layers", "8", "--schedule", "nope"], "unknown schedule"),
    (["simulate", "-s", "1f1b", "--pp", "2", "-m", "4", "--layers", "8", "--mem", "a=1"], "--mem"),
    (["simulate", "-s", "1f1b", "--pp", "2", "-m", "4", "--layers", "8", "--costs", "F=1:2"], "per-chunk"),
])
def test_bad_input_exit_2_one_line(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeloom: error:") and err.count("\n") == 1
    assert needle in err


def test_negative_cost_file(capsys, tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"layers": [{"F": 1}, {"F": 1, "W": -0.5}]}))
    assert main(["partition", "--pp", "2", "--layer-costs", str(f)]) == 2
    assert "negative" in capsys.readouterr().err


@pytest.mark.parametrize("sched, vpp", [("1f1b", "1"), ("interleaved", "2"), ("zbv", "2")])
def test_simulate_uniform_layers_equals_unpartitioned(capsys, sched, vpp):
    base = ["simulate", "-s", sched, "--pp", "4", "-m", "6", "--vpp", vpp, "--costs", "F=1,B=2,W=1,comm=0.5",
            "--json"]
    a = _json(capsys, base)
    b = _json(capsys, base + ["--layers", str(4 * int(vpp) * 3)])
    assert b["makespan"] == pytest.approx(a["makespan"])
    assert b["peak_memory"] == pytest.approx(a["peak_memory"])


def test_simulate_and_plan_accept_partition_options(capsys, tmp_path):
    f = tmp_path / "c.csv"
    f.write_text("name,F,B,W,mem\n" + "".join(f"l{i},1,1,1,1\n" for i in range(8)) + "head,3,3,3,2\n")
    a = _json(capsys, ["simulate", "-s", "1f1b", "--pp", "2", "-m", "4", "--layer-costs", str(f), "--json"])
    b = _json(capsys, ["simulate", "-s", "1f1b", "--pp", "2", "-m", "4", "--layer-costs", str(f), "--balance",
                       "--json"])
    assert b["makespan"] < a["makespan"]
    out = tmp_path / "s.json"
    assert main(["plan", "-s", "interleaved", "--pp", "2", "--vpp", "2", "-m", "3", "--layers-per-device", "5,3",
                 "--out", str(out)]) == 0
    assert json.loads(out.read_text())["vpp"] == 2


def test_plan_names_the_layer_split_it_planned_for(capsys, tmp_path):
    """A plan made from a layer split is only right for stages built with that split (a torch CSV carries only
    the actions), so plan says which layers each chunk holds: in --json and, otherwise, on stderr. A head three
    layers long on 8 layers, V placement: balancing moves layers off the head's device (device 0 holds chunks 0
    and 3), so the split is not the uniform 2/2/2/2."""
    f = tmp_path / "c.csv"
    f.write_text("name,F,B,W,mem\n" + "".join(f"l{i},1,1,1,1\n" for i in range(8)) + "head,3,3,3,2\n")
    d = _json(capsys, ["plan", "-s", "zbv", "--pp", "2", "-m", "4", "--layer-costs", str(f), "--balance", "--json"])
    split = d["partition"]["seg_layer_num"]
    assert sum(split) == 8 and split != [2, 2, 2, 2]
    assert d["partition"]["how"].startswith("balanced")
    assert d["partition"]["layers_per_device"] == [split[0] + split[3], split[1] + split[2]]
    assert d["partition"]["layers_per_device"][0] < 4  # the head's device holds fewer layers
    out = tmp_path / "p.csv"
    assert main(["plan", "-s", "zbv", "--pp", "2", "-m", "4", "--layer-costs", str(f), "--balance", "--format",
                 "torch", "--out", str(out)]) == 0
    assert f"layers per global chunk ({d['partition']['how']}): {split}" in capsys.readouterr().out
    assert "partition" not in _json(capsys, ["plan", "-s", "zbv", "--pp", "2", "-m", "4", "--json"])
