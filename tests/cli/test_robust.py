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
    rc = main(list(argv))
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
    code = ("import multiprocessing, sys; multiprocessing.set_executable('/bin/false');"
            "from pipeloom.cli import main; sys.exit(main(['run', '--pp', '2', '-m', '2', '--steps', '1',"
            "'--timeout', '20']))")
    p = subprocess.run([PY, "-W", "ignore", "-c", code], capture_output=True, text=True, env=env(), timeout=120)
    assert p.returncode == 2, (p.returncode, p.stderr)
    errs = [x for x in p.stderr.splitlines() if x.startswith("pipeloom: error: ")]
    assert len(errs) == 1 and "rank" in errs[0], p.stderr
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
