"""Ranks whose interpreter exits at once, with arguments larger than a pipe buffer: `run` fails, it does not hang.

Before the fix, the "spawn" start method wrote the pickled process object (with the RunConfig and its
schedule) into the child's pipe while holding the read end: over 64 KiB, ``Process.start`` blocked forever.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time

import pytest

PY = sys.executable
SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")

CODE = ("import multiprocessing, sys; from multiprocessing import resource_tracker;"
        "resource_tracker.ensure_running(); multiprocessing.set_executable('/bin/false');"
        "from pipeloom.cli import main; sys.exit(main(['run', '--pp', '2', '-m', '{m}', '--steps', '1',"
        "'--timeout', '20']))")


def _env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.abspath(SRC) + os.pathsep + e.get("PYTHONPATH", "")
    return e


def test_large_run_arguments_are_over_a_pipe_buffer():
    """The premise: the arguments of `run -m 3000` are well over the 64 KiB pipe buffer."""
    from pipeloom.runtime.driver import RunConfig  # noqa: F401  (the config type travels to the ranks)
    from pipeloom.schedule import registry
    from pipeloom.schedule.registry import PlanSpec

    sched = registry.build("1f1b", PlanSpec(pp=2, vpp=1, microbatches=3000))
    assert len(pickle.dumps(sched)) > 64 * 1024


@pytest.mark.dist
def test_run_with_large_arguments_whose_ranks_cannot_start_fails_fast():
    t0 = time.monotonic()
    try:
        p = subprocess.run([PY, "-c", CODE.format(m=3000)], capture_output=True, text=True, env=_env(), timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("pipeloom run hung starting ranks whose interpreter exits at once")
    elapsed = time.monotonic() - t0
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("pipeloom:")]
    assert len(lines) == 1 and lines[0].startswith("pipeloom: error: rank"), p.stderr
    assert p.stdout == ""
    assert elapsed < 60, elapsed  # interpreter start + planning + the grace period, not a hang


def test_spawn_leaves_no_argument_file(tmp_path, monkeypatch):
    """The temp file that carries the arguments is removed after the run, also when the ranks fail."""
    import tempfile

    from pipeloom.runtime import launch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(launch.RankFailure, match="boom"):
        launch.spawn(_boom, 1, (b"x" * 200_000,), timeout_s=5, grace_s=0.5)
    assert os.listdir(tmp_path) == []


def _boom(payload):
    raise ValueError(f"boom {len(payload)}")
