"""CLI contract: JSON keys, files, and one-line errors with exit code 2 (never a traceback)."""
import json
import subprocess
import sys

import pytest

from pipeloom.cli import main

SIM_KEYS = {"schedule", "pp", "vpp", "microbatches", "makespan", "bubble", "stage_bubble", "peak_memory",
            "memory_limit", "valid", "violations"}


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_simulate_json_contract(capsys):
    rc, out, _ = run(capsys, "simulate", "--schedule", "1f1b", "--pp", "4", "--microbatches", "8", "--json")
    assert rc == 0
    obj = json.loads(out)
    assert set(obj) == SIM_KEYS
    assert obj["valid"] is True and obj["violations"] == [] and obj["memory_limit"] is None
    assert obj["bubble"] == pytest.approx(3 / 11)
    assert len(obj["peak_memory"]) == 4


def test_simulate_json_with_limit_reports_violation(capsys):
    rc, out, _ = run(capsys, "simulate", "-s", "fthenb", "--pp", "2", "-m", "4", "--mem-limit", "1p", "--json")
    obj = json.loads(out)
    assert rc == 1 and obj["valid"] is False and obj["memory_limit"] == 2
    assert any("exceeds the limit" in v for v in obj["violations"])


def test_simulate_table(capsys):
    rc, out, _ = run(capsys, "simulate", "-s", "interleaved", "--pp", "4", "-m", "6", "--vpp", "2")
    assert rc == 0 and "makespan" in out and "stage bubble" in out


@pytest.mark.parametrize("ext", ["csv", "json"])
def test_plan_then_show(tmp_path, capsys, ext):
    f = tmp_path / f"s.{ext}"
    rc, _, err = run(capsys, "plan", "-s", "1f1b", "--pp", "3", "-m", "5", "--out", str(f))
    assert rc == 0 and f.exists() and "wrote" in err
    rc, out, _ = run(capsys, "show", str(f))
    assert rc == 0
    rows = [line for line in out.splitlines() if line.startswith("d")]
    assert len(rows) >= 3


def test_compare_json(capsys):
    rc, out, _ = run(capsys, "compare", "--pp", "4", "-m", "8", "--json")
    rows = json.loads(out)["rows"]
    ok = [r for r in rows if "error" not in r]
    names = {r["schedule"] for r in ok}
    assert {"1f1b", "fthenb", "interleaved"} <= names
    spans = [r["makespan"] for r in ok]
    assert spans == sorted(spans)


@pytest.mark.parametrize("argv,needle", [
    (["simulate", "-s", "1f1b", "--pp", "0", "-m", "4"], "--pp"),
    (["simulate", "-s", "1f1b", "--pp", "2", "-m", "0"], "--microbatches"),
    (["simulate", "-s", "nope", "--pp", "2", "-m", "4"], "unknown schedule 'nope'"),
    (["simulate", "-s", "1f1b", "--pp", "2", "-m", "4", "--mem-limit", "lots"], "memory limit 'lots'"),
    (["simulate", "-s", "1f1b", "--pp", "2", "-m", "4", "--mem-limit", "0.2"], "no schedule can meet"),
    (["plan", "-s", "1f1b", "--pp", "2", "-m", "4", "--mem-limit", "1"], "needs more memory"),
    (["simulate", "-s", "1f1b", "--pp", "2", "-m", "4", "--costs", "F=-2"], "cost F"),
    (["simulate", "-s", "1f1b", "--pp", "2", "-m", "4", "--vpp", "2"], "takes vpp 1"),
    (["plan", "-s", "1f1b", "--pp", "2", "-m", "4", "--out", "x.txt"], ".csv or .json"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, needle):
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse-level errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("pipeloom: error:") and needle in lines[0], err
    assert "Traceback" not in err


def test_malformed_csv_is_one_line_error(tmp_path, capsys):
    f = tmp_path / "bad.csv"
    f.write_text("device,step,job\n0,0,Z9\n")
    rc, _, err = run(capsys, "show", str(f))
    assert rc == 2 and "CSV line 2" in err and "Traceback" not in err


def test_console_script_help_and_error():
    r = subprocess.run([sys.executable, "-m", "pipeloom", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "simulate" in r.stdout
    r = subprocess.run([sys.executable, "-m", "pipeloom", "simulate", "-s", "zzz", "--pp", "2", "-m", "2"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_compare_models_one_network_across_vpp(capsys):
    """--costs are per full-stage pass: every schedule, whatever its vpp, does the same total work."""
    rc, out, _ = run(capsys, "compare", "--pp", "4", "-m", "8", "--costs", "F=2,B=3,W=1,comm=0", "--json")
    rows = [r for r in json.loads(out)["rows"] if "error" not in r]
    assert {r["vpp"] for r in rows} == {1, 2}
    for r in rows:
        busy = r["makespan"] * (1 - r["bubble"]) * r["pp"]
        assert busy == pytest.approx(4 * 8 * (2 + 3 + 1)), r["schedule"]


def test_core_and_cli_import_without_torch():
    """The core (schedule, sim, partition, analytic memory, viz) and the CLI parser never import torch."""
    code = ("import sys, pipeloom, pipeloom.partition, pipeloom.viz, pipeloom.memory.analytic, pipeloom.cli\n"
            "from pipeloom.schedule import registry\nregistry.names(); pipeloom.cli.build_parser()\n"
            "print(sorted(m for m in ('torch', 'ortools', 'matplotlib') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def test_compare_names_the_vpp_of_each_schedule_that_does_not_apply(capsys):
    """interleaved runs at vpp 1 within 1p but not at vpp 2: the skipped row must say which vpp failed."""
    rc, out, _ = run(capsys, "compare", "--pp", "4", "-m", "8", "--mem-limit", "1p", "--json")
    rows = json.loads(out)["rows"]
    skipped = {(r["schedule"], r["vpp"]) for r in rows if "error" in r}
    ran = {(r["schedule"], r["vpp"]) for r in rows if "error" not in r}
    assert ("interleaved", 2) in skipped and ("interleaved", 1) in ran
    rc, out, _ = run(capsys, "compare", "--pp", "4", "-m", "8", "--mem-limit", "1p")
    assert "interleaved (vpp 2):" in out


@pytest.mark.parametrize("schedule,vpp", [("interleaved", 2), ("1f1b", 1), ("zbv", 2), ("optimal", 1)])
def test_default_vpp_per_schedule(capsys, schedule, vpp):
    """Without --vpp each schedule gets its own default: interleaved 2 (at vpp 1 it would be plain 1F1B),
    V-shapes 2, the rest 1; an explicit --vpp wins."""
    rc, out, _ = run(capsys, "simulate", "-s", schedule, "--pp", "2", "-m", "4", "--json")
    assert rc == 0 and json.loads(out)["vpp"] == vpp
    if schedule == "interleaved":
        rc, out, _ = run(capsys, "simulate", "-s", schedule, "--pp", "2", "-m", "4", "--vpp", "3", "--json")
        assert rc == 0 and json.loads(out)["vpp"] == 3
        one_f_one_b = json.loads(run(capsys, "simulate", "-s", "1f1b", "--pp", "2", "-m", "4", "--json")[1])
        assert json.loads(out)["bubble"] < one_f_one_b["bubble"]
