"""pipeloom command line. Each subcommand lives in its own module with ``add_parser(sub)``.

Every subcommand calls one library function and prints; bad input becomes a one-line
``pipeloom: error: ...`` on stderr with exit code 2, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import re
import os
import sys

# the subcommands; module cli/<name>_cmd.py defines add_parser(subparsers)
COMMANDS = ["simulate", "plan", "show", "compare", "partition", "memory", "run", "trace", "check", "convert", "tune"]


class CLIError(Exception):
    """Raise for bad input: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (what is wrong and where to look) instead of usage + error.

    A token like ``-1p`` or ``-1e3`` is a value (no option starts with a digit), so that ``--mem-limit -1p``
    reaches the option's own check ("must be > 0") instead of "expected one argument"."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._negative_number_matcher = re.compile(r"^-\d|^-\.\d")

    def error(self, message: str):
        self.exit(2, f"pipeloom: error: {self.prog.split(' ', 1)[-1] if ' ' in self.prog else ''}"
                     f"{': ' if ' ' in self.prog else ''}{message} (see '{self.prog} --help')\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line. With ``command`` (one of :data:`COMMANDS`) only that subcommand's parser is added:
    :func:`main` parses one command, and building all eleven costs about 5 ms a call."""
    p = _Parser(
        prog="pipeloom",
        description="Plan, validate, simulate, run and visualise pipeline-parallel training schedules.",
        epilog="Run 'pipeloom COMMAND --help' for the options of each command.",
    )
    p.add_argument("--version", action="version", version="pipeloom 0.1.0")
    p.add_argument("--debug", action="store_true",
                   help="show the Python traceback of an unexpected error (give it before COMMAND)")
    p.add_argument("--progress", action="store_true",
                   help="report long work (planning, solving, balancing) on stderr even when it is not a terminal "
                        "(on a terminal a status line shows by default); give it before COMMAND")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    p.set_defaults(_subparsers=sub)
    for name in [command] if command in COMMANDS else COMMANDS:
        importlib.import_module(f"{__name__}.{name}_cmd").add_parser(sub)
    return p


def _command_of(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not an option (the options before a command
    take no value), if that is a command; else None (then every parser is built, for the help or the error)."""
    for w in argv:
        if not w.startswith("-"):
            return w if w in COMMANDS else None
    return None


def main(argv: list[str] | None = None) -> int:
    saved = _guard_stderr()
    try:
        return _main(argv)
    finally:
        if saved is not False:
            sys.stderr = saved


def _main(argv: list[str] | None) -> int:
    parser = build_parser(_command_of(sys.argv[1:] if argv is None else list(argv)))
    try:
        args, extra = parser.parse_known_args(argv)
    except RecursionError:  # argparse on an absurd argument list
        print("pipeloom: error: the command line is too long or too deeply nested", file=sys.stderr)
        return 2
    if extra:  # name the subcommand whose --help lists the options
        sub = args._subparsers.choices.get(getattr(args, "command", None) or "", parser)
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        if getattr(args, "config", None) is not None:  # --config FILE: the file's fields fill the flags not given
            from .config_opts import apply_config

            words = list(sys.argv[1:] if argv is None else argv)
            apply_config(args, args._subparsers.choices[args.command], words[words.index(args.command) + 1:],
                         args._config_flags)
        _check_files(args)  # an output that would replace an input, or that cannot be written: before any work
        with _progress(args):
            rc = args.func(args)
        sys.stdout.flush()  # here, so that a reader that went away is seen now (a BrokenPipeError below)
    except KeyboardInterrupt:
        print("pipeloom: interrupted", file=sys.stderr)
        cpsat = sys.modules.get("pipeloom.schedule.search.cpsat")
        if cpsat is not None and cpsat.interrupted_solve:  # see there: leave before ortools' exit handlers
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
        return 130
    except BrokenPipeError as e:
        if _stdout_closed():  # `pipeloom ... | head`: the reader has what it wanted; that is success
            _silence_stdout()
            return 0
        return _error(f"a pipe closed unexpectedly ({_where(e)}): {e.strerror or e}", args)
    except (CLIError, ValueError, OSError) as e:  # ScheduleError, ValidationError, format errors are ValueErrors
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if isinstance(e, OSError) and e.filename is not None and e.strerror:  # not "[Errno 2] ..."
            msg = f"cannot write or read {e.filename}: {e.strerror}"
        elif isinstance(e, OSError) and e.errno in _WRITE_ERRNOS:  # every file pipeloom writes names itself
            msg = f"cannot write the output to stdout ({_stdout_target()}): {e.strerror or e}"
            _silence_stdout()  # what is still buffered cannot be written either: no second error at exit
        return _error(msg, args)
    except MemoryError as e:
        tb = e.__traceback__  # the innermost frame, read without allocating much
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = (f"in {os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_frame.f_code.co_name}"
                 if tb is not None else "at the top level")
        tb = None
        if not getattr(args, "debug", False):
            e.__traceback__ = None  # its frames hold what filled the memory: free it before composing the message
            import gc

            gc.collect()
        given = _given_sizes(args)
        return _error(f"out of memory {where}: the input asks for more than this machine has"
                      f"{' with ' + given if given else ''}; give smaller values or a smaller file (caps: "
                      f"docs/robustness.md)", args)
    except RecursionError as e:
        return _error(f"the input is nested too deeply to process ({_where(e)})", args)
    except Exception as e:  # a bug: one line and a request to report it; the traceback with --debug
        if getattr(args, "debug", False):
            raise
        text = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        print(f"pipeloom: error: internal error {type(e).__name__}{': ' + text if text else ''} ({_where(e)}); "
              f"please report it with the command line (run 'pipeloom --debug {args.command} ...' for the "
              f"traceback)", file=sys.stderr)
        return INTERNAL_ERROR
    return int(rc or 0)


#: exit code of an unforeseen error (a bug in pipeloom); bad input is 2, a failed check 1, SIGINT 130
INTERNAL_ERROR = 3

#: options (argparse dests) naming files a command reads, and files or directories it writes: checked once,
#: before any work, for every command (:func:`pipeloom.core.files.check_outputs`)
INPUT_OPTIONS = {"config": "--config", "plan": "--plan", "file": "FILE", "input": "IN", "logdir": "LOGDIR",
                 "model": "--model", "layer_costs": "--layer-costs", "calibration": "--calibration", "meta": "--meta",
                 "data": "--data"}
OUTPUT_OPTIONS = {"out": "--out", "output": "OUT", "calibrate": "--calibrate", "png": "--png", "html": "--html",
                  "dp_gantt": "--dp-gantt", "log_dir": "--log-dir"}
#: (command, dest) of the outputs that are directories
DIRECTORY_OUTPUTS = {("tune", "out"), ("run", "log_dir")}
#: (command, dest) of outputs the command writes if it can and goes on without (check's pictures): not checked
OPTIONAL_OUTPUTS = {("check", "out")}


def _check_files(args) -> None:
    """Refuse an output equal to an input or to another output (links resolved, same inode), and one that
    cannot be written, before the command starts."""
    from ..core.files import check_outputs

    def pairs(table, dirs: bool):
        for dest, flag in table.items():
            v = getattr(args, dest, None)
            for p in (v if isinstance(v, list) else [v]):
                if isinstance(p, str) and p and ((args.command, dest) in DIRECTORY_OUTPUTS) == dirs \
                        and (args.command, dest) not in OPTIONAL_OUTPUTS:
                    yield flag, p
    check_outputs(list(pairs(INPUT_OPTIONS, False)), list(pairs(OUTPUT_OPTIONS, False)),
                  list(pairs(OUTPUT_OPTIONS, True)))


class _SafeStderr:
    """stderr that never fails the command: written straight to the descriptor, and silent from the first
    failed write on (a closed pipe, /dev/full). The result on stdout and the exit code never depend on it."""

    encoding = "utf-8"
    errors = "backslashreplace"

    def __init__(self, fd: int = 2):
        self._fd = fd
        self._dead = False

    def write(self, text: str) -> int:
        data = text.encode("utf-8", "backslashreplace")
        while data and not self._dead:
            try:
                n = os.write(self._fd, data)
            except InterruptedError:
                continue
            except (OSError, ValueError):
                self._dead = True
                break
            data = data[n:]
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        try:
            return not self._dead and os.isatty(self._fd)
        except OSError:
            return False

    def writable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return False


def _guard_stderr():
    """Make stderr safe for this command: when the process's own stderr is in use (not a caller's stream),
    replace it by :class:`_SafeStderr`; a closed descriptor 2 is first held by /dev/null, so that no file
    opened later becomes "stderr". Returns the stream to restore, or False when nothing was changed."""
    orig = sys.stderr
    if orig is not None and orig is not sys.__stderr__:
        return False  # a test's capture or a caller's own stream: theirs to manage
    try:
        os.fstat(2)
    except OSError:
        try:
            fd = os.open(os.devnull, os.O_WRONLY)
            if fd != 2:
                os.dup2(fd, 2)
                os.close(fd)
        except OSError:
            pass
    try:
        if orig is not None:
            orig.flush()
    except (OSError, ValueError):
        pass
    sys.stderr = _SafeStderr(2)
    return orig


def _progress(args):
    """Listen to :mod:`pipeloom.core.progress` while the command runs: a rich status line when stderr is a
    terminal, plain ``pipeloom: ...`` lines with --progress, else nothing (stdout is never touched)."""
    import contextlib

    from ..core import progress

    if sys.stderr.isatty():
        return _rich_status()
    if getattr(args, "progress", False):
        return progress.listening(_plain_lines())
    return contextlib.nullcontext()


def _plain_lines(every_s: float = 1.0):
    """A listener printing ``pipeloom: MESSAGE`` lines to stderr: each new step at once, repeats of one step
    (the same words before the first digit) at most once per ``every_s`` seconds."""
    import time

    last = {"key": None, "t": 0.0}

    def show(msg: str) -> None:
        key = re.split(r"\d", msg, maxsplit=1)[0]
        now = time.monotonic()
        if key != last["key"] or now - last["t"] >= every_s:
            last.update(key=key, t=now)
            print(f"pipeloom: {msg}", file=sys.stderr, flush=True)
    return show


@__import__("contextlib").contextmanager
def _rich_status():
    from rich.console import Console

    from ..core import progress

    status = None
    off = False  # a command that shows its own live display (run) keeps it: rich allows one at a time

    def show(msg: str) -> None:
        nonlocal status, off
        if off:
            return
        if status is None:
            status = Console(stderr=True).status(msg)
            try:
                status.start()
            except Exception:  # rich.errors.LiveError: another display is live
                status, off = None, True
        else:
            status.update(msg)
    try:
        with progress.listening(show):
            yield
    finally:
        if status is not None:
            status.stop()


def _error(msg: str, args) -> int:
    if getattr(args, "debug", False):
        import traceback

        traceback.print_exc()
    # one write with its newline: the ranks of a run share one stderr, and print's two writes (text, then the
    # newline) let another rank's line land between them (two errors joined on one line)
    sys.stderr.write(f"pipeloom: error: {msg}\n")
    return 2


def _where(e: BaseException) -> str:
    """``in module.function`` of the innermost frame of ``e``'s traceback (where it went wrong)."""
    import os
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return "at the top level"
    f = frames[-1]
    return f"in {os.path.basename(f.filename)}:{f.name}"


#: errors of a write that ran out of room (a full disk, a file-size limit, a quota) or failed on the device
_WRITE_ERRNOS = {__import__("errno").ENOSPC, __import__("errno").EFBIG, __import__("errno").EIO,
                 getattr(__import__("errno"), "EDQUOT", -1)}


def _stdout_target() -> str:
    """What stdout is: the file or device it was redirected to, or 'a pipe'."""
    try:
        target = os.readlink("/proc/self/fd/1")
    except OSError:
        return "redirected"
    return "a pipe" if target.startswith("pipe:") else target


def _given_sizes(args) -> str:
    """The largest numbers on the command line (``--pp 65536, --microbatches 152``): what an out-of-memory
    error most likely comes from."""
    nums = [(v, k) for k, v in vars(args).items() if not k.startswith("_") and isinstance(v, (int, float))
            and not isinstance(v, bool) and v > 1]
    nums.sort(reverse=True)
    return ", ".join(f"--{k.replace('_', '-')} {v:g}" for v, k in nums[:4])


def _stdout_closed() -> bool:
    """True when stdout is a pipe whose reader has gone (EPIPE on a flush, or POLLERR on the pipe)."""
    import os
    import select
    import stat

    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return True
    except (OSError, ValueError):
        return False
    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode) and not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return False
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the flush at exit does not raise again (as Python's docs advise
    for SIGPIPE)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass

if __name__ == "__main__":
    sys.exit(main())
