"""The command line's torch interop: plan --format torch, convert, -s torch:NAME, --runtime torch, compare --with-torch."""
import json

import pytest

from pipeloom.cli import main
from pipeloom.schedule import io as schedule_io

ts = pytest.importorskip("torch.distributed.pipelining.schedules")


def _run(capsys, argv):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_plan_for_torch_writes_a_file_torchs_loader_accepts(tmp_path, capsys):
    out = tmp_path / "zbv.csv"
    rc, printed, err = _run(capsys, ["plan", "-s", "zbv", "--pp", "2", "-m", "8", "--mem-limit", "1p", "--format",
                                     "torch", "--out", str(out)])
    assert rc == 0 and "wrote" in printed
    rows = [line.split(",") for line in out.read_text().splitlines()]
    actions = {r: [ts._Action.from_str(c) for c in row] for r, row in enumerate(rows)}
    assert ts._validate_schedule(actions, 2, 4, 8) == {0: 0, 1: 1, 2: 1, 3: 0}


def test_format_torch_plans_with_torchs_memory_model(tmp_path, capsys):
    """zbv at 1p planned for torch keeps the limit as torch counts it (B frees nothing); planned with pipeloom's
    default model it does not."""
    from pipeloom.core.costs import runtime_mem_model
    from pipeloom.sim.simulate import memory_profile

    peaks = {}
    for name, extra in (("torch", ["--format", "torch"]), ("runtime", ["--runtime", "torch"]), ("default", [])):
        out = tmp_path / f"{name}.csv"
        assert _run(capsys, ["plan", "-s", "zbv", "--pp", "2", "-m", "8", "--mem-limit", "1p", "--out", str(out),
                             *extra])[0] == 0
        peaks[name] = memory_profile(schedule_io.load(str(out)), runtime_mem_model("torch"))[0]
    assert max(peaks["torch"]) <= 2 and max(peaks["runtime"]) <= 2
    assert max(peaks["default"]) > 2


def test_convert_round_trip(tmp_path, capsys):
    a, b, c = tmp_path / "a.json", tmp_path / "t.csv", tmp_path / "b.json"
    assert _run(capsys, ["plan", "-s", "interleaved", "--pp", "2", "-m", "5", "--out", str(a)])[0] == 0
    assert _run(capsys, ["convert", str(a), str(b), "--to", "torch"])[0] == 0
    assert _run(capsys, ["convert", str(b), str(c), "--to", "pipeloom"])[0] == 0
    assert schedule_io.load(str(c)).devices == schedule_io.load(str(a)).devices


@pytest.mark.parametrize("argv, msg", [
    (["convert", "IN", "x.json", "--to", "torch"], "must end in .csv (a torch schedule is a CSV file)"),
    (["plan", "-s", "zbv", "--pp", "2", "-m", "4", "--format", "torch"], "--format torch writes a file"),
    (["simulate", "-s", "torch:Nope", "--pp", "2", "-m", "4"], "unknown torch schedule 'Nope'"),
    (["simulate", "-s", "zbv", "--pp", "2", "-m", "4", "--runtime", "torch", "--mem", "b=0.2"],
     "torch's runtime frees nothing at its I (B) step"),
])
def test_one_line_errors(argv, msg, capsys):
    rc, _, err = _run(capsys, argv)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1


def test_torchs_schedules_by_name_and_in_compare(capsys):
    rc, js, _ = _run(capsys, ["simulate", "-s", "torch:ZBVZeroBubble", "--pp", "4", "-m", "8", "--json"])
    r = json.loads(js)
    assert rc == 0 and r["valid"] and r["vpp"] == 2 and r["schedule"] == "torch:ZBVZeroBubble"
    rc, js, _ = _run(capsys, ["compare", "--pp", "4", "-m", "8", "--with-torch", "--json"])
    names = {row["schedule"] for row in json.loads(js)["rows"]}
    assert {"torch:GPipe", "torch:1F1B", "torch:ZBVZeroBubble", "torch:DualPipeV", "zbv"} <= names
