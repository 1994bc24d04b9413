"""CLI contract: JSON keys, files, and one-line errors with exit code 2 (never a traceback)."""
import json
import subprocess
import sys

import pytest

from pipeloom import make_spec, plan
from pipeloom.cli import main

SIM_KEYS = {"schedule", "pp", "vpp", "microbatches", "makespan", "bubble", "stage_bubble", "peak_memory",
            "memory_limit", "valid", "violations", "lower_bound", "gap", "bound_limit"}


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
    rc, out, err = run(capsys, "plan", "-s", "1f1b", "--pp", "3", "-m", "5", "--out", str(f))
    assert rc == 0 and f.exists() and out.startswith(f"wrote {f}") and err == ""
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
    # duplicated keys: the last one used to win silently
    (["simulate", "-s", "1f1b", "--pp", "2", "-m", "4", "--costs", "F=1,F=2"], "cost F is given twice"),
    (["simulate", "-s", "1f1b", "--pp", "2", "-m", "4", "--mem", "a=1,a=2"], "memory a is given twice"),
    (["simulate", "-s", "1f1b", "--pp", "2", "-m", "4", "--costs", "F=0,B=0,W=0"], "F, B and W are all 0"),
    # nan / -inf limits used to mean "unlimited"
    (["simulate", "-s", "1f1b", "--pp", "2", "-m", "4", "--mem-limit", "nan"], "memory limit 'nan' is not a number"),
    (["simulate", "-s", "1f1b", "--pp", "2", "-m", "4", "--mem-limit=-inf"], "memory limit must be > 0"),
    (["memory", "--model", "llama2-7b", "--pp", "4", "-m", "8", "--mem-limit", "nan"], "memory limit 'nan'"),
    # -O: every builder rejects keys it does not read (they used to be ignored), values are checked
    (["simulate", "-s", "1f1b", "--pp", "2", "-m", "4", "-O", "time_limit=5"],
     "1f1b: unknown option(s) time_limit; allowed: none"),
    (["simulate", "-s", "interleaved", "--pp", "2", "-m", "4", "-O", "remainer=last"],
     "interleaved: unknown option(s) remainer; allowed: remainder"),
    (["simulate", "-s", "zbv", "--pp", "2", "-m", "4", "-O", "budjet=5"], "allowed: budget, effort, insert_budget, polish"),
    (["simulate", "-s", "zbh1", "--pp", "2", "-m", "4", "-O", "budget=[1]"], "zbh1: option budget must be a whole"),
    (["simulate", "-s", "zbh2", "--pp", "2", "-m", "4", "-O", "budget=-5"], "zbh2: option budget must be a whole"),
    (["simulate", "-s", "dualpipev", "--pp", "2", "-m", "4", "-O", "overlap_pairs=maybe"],
     "overlap_pairs must be true or false"),
    (["simulate", "-s", "optimal", "--pp", "2", "-m", "2", "-O", "start_from=3"], "start_from must hold Schedules"),
    (["simulate", "-s", "optimal", "--pp", "2", "-m", "2", "-O", "hints=3"], "hints must be true or false"),
    (["compare", "--pp", "2", "-m", "4", "-O", "time_limit=5"], "only by optimal, not compared here"),
    # partition cost options without a partition used to be ignored
    (["simulate", "-s", "1f1b", "--pp", "2", "-m", "4", "--vocab", "1000", "--hidden", "64"],
     "--vocab, --hidden: only used to cost the layers of a layer partition"),
    (["partition", "--pp", "2", "--layers", "8", "--seq", "100"], "--seq only refines the head cost"),
    # non-finite numbers passed number_type
    (["check", ".", "--straggler-threshold", "nan"], "--straggler-threshold: 'nan' is not a number (must be finite)"),
    (["check", ".", "--top", "-1"], "--top: must be >= 0"),
    (["show", "x.json", "--width", "3"], "--width: must be >= 20 columns"),
    (["run", "--lr", "nan"], "--lr: 'nan' is not a learning rate"),
    (["run", "--timeout", "inf"], "--timeout: must be a finite number > 0"),
    (["run", "--inject-delay", "0:inf"], "SECONDS a finite number >= 0"),
    # memory sizes that leave nothing for the model
    (["memory", "--model", "llama2-7b", "--pp", "4", "-m", "8", "--gpu-memory", "0"], "--gpu-memory '0': must be more"),
    (["memory", "--model", "llama2-7b", "--pp", "4", "-m", "8", "--gpu-memory", "80GiB", "--reserve", "100GiB"],
     "--reserve 100GiB is not below --gpu-memory 80GiB"),
    # unknown options name the subcommand's help, not the top-level one
    (["partition", "--pp", "2", "--layers", "8", "-O", "x=1"], "partition: unrecognized arguments: -O x=1 "
                                                               "(see 'pipeloom partition --help')"),
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


def _one_line_error(capsys, *argv) -> str:
    try:
        rc = main(list(argv))
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("pipeloom: error:") and "Traceback" not in err, err
    return lines[0]


GOOD_PLAN = {"pp": 2, "devices": [["F0.0", "BW0.0"], ["F0.1", "BW0.1"]]}


@pytest.mark.parametrize("doc,needle", [
    ({**GOOD_PLAN, "pp": [1]}, "pp must be an integer >= 1, got [1]"),  # TypeError traceback before
    ({**GOOD_PLAN, "pp": 3}, "has 2 device lists but pp=3"),  # IndexError traceback before
    ({**GOOD_PLAN, "pp": 0}, "pp must be an integer >= 1"),  # ZeroDivisionError traceback before
    ({**GOOD_PLAN, "pp": 1e400}, "pp must be an integer >= 1"),  # OverflowError traceback before
    ({**GOOD_PLAN, "meta": [1, 2]}, "meta must be an object"),
    ({**GOOD_PLAN, "overlapped": [1]}, "overlapped must be a list of [device, index] pairs"),
    ({**GOOD_PLAN, "overlapped": [[5, 9]]}, "overlapped pair (5, 9) does not name two consecutive jobs"),
    ({**GOOD_PLAN, "placement": "bogus"}, "placement must be one of interleaved, v"),
    ({"devices": 5}, "'devices' must be a list with one list of jobs per device"),
    # drawn as if fine before: a missing backward, a duplicate, a job on the wrong device, missing microbatches
    ({"devices": [["F0.0"], ["F0.1", "BW0.1"]]}, "B0.0 is missing (device 0)"),
    ({"devices": [["F0.0", "F0.0", "BW0.0"], ["F0.1", "BW0.1"]]}, "F0.0 appears 2 times"),
    ({"devices": [["F0.1", "BW0.1"], ["F0.0", "BW0.0"]]}, "F0.1 belongs on device 1"),
    ({**GOOD_PLAN, "microbatches": 5}, "F1.0 is missing"),
])
def test_show_rejects_invalid_plan_files(tmp_path, capsys, doc, needle):
    f = tmp_path / "p.json"
    f.write_text(json.dumps(doc))
    line = _one_line_error(capsys, "show", str(f))
    assert needle in line and str(f) in line


def test_plan_files_that_are_not_text_name_the_file(tmp_path, capsys):
    f = tmp_path / "p.json"
    f.write_bytes(b"\x7fELF\x02\x01\x01\x00\xf0\xff\xfe" * 8)
    assert f"cannot read {f}: not a text file" in _one_line_error(capsys, "show", str(f))
    g = tmp_path / "p.csv"
    g.write_text("# pipeloom schedule pp=abc\ndevice,step,job\n0,0,F0.0\n")
    assert f"{g}: CSV header: pp must be an integer >= 1, got 'abc'" in _one_line_error(capsys, "show", str(g))


def test_output_names_are_checked_before_any_work(tmp_path, capsys):
    """A bad output name fails before planning, and before any other output is written."""
    blocker = tmp_path / "afile"
    blocker.write_text("")
    line = _one_line_error(capsys, "plan", "-s", "1f1b", "--pp", "2", "-m", "2", "--out", str(blocker / "x.json"))
    assert f"{blocker} is a file, not a directory" in line
    (tmp_path / "d.json").mkdir()
    assert "is a directory" in _one_line_error(capsys, "plan", "-s", "1f1b", "--pp", "2", "-m", "2",
                                               "--out", str(tmp_path / "d.json"))
    assert "--out '': the name must end in .csv or .json" in _one_line_error(
        capsys, "plan", "-s", "1f1b", "--pp", "2", "-m", "2", "--out", "")
    sched = tmp_path / "s.json"
    assert main(["plan", "-s", "1f1b", "--pp", "2", "-m", "2", "--out", str(tmp_path / "new" / "s.json")]) == 0
    assert main(["plan", "-s", "1f1b", "--pp", "2", "-m", "2", "--out", str(sched)]) == 0
    capsys.readouterr()
    png = tmp_path / "g.png"
    line = _one_line_error(capsys, "show", str(sched), "--out", str(png), "--out", str(tmp_path / "g.txt"))
    assert "--out" in line and "g.txt" in line and not png.exists()


def _two_runs(tmp_path):
    from pipeloom.trace.synth import SynthConfig, write_logs

    a, b = tmp_path / "a", tmp_path / "b"
    write_logs(str(a), plan("1f1b", make_spec(pp=2, microbatches=4)), SynthConfig())
    write_logs(str(b), plan("zbh1", make_spec(pp=2, microbatches=4)), SynthConfig())
    return a, b


@pytest.mark.parametrize("cmd", ["trace", "check"])
def test_trace_and_check_refuse_logs_of_different_runs(tmp_path, capsys, cmd):
    import shutil

    a, b = _two_runs(tmp_path)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(a / "workerlog.0", mixed)
    shutil.copy(b / "workerlog.1", mixed)
    extra = ["--out", str(tmp_path / "t.json")] if cmd == "trace" else []
    line = _one_line_error(capsys, cmd, str(mixed), *extra)
    assert "mixes the logs of different runs" in line and "1f1b" in line and "zbh1" in line
    twice = tmp_path / "twice"
    for k in (0, 1):
        shutil.copytree(a, twice / f"machine{k}")
    assert "two logs of rank 0" in _one_line_error(capsys, cmd, str(twice), *extra)
    assert main([cmd, str(a), *extra]) == 0  # one run is fine
    # two runs of the same shape: only the run id tells them apart
    from pipeloom.trace.synth import SynthConfig, write_logs

    c = tmp_path / "c"
    write_logs(str(c), plan("1f1b", make_spec(pp=2, microbatches=4)), SynthConfig(run_id="other", seed=1))
    same = tmp_path / "same"
    same.mkdir()
    shutil.copy(a / "workerlog.0", same)
    shutil.copy(c / "workerlog.1", same)
    line = _one_line_error(capsys, cmd, str(same), *extra)
    assert "different runs of the same shape" in line and "run other" in line


@pytest.mark.parametrize("argv,needle", [
    (["--plan", "{plan}", "--pp", "4"], "--plan {plan} fixes the schedule, pp, vpp and microbatches; drop --pp"),
    (["--plan", "{plan}", "-s", "zbv", "-m", "3"], "drop --schedule, --microbatches"),
    (["--log-dir", "{file}"], "--log-dir {file}: is a file"),
    (["--profile-steps", "1:2"], "needs --log-dir DIR"),
    (["--steps", "2", "--profile-steps", "5:9", "--log-dir", "{dir}"], "starts after the last step"),
    (["--dim", "12"], "--dim 12: the example model needs a multiple of 8"),
])
def test_run_options_are_checked_before_processes_start(tmp_path, capsys, argv, needle):
    """These used to be ignored (--plan with --pp), or to fail inside every spawned rank (--log-dir FILE)."""
    f = tmp_path / "f"
    f.write_text("")
    p = tmp_path / "p.json"
    p.write_text(json.dumps(GOOD_PLAN))
    sub = {"{plan}": str(p), "{file}": str(f), "{dir}": str(tmp_path / "logs")}
    argv = [sub.get(a, a) for a in argv]
    for k, v in sub.items():
        needle = needle.replace(k, v)
    assert needle in _one_line_error(capsys, "run", *argv)
    assert not (tmp_path / "logs").exists()


def test_compare_gives_each_schedule_only_its_own_options(capsys):
    """-O time_limit is optimal's: the other schedules must still run (dualpipev was dropped before)."""
    rc, out, _ = run(capsys, "compare", "--pp", "2", "-m", "4", "-O", "time_limit=5", "--schedules",
                     "optimal,dualpipev,1f1b", "--json")
    rows = json.loads(out)["rows"]
    assert rc == 0 and {r["schedule"] for r in rows if "error" not in r} == {"optimal", "dualpipev", "1f1b"}, rows


def test_simulate_prints_its_costs_and_convention(capsys):
    """The same ZB-V plan was 51 in simulate and 25.5 in compare with nothing saying why."""
    rc, out, _ = run(capsys, "simulate", "-s", "zbv", "--pp", "4", "-m", "8", "--mem-limit", "1p",
                     "--costs", "F=1,B=2,W=1,comm=0")
    assert rc == 0
    assert "costs per chunk pass" in out and "F=1,B=2,W=1,comm=0" in out
    assert "--costs-per stage" in " ".join(out.split())  # the way to compare's numbers is named


def test_simulate_costs_per_stage_agrees_with_compare(capsys):
    base = ["--pp", "4", "-m", "8", "--mem-limit", "1p", "--costs", "F=1,B=1,W=1,comm=0.5"]
    _, out, _ = run(capsys, "compare", *base, "--schedules", "zbv,1f1b", "--json")
    by_name = {r["schedule"]: r["makespan"] for r in json.loads(out)["rows"]}
    _, out, _ = run(capsys, "simulate", "-s", "zbv", *base, "--costs-per", "stage", "--json")
    assert json.loads(out)["makespan"] == by_name["zbv"]
    _, out, _ = run(capsys, "simulate", "-s", "zbv", *base, "--json")  # per chunk: the full F/B/W per chunk
    assert json.loads(out)["makespan"] > 1.5 * by_name["zbv"]
    _, out, _ = run(capsys, "simulate", "-s", "1f1b", *base, "--costs-per", "stage", "--json")
    assert json.loads(out)["makespan"] == by_name["1f1b"]  # vpp 1: the conventions are the same


def test_messages_arrive_in_the_order_of_the_commands(tmp_path):
    """plan's 'wrote ...' went to stderr: in a log of stdout (or a notebook cell showing stdout first) it came
    after the next command's output. Both commands' lines now share stdout, in order."""
    f = tmp_path / "s.json"
    py = f"{sys.executable} -m pipeloom"
    script = (f"{py} plan -s 1f1b --pp 2 -m 4 --layers 6 -o {f}; {py} convert {f} {tmp_path / 't.csv'} --to torch; "
              f"{py} show {f} --width 60")
    r = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    lines = r.stdout.splitlines()
    wrote = next(i for i, x in enumerate(lines) if x.startswith(f"wrote {f}"))
    layers = next(i for i, x in enumerate(lines) if x.startswith("layers per global chunk"))
    converted = next(i for i, x in enumerate(lines) if x.startswith(f"wrote {tmp_path / 't.csv'}"))
    drawn = next(i for i, x in enumerate(lines) if x.startswith("d0"))
    assert wrote < layers < converted < drawn


def _fake_tune_result(n_cfg: int = 3):
    """A tune result as the table reads it, with the widest values a large run gives."""
    from types import SimpleNamespace as NS

    gpu = NS(name="h100-sxm5-80gb", memory=80 * 2 ** 30)
    prob = NS(model=NS(name="meta-llama/Llama-3.1-405B-Instruct"), gpus=16384, gpu=gpu, global_batch=16384,
              seq=131072, calibration=NS(efficiency=0.4375), top=n_cfg, reserve=2 * 2 ** 30)
    cfg = NS(fits=True, tp=8, pp=128, vpp=16, dp=16, microbatch_size=128, microbatches=1024,
             schedule="interleaved", mem_limit=1234.56, recompute="selective", zero=1, partition="balanced",
             tokens_per_s=123456789012.0, mfu=0.291234, step_time_s=12345.678, bubble=0.123, exposed_comm_s=1234.5,
             peak_bytes=71.25 * 2 ** 30)
    return NS(problem=prob, configs=[cfg] * n_cfg, searched=123456789, simulations=1234567, cache_hits=7654321,
              seconds=1234.5, pruned={"bound: step-time lower bound above the top results": 123456789,
                                      "memory: weights + optimizer + one microbatch over the GPU": 7},
              best=NS(pp=1, seg_layer_num=(126,), to_dict=lambda: {"megatron_layout": None}), explain={})


def test_tune_table_never_cuts_numbers_in_a_pipe(capsys, monkeypatch):
    """Not on a terminal rich lays tables out in 80 (here 160) columns: the MFU column was cut to '29.…'."""
    from pipeloom.cli.tune_cmd import _print

    monkeypatch.setenv("COLUMNS", "80")
    _print(_fake_tune_result(), explain=False, written=[])
    out = capsys.readouterr().out
    assert "…" not in out
    for cell in ("29.1%", "123,456,789,012", "12345.678", "1.23e+03", "selective", "interleaved", "123456789"):
        assert cell in out, cell
    row = next(line for line in out.splitlines() if "29.1%" in line)
    assert "123,456,789,012" in row and "12345.678" in row  # one row, one line


@pytest.mark.parametrize("argv", [
    ["compare", "--pp", "4", "-m", "8", "--mem-limit", "1p", "--schedules", "zbv,1f1b", "--dp", "4",
     "--param-bytes", "1GB"],
    ["simulate", "-s", "zbv", "--pp", "4", "-m", "8", "--costs", "F=1.123456,B=2.234567,W=1.345678,comm=0.123456"],
    ["partition", "--layers", "32", "--pp", "4", "--vocab", "128256", "--hidden", "4096", "--seq", "4096"],
])
def test_tables_never_cut_numbers_in_a_narrow_pipe(capsys, monkeypatch, argv):
    """compare with --dp printed '5.…' for a 5.9% bubble in 80 columns (not a terminal)."""
    monkeypatch.setenv("COLUMNS", "60")
    rc, out, _ = run(capsys, *argv)
    table = [line for line in out.splitlines() if line.startswith(("│", "┃"))]
    assert rc == 0 and table and not any("…" in line for line in table), "\n".join(table)


def test_a_command_parses_the_same_with_only_its_own_parser_built():
    """main builds only the parser of the command it runs: each command's help and parsed arguments are the
    same as with all eleven built, and a word that is no command still gets the whole list."""
    from pipeloom.cli import COMMANDS, _command_of, build_parser

    whole = build_parser()
    for name in COMMANDS:
        alone = build_parser(name)
        assert list(alone._subparsers._group_actions[0].choices) == [name]
        assert alone._subparsers._group_actions[0].choices[name].format_help() == \
            whole._subparsers._group_actions[0].choices[name].format_help()
    argv = ["plan", "-s", "zbv", "--pp", "4", "-m", "8", "--mem-limit", "0.75p"]
    one, every = vars(build_parser("plan").parse_args(argv)), vars(whole.parse_args(argv))
    one.pop("_subparsers"), every.pop("_subparsers")
    assert one == every and one["schedule"] == "zbv"
    assert _command_of(["--debug", "--progress", "tune", "--model", "x"]) == "tune"
    assert _command_of(["--help"]) is None and _command_of(["plna", "plan"]) is None
