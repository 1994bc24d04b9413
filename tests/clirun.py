"""``pipeloom ARGV`` run in the test's own process: :func:`pipeloom.cli.main` with stdout and stderr captured,
returned as :class:`subprocess.CompletedProcess` (returncode, stdout, stderr), as a console user sees them.

For tests of what a command prints and returns. A test of the whole process (interpreter start, exit
handlers, resource limits, signals, what is imported) starts a subprocess instead."""
from __future__ import annotations

import contextlib
import io
import subprocess

from pipeloom.cli import main


def pipeloom(*argv: str, check: bool = False) -> subprocess.CompletedProcess:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as e:  # argparse's --help and usage errors
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    done = subprocess.CompletedProcess(["pipeloom", *map(str, argv)], rc, out.getvalue(), err.getvalue())
    if check:
        done.check_returncode()
    return done
