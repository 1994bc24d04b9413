"""pipeloom simulate --plan FILE, and the peak-memory line of pipeloom show."""
import json

import pytest

from pipeloom import Costs, simulate
from pipeloom.cli import main
from pipeloom.core.costs import runtime_mem_model
from pipeloom.schedule import io as schedule_io
from pipeloom.schedule.planning import make_spec, plan

SIM_KEYS = {"schedule", "pp", "vpp", "microbatches", "makespan", "bubble", "stage_bubble", "peak_memory",
            "memory_limit", "valid", "violations", "lower_bound", "gap", "bound_limit"}


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(capsys, *argv):
    try:
        rc = main(list(argv))
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipeloom: error: "), err
    return lines[0]


@pytest.fixture
def saved(tmp_path):
    """A zbvpp plan saved as pipeloom JSON, pipeloom CSV and torch CSV, with the Schedule itself."""
    sched = plan("zbvpp", make_spec(pp=4, microbatches=6, vpp=2))
    paths = {}
    for name, fmt in (("p.json", "pipeloom"), ("p.csv", "pipeloom"), ("t.csv", "torch")):
        paths[name] = tmp_path / name
        schedule_io.save(sched, str(paths[name]), fmt)
    return sched, paths


@pytest.mark.parametrize("name", ["p.json", "p.csv", "t.csv"])
def test_plan_file_json_matches_the_simulator(capsys, saved, name):
    sched, paths = saved
    costs = "F=1,B=1.5,W=0.7,comm=0.2"
    rc, out, _ = run(capsys, "simulate", "--plan", str(paths[name]), "--costs", costs, "--json")
    assert rc == 0
    obj = json.loads(out)  # strict: one JSON object and nothing else
    assert set(obj) == SIM_KEYS
    assert (obj["pp"], obj["vpp"], obj["microbatches"]) == (4, 2, 6)
    assert obj["valid"] is True and obj["violations"] == []
    # zbvpp plans under its default limit 1p = 4 units; the file remembers it (a torch CSV beside it)
    assert obj["memory_limit"] == 4.0
    ref = simulate(sched, Costs.parse(costs))  # the schedule object, not the file
    assert obj["makespan"] == pytest.approx(ref.makespan)
    assert obj["peak_memory"] == pytest.approx(ref.peak_memory)


def test_plan_file_runtime_torch_and_limit(capsys, saved):
    sched, paths = saved
    f = str(paths["p.json"])
    peaks = simulate(sched, Costs(), runtime_mem_model("torch")).peak_memory
    rc, out, _ = run(capsys, "simulate", "--plan", f, "--runtime", "torch", "--mem-limit", "none", "--json")
    assert rc == 0 and json.loads(out)["peak_memory"] == pytest.approx(peaks)
    # without --mem-limit the file's own limit applies: planned at 1p (4 units) for pipeloom's runtime, it goes
    # over that under torch's, which frees nothing at B
    rc, out, _ = run(capsys, "simulate", "--plan", f, "--runtime", "torch", "--json")
    assert rc == 1 and json.loads(out)["memory_limit"] == 4.0 and max(peaks) > 4.0
    # under a limit below its torch peak the file is reported invalid (exit 1), with the memory violations
    rc, out, _ = run(capsys, "simulate", "--plan", f, "--runtime", "torch", "--mem-limit", str(max(peaks) - 0.5),
                     "--json")
    obj = json.loads(out)
    assert rc == 1 and obj["valid"] is False and obj["memory_limit"] == max(peaks) - 0.5
    assert obj["violations"] and all("exceeds the limit" in v for v in obj["violations"])
    assert obj["makespan"] is not None


def test_plan_file_with_missing_job_is_invalid_not_a_crash(capsys, tmp_path, saved):
    _, paths = saved
    doc = json.loads(paths["p.json"].read_text())
    broken = tmp_path / "broken.json"
    devs = doc["devices"]
    devs[0] = devs[0][:-1]  # drop the last job of device 0
    broken.write_text(json.dumps(doc))
    rc, out, _ = run(capsys, "simulate", "--plan", str(broken), "--json")
    obj = json.loads(out)
    assert rc == 1 and obj["valid"] is False and obj["makespan"] is None
    assert any("missing" in v for v in obj["violations"])


def test_plan_file_table(capsys, saved):
    _, paths = saved
    rc, out, _ = run(capsys, "simulate", "--plan", str(paths["p.csv"]))
    assert rc == 0 and "zbvpp" in out and "peak memory per device" in out


@pytest.mark.parametrize("extra,needle", [
    (["-s", "1f1b"], "not allowed with argument --plan"),
    (["--pp", "4"], "drop --pp"),
    (["-m", "6", "--vpp", "2"], "drop --microbatches, --vpp"),
    (["-O", "budget=3"], "drop -O"),
    (["--layers", "16"], "drop --layers"),
    (["--costs", "F=1:2"], "F has 2 per-chunk values but the pipeline has 8 chunks"),
    (["--mem-limit", "lots"], "memory limit 'lots'"),
])
def test_plan_file_bad_options_one_line_error(capsys, saved, extra, needle):
    _, paths = saved
    assert needle in one_line_error(capsys, "simulate", "--plan", str(paths["p.json"]), *extra)


def test_bad_plan_files_one_line_error(capsys, tmp_path):
    assert "cannot read" in one_line_error(capsys, "simulate", "--plan", str(tmp_path / "none.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert str(bad) in one_line_error(capsys, "simulate", "--plan", str(bad))
    csv = tmp_path / "bad.csv"
    csv.write_text("device,step,job\n0,0,Q1.0\n")
    assert str(csv) in one_line_error(capsys, "simulate", "--plan", str(csv))


def test_schedule_needs_shape_without_plan(capsys):
    line = one_line_error(capsys, "simulate", "--pp", "2")
    assert "--schedule" in line and "--microbatches" in line and "--plan FILE" in line


def test_show_header_has_peak_memory(capsys, saved):
    sched, paths = saved
    rc, out, _ = run(capsys, "show", str(paths["p.json"]), "--width", "40", "--runtime", "torch", "--mem-limit", "1p")
    assert rc == 0
    line = out.splitlines()[1]
    peaks = simulate(sched, Costs(), runtime_mem_model("torch")).peak_memory
    assert line.startswith("peak memory per device (units): ")
    assert [float(x) for x in line.split(":")[1].split("(")[0].split()] == pytest.approx(peaks, abs=5e-3)
    assert ("EXCEEDED" in line) == (max(peaks) > 4 + 1e-9)
