"""pipeloom command line. Each subcommand lives in its own module with ``add_parser(sub)``.

Every subcommand calls one library function and prints; bad input becomes a one-line
``pipeloom: error: ...`` on stderr with exit code 2, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# the subcommands; module cli/<name>_cmd.py defines add_parser(subparsers)
COMMANDS = ["simulate", "plan", "show", "compare", "partition", "memory", "run", "trace", "check", "convert", "tune"]


class CLIError(Exception):
    """Raise for bad input: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (what is wrong and where to look) instead of usage + error."""

    def error(self, message: str):
        self.exit(2, f"pipeloom: error: {self.prog.split(' ', 1)[-1] if ' ' in self.prog else ''}"
                     f"{': ' if ' ' in self.prog else ''}{message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="pipeloom",
        description="Plan, validate, simulate, run and visualise pipeline-parallel training schedules.",
        epilog="Run 'pipeloom COMMAND --help' for the options of each command.",
    )
    p.add_argument("--version", action="version", version="pipeloom 0.1.0")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    p.set_defaults(_subparsers=sub)
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}_cmd").add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # name the subcommand whose --help lists the options
        sub = args._subparsers.choices.get(getattr(args, "command", None) or "", parser)
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        print("pipeloom: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except (CLIError, ValueError, OSError) as e:  # ScheduleError, ValidationError, format errors are ValueErrors
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if isinstance(e, OSError) and e.filename is not None and e.strerror:  # not "[Errno 2] ..."
            msg = f"cannot write or read {e.filename}: {e.strerror}"
        print(f"pipeloom: error: {msg}", file=sys.stderr)
        return 2
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
