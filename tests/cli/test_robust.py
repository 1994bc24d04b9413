"""Never silently wrong (issue 21): false success, strict JSON, last-resort errors, --debug.

Each test here failed before its fix: a BrokenPipeError that is not stdout's returned 0, a NaN
went out as ``NaN`` in --json, an unforeseen exception printed a traceback.
"""
import json
import os
import subprocess
import sys

import pytest

from pipeloom.cli import INTERNAL_ERROR, main

PY = sys.executable
SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def run(capsys, *argv):
    try:
        rc = main(list(argv))
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def one_error_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("pipeloom: error: "), err
    assert "Traceback" not in err
    return lines[0]


def env():
    return dict(os.environ, PYTHONPATH=os.path.abspath(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))


# ---------------------------------------------------------------------- 1. false success
def test_broken_pipe_not_on_stdout_is_an_error(capsys, monkeypatch):
    """A pipe to something else (a worker, a tracker) that breaks is a failure, not `| head`."""
    from pipeloom.cli import simulate_cmd

    def write_to_dead_pipe(args):
        r, w = os.pipe()
        os.close(r)
        try:
            os.write(w, b"x")  # EPIPE: the reader is gone (Python ignores SIGPIPE)
        finally:
            os.close(w)

    monkeypatch.setattr(simulate_cmd, "run", write_to_dead_pipe)
    rc, _, err = run(capsys, "simulate", "-s", "1f1b", "--pp", "2", "-m", "2")
    assert rc == 2
    assert "pipe closed unexpectedly" in one_error_line(err) and "write_to_dead_pipe" in err


def test_stdout_closed_by_head_is_success():
    """`pipeloom plan ... | head -1`: exit 0, no traceback, no 'Exception ignored' at exit."""
    p = subprocess.Popen([PY, "-m", "pipeloom", "plan", "-s", "1f1b", "--pp", "8", "-m", "4000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    first = p.stdout.readline()
    p.stdout.close()  # as head does after its line
    err = p.stderr.read().decode()
    rc = p.wait(timeout=120)
    assert first.startswith(b"d0:")
    assert rc == 0, err
    assert err == ""


@pytest.mark.dist
def test_run_whose_ranks_cannot_start_fails(tmp_path):
    """Ranks whose interpreter exits at once (as a broken or non-executable one does): non-zero, one line."""
    # the resource tracker starts first with the real interpreter: only the ranks get the broken one
    code = ("import multiprocessing, sys; from multiprocessing import resource_tracker;"
            "resource_tracker.ensure_running(); multiprocessing.set_executable('/bin/false');"
            "from pipeloom.cli import main; sys.exit(main(['run', '--pp', '2', '-m', '2', '--steps', '1',"
            "'--timeout', '20']))")
    p = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env(), timeout=120)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "rank" in one_error_line(p.stderr)
    assert p.stdout == ""


# ---------------------------------------------------------------------- 2. strict JSON
def test_print_json_refuses_non_finite(capsys):
    from pipeloom.cli.common import print_json

    with pytest.raises(ValueError, match=r"not finite at peak_memory\[1\]"):
        print_json({"makespan": 1.0, "peak_memory": [1.0, float("inf")]})
    assert capsys.readouterr().out == ""


def test_json_output_is_strict_for_extreme_costs(capsys, monkeypatch):
    """A result that is not finite (here forced: an evaluate whose makespan overflowed) is refused."""
    from pipeloom.cli import simulate_cmd
    real = simulate_cmd.evaluate

    def overflowing(sched, spec):
        res = real(sched, spec)
        res["makespan"] = res["makespan"] * 1e308 * 10
        return res

    monkeypatch.setattr(simulate_cmd, "evaluate", overflowing)
    rc, out, err = run(capsys, "simulate", "-s", "1f1b", "--pp", "2", "-m", "2", "--json")
    assert rc == 2 and out == ""
    assert "not finite at makespan" in one_error_line(err)


# ---------------------------------------------------------------------- 7. last resort, --debug
def _boom(args):
    return {}["missing"]


def test_unforeseen_error_is_one_line_and_asks_for_a_report(capsys, monkeypatch):
    from pipeloom.cli import simulate_cmd

    monkeypatch.setattr(simulate_cmd, "run", _boom)
    rc, out, err = run(capsys, "simulate", "-s", "1f1b", "--pp", "2", "-m", "2")
    assert rc == INTERNAL_ERROR and out == ""
    line = one_error_line(err)
    assert "KeyError" in line and "please report" in line and "--debug" in line


def test_debug_shows_the_traceback(capsys, monkeypatch):
    from pipeloom.cli import simulate_cmd

    monkeypatch.setattr(simulate_cmd, "run", _boom)
    with pytest.raises(KeyError):
        main(["--debug", "simulate", "-s", "1f1b", "--pp", "2", "-m", "2"])


def test_memory_and_recursion_errors_are_one_line(capsys, monkeypatch):
    from pipeloom.cli import simulate_cmd

    for exc in (MemoryError, RecursionError):
        def raiser(args, exc=exc):
            raise exc()
        monkeypatch.setattr(simulate_cmd, "run", raiser)
        rc, _, err = run(capsys, "simulate", "-s", "1f1b", "--pp", "2", "-m", "2")
        assert rc == 2
        one_error_line(err)


# ---------------------------------------------------------------------- 3. layer-cost files
LC_CASES = [
    ("dup_head.csv", "name,F,B,W,mem\nl0,1,1,1,1\nl1,1,1,1,1\nhead,2,2,2,1\nhead,9,9,9,1\n",
     "row 5: a second row named 'head'"),
    ("dup_layer.csv", "name,F,B,W\nl0,1,1,1\nl1,1,1,1\nl1,2,2,2\n", "row 4: a second row named 'l1'"),
    ("dup_col.csv", "name,F,F\nl0,1,1\nl1,1,1\n", "column 'f' twice"),
    ("dup_key.json", '{"layers": [{"F": 1}, {"F": 1}], "head": {"F": 1}, "head": {"F": 2}}', "'head' is given twice"),
    ("zero.csv", "name,F,B,W\nl0,0,0,0\nl1,0,0,0\n", "F, B and W are 0 for every layer"),
    ("zero.json", '{"layers": {"count": 4, "F": 0, "B": 0, "W": 0}}', "F, B and W are 0 for every layer"),
    ("mem0.csv", "name,F,B,W,mem\nl0,1,1,1,0\nl1,1,1,1,0\n", "mem is 0 for every layer"),
    ("mem0.json", '{"layers": {"count": 4, "F": 1, "mem": 0}}', "mem is 0 for every layer"),
    ("count.json", '{"layers": {"count": 100000000, "F": 1}}', "above the cap of 1,000,000"),
    ("binary.csv", b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 50, "not a text file"),
    ("deep.json", '{"layers": ' + "[" * 100000 + "]" * 100000 + "}", "nested too deeply"),
    ("bigfield.csv", "name,F\n" + "x" * 200_000 + ",1\n", "not a readable CSV"),
]


@pytest.mark.parametrize("name,text,expect", LC_CASES, ids=[c[0] for c in LC_CASES])
@pytest.mark.parametrize("cmd", ["partition", "simulate"])
def test_layer_cost_file_errors(tmp_path, capsys, name, text, expect, cmd):
    f = tmp_path / name
    (f.write_bytes if isinstance(text, bytes) else f.write_text)(text)
    argv = ["partition", "--pp", "2"] if cmd == "partition" else ["simulate", "-s", "1f1b", "--pp", "2", "-m", "4"]
    rc, out, err = run(capsys, *argv, "--layer-costs", str(f), "--json")
    assert rc == 2 and out == ""
    line = one_error_line(err)
    assert expect in line and name in line


# ---------------------------------------------------------------------- 4. caps on numbers
CAP_CASES = [
    (["plan", "-s", "1f1b", "--pp", "4", "-m", "10000000"], "microbatches = 10,000,000 is above the cap"),
    (["simulate", "-s", "1f1b", "--pp", "100000000", "-m", "8"], "pp = 100,000,000 is above the cap"),
    (["simulate", "-s", "1f1b", "--pp", "4096", "-m", "4096"], "forward jobs"),
    (["simulate", "-s", "1f1b", "--pp", "4", "-m", "8", "--layers", "1000000000"], "--layers: 1,000,000,000 is above"),
    (["partition", "--pp", "4", "--layers", "1000000000"], "--layers: 1,000,000,000 is above"),
    (["simulate", "-s", "zbv", "--pp", "4", "-m", "8", "-O", "polish=1e9"], "option polish = 1000000000.0 is above"),
    (["simulate", "-s", "zbv", "--pp", "4", "-m", "8", "-O", "insert_budget=1e18"], "insert_budget"),
    (["simulate", "-s", "zbh1", "--pp", "4", "-m", "8", "-O", "budget=1e18"], "option budget"),
    (["simulate", "-s", "optimal", "--pp", "2", "-m", "2", "-O", "time_limit=1e9"], "option time_limit"),
    (["partition", "--pp", "2", "--layers", "8", "--balance", "--max-evals", "100000000"], "--max-evals"),
    (["run", "--pp", "64", "--dp", "64", "-m", "64"], "--allow-oversubscribe"),
]


@pytest.mark.parametrize("argv,expect", CAP_CASES, ids=[" ".join(c[0][:1] + c[0][-2:]) for c in CAP_CASES])
def test_absurd_numbers_are_refused_naming_the_cap(capsys, argv, expect):
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    line = one_error_line(err)
    assert expect in line and "cap" in line or "--allow-oversubscribe" in line


def test_caps_live_in_one_place():
    from pipeloom.core import costs, limits
    from pipeloom.schedule.io import native

    assert native.MAX_JOBS is limits.MAX_JOBS and costs.MAX_COST is limits.MAX_COST


# ---------------------------------------------------------------------- 5. SIGINT stops CP-SAT and the polish
def _interrupt_when(argv, marker):
    """Start the CLI, wait (reading stderr, not sleeping) until it reports ``marker``, send SIGINT;
    (exit code, seconds from SIGINT to exit, stderr)."""
    import signal
    import time

    # SIGINT as a terminal delivers it: a suite started in the background of a non-interactive shell (`make test &`)
    # hands its children SIGINT ignored, and Python then leaves it ignored
    p = subprocess.Popen([PY, "-m", "pipeloom", "--progress", *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env(),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        seen = []
        while True:  # the process reports each long step on stderr (--progress) before starting it
            line = p.stderr.readline()
            if not line:
                break
            seen.append(line)
            if marker in line:
                break
        assert seen and marker in seen[-1], "".join(seen)
        time.sleep(0.5)  # let it get into the solve (the report comes just before); the assert is on the exit
        p.send_signal(signal.SIGINT)
        t = time.monotonic()
        rc = p.wait(timeout=30)
        return rc, time.monotonic() - t, p.stderr.read(), p.stdout.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.slow
def test_sigint_stops_the_exact_solver():
    rc, dt, err, out = _interrupt_when(
        ["simulate", "-s", "optimal", "--pp", "4", "-m", "8", "--vpp", "2", "--mem-limit", "1p", "--costs",
         "F=4,B=6,W=3,comm=1", "-O", "time_limit=60", "-O", "hints=false", "--json"], "solving with CP-SAT")
    assert rc == 130 and "pipeloom: interrupted" in err and out == ""
    assert dt < 2.0


@pytest.mark.slow
def test_sigint_stops_the_polish():
    rc, dt, err, out = _interrupt_when(
        ["simulate", "-s", "zbv", "--pp", "4", "-m", "12", "--mem-limit", "1p", "--costs", "F=4,B=6,W=3,comm=1",
         "-O", "polish=600", "--json"], "polishing with CP-SAT")
    assert rc == 130 and "pipeloom: interrupted" in err and out == ""
    assert dt < 2.0


# ---------------------------------------------------------------------- 7. inputs that used to crash, one line each
def test_schedule_csv_with_a_huge_field(tmp_path, capsys):
    f = tmp_path / "big.csv"
    f.write_text("device,step,job\n0,0," + "F" * 200_000 + "\n")
    rc, out, err = run(capsys, "show", str(f))
    assert rc == 2 and "big.csv" in one_error_line(err) and "CSV" in err


def test_deeply_nested_json_plan(tmp_path, capsys):
    f = tmp_path / "deep.json"
    f.write_text('{"devices": ' + "[" * 100_000 + "]" * 100_000 + "}")
    rc, out, err = run(capsys, "show", str(f))
    assert rc == 2 and "deep.json" in one_error_line(err)


# ---------------------------------------------------------------------- 8. clearer messages
def test_negative_mem_limit_is_a_value_not_an_option(capsys):
    rc, out, err = run(capsys, "simulate", "-s", "1f1b", "--pp", "4", "-m", "8", "--mem-limit", "-1p")
    line = one_error_line(err)
    assert rc == 2 and "must be > 0" in line and "expected one argument" not in line


def test_unknown_placement_lists_the_allowed_values(capsys):
    rc, out, err = run(capsys, "simulate", "-s", "optimal", "--pp", "2", "-m", "2", "-O", "placement=zigzag")
    line = one_error_line(err)
    assert rc == 2 and "'v'" in line and "'interleaved'" in line and "zigzag" in line


# ---------------------------------------------------------------------- 9. logs that cannot be real
def _logs(tmp_path, edit=None, **cfg):
    from pipeloom import make_spec, plan
    from pipeloom.trace.synth import SynthConfig, write_logs

    d = tmp_path / "logs"
    write_logs(str(d), plan("1f1b", make_spec(pp=2, microbatches=4)), SynthConfig(**cfg))
    if edit:
        for p in sorted(d.iterdir()):
            lines = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
            new = edit(p.name, lines)
            if isinstance(new, bytes):
                p.write_bytes(new)
            else:
                p.write_text("".join(json.dumps(x) + "\n" for x in new))
    return str(d)


def _shift(name, lines, seconds, only="workerlog.1"):
    for x in lines:
        for k in ("start", "end", "t"):
            if k in x and name == only:
                x[k] += seconds
    return lines


def _all_equal(name, lines):
    for x in lines:
        for k in ("start", "end", "t"):
            if k in x:
                x[k] = 1_763_884_800.0
    return lines


def _no_run_id_hours_apart(name, lines):
    for x in lines:
        if x["event"] == "meta":
            x.pop("run_id", None)
    return _shift(name, lines, 2 * 86_400)


def _meta(name, lines, fn):
    for x in lines:
        if x["event"] == "meta":
            fn(x)
    return lines


def _huge_end(name, lines):
    for x in lines:
        if x["event"] == "job" and x["step"] == 3 and name == "workerlog.1":
            x["end"] = 1e308
            break
    return lines


#: logs whose times cannot be real: `check` refuses them (`trace` draws what was logged)
BAD_TIMES = {
    "all timestamps equal": (_all_equal, "last 0 s"),
    "one clock 3 h off": (lambda n, L: _shift(n, L, 3 * 3600), "rank(s) 1 start 3 h after rank(s) 0"),
    "two runs without run_id": (_no_run_id_hours_apart, "different runs"),
    "job end 1e308": (_huge_end, "not a real time"),
}
#: logs that are not logs or carry no usable plan: both commands refuse them
BAD_PLANS = {
    "schedule is a string": (lambda n, L: _meta(n, L, lambda m: m.update(schedule="1f1b")),
                             "the plan in the logs is invalid"),
    "schedule is invalid": (lambda n, L: _meta(n, L, lambda m: m["schedule"]["devices"][0].reverse()),
                            "the plan in the logs is invalid"),
    "no meta line": (lambda n, L: [x for x in L if x["event"] != "meta"], "the logs have no meta line"),
    "binary": (lambda n, L: bytes(range(256)) * 8, "binary data, not a worker log"),
}
CASES = [(c, "check") for c in {**BAD_TIMES, **BAD_PLANS}] + [(c, "trace") for c in BAD_PLANS]


@pytest.mark.parametrize("case,cmd", CASES, ids=[f"{cmd}: {c}" for c, cmd in CASES])
def test_impossible_logs_get_no_verdict(tmp_path, capsys, case, cmd):
    edit, expect = {**BAD_TIMES, **BAD_PLANS}[case]
    d = _logs(tmp_path, edit)
    argv = ["check", d, "--json"] if cmd == "check" else ["trace", d, "-o", str(tmp_path / "t.json")]
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == "", (out, err)
    assert expect in one_error_line(err)


def test_real_logs_still_get_a_verdict(tmp_path, capsys):
    """The sanity checks leave real trouble to the verdict: a slow rank, a late one, skewed machines."""
    d = _logs(tmp_path, slow={1: 1.8}, late_start={0: 0.01})
    rc, out, err = run(capsys, "check", d, "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["stragglers"] and "verdict" in res


# ---------------------------------------------------------------------- 6. progress on stderr, never in --json
def test_progress_goes_to_stderr_and_json_stays_strict(capsys):
    rc, out, err = run(capsys, "--progress", "simulate", "-s", "1f1b", "--pp", "4", "-m", "8", "--json")
    assert rc == 0 and json.loads(out)["makespan"] > 0
    assert "pipeloom: planning 1f1b" in err and "pipeloom: validating" in err


def test_progress_of_the_balance_dp(capsys):
    rc, out, err = run(capsys, "--progress", "partition", "--pp", "2", "--layers", "5000", "--balance",
                       "bottleneck", "--json")
    assert rc == 0 and json.loads(out)["layers"] == 5000
    assert "balancing: exact DP" in err


def test_no_progress_without_a_terminal_or_the_flag(capsys):
    rc, out, err = run(capsys, "simulate", "-s", "1f1b", "--pp", "4", "-m", "8", "--json")
    assert rc == 0 and err == ""


# ---------------------------------------------------------------------- 11. the documented caps are the real ones
def test_docs_list_every_cap_with_its_value():
    import re
    from pathlib import Path

    from pipeloom.core import limits

    doc = (Path(__file__).resolve().parents[2] / "docs" / "robustness.md").read_text()
    rows = dict(re.findall(r"^\| `([A-Z_]+)` \| ([^|]+) \|", doc, flags=re.M))
    caps = {n: getattr(limits, n) for n in dir(limits) if n.startswith(("MAX_", "RANK_"))
            and not isinstance(getattr(limits, n), dict)}
    assert set(caps) == set(rows), (set(caps) ^ set(rows))
    # the caps per kind of input file: their own table, "| kind | cap | read by |"
    files = dict(re.findall(r"^\| ([a-z][a-z -]+) \| (\d+ [KMG]i?B)\b[^|]* \| [^|]+ \|$", doc, flags=re.M))
    unit = {"MiB": 2**20, "GiB": 2**30, "MB": 10**6, "KiB": 2**10}
    assert {k: int(v.split()[0]) * unit[v.split()[1]] for k, v in files.items()} == limits.MAX_FILE_BYTES
    for name, value in caps.items():
        text = rows[name].strip().replace(",", "")
        num = float(text.split()[0]) * (2**20 if text.endswith("MiB") else 1)
        assert num == value, (name, text, value)
