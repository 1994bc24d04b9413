"""Trace formats: what ``pipeloom check`` and ``pipeloom trace`` read, one registry entry per format (no torch).

A format is a :class:`TraceFormat`: a name, a line saying what it accepts (error messages list these),
``sniff(path) -> bool`` (cheap: the name, the first bytes of a file, one directory listing; never the whole
input) and ``read(path, meta=None)`` into the run model:

* level ``"jobs"``: a :class:`~pipeloom.trace.run.RunLog` (per rank the executed pipeline jobs; bubble check,
  Gantt pictures, Perfetto trace, and the what-if analysis through :mod:`.runops`), built by
  :func:`~pipeloom.trace.reader.run_of_ranks` from per-rank :class:`~pipeloom.trace.run.RankLog` records;
* level ``"ops"``: an :class:`~pipeloom.trace.ops.optrace.OpTrace` (per worker the recorded ops of any trainer;
  the what-if analysis only).

Adding a format is one file with its ``sniff`` and ``read`` and one line::

    register(TraceFormat("myformat", "what it accepts", sniff=my_sniff, read=my_read, level="jobs"))

:func:`detect` asks the formats in registration order (built-in ones first: op traces by extension, then
pipeloom's worker logs, then torch profiler traces) and refuses a path none of them claims, naming what is
accepted. ``inputs(path)`` lists the files a format reads, so that no output of a command replaces one.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable

SNIFF_BYTES = 64 * 1024
"""how much of a file sniffing looks at"""


class TraceFormatError(ValueError):
    """No registered format reads the path (the message names it and lists what is accepted)."""


@dataclass(frozen=True)
class TraceFormat:
    name: str
    accepts: str
    """what a user gives for this format, in one line (listed when nothing matches)"""
    sniff: Callable[[str], bool]
    read: Callable[..., object]
    """``read(path, meta=None)`` -> RunLog (level "jobs") or OpTrace (level "ops")"""
    level: str = "jobs"
    inputs: Callable[[str], list[str]] | None = None
    """the files ``read`` reads (default: the path itself when it is a file)"""

    def __post_init__(self) -> None:
        if self.level not in ("jobs", "ops"):
            raise ValueError(f"trace format {self.name!r}: level must be 'jobs' or 'ops', got {self.level!r}")

    def files(self, path: str) -> list[str]:
        if self.inputs is not None:
            return list(self.inputs(path))
        return [path] if os.path.isfile(path) else []


_REGISTRY: dict[str, TraceFormat] = {}


def register(fmt: TraceFormat) -> TraceFormat:
    """Add ``fmt`` (sniffed after the formats registered before it); a name registered twice is refused."""
    if fmt.name in _REGISTRY:
        raise ValueError(f"trace format {fmt.name!r} is registered already")
    _REGISTRY[fmt.name] = fmt
    return fmt


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def formats() -> list[TraceFormat]:
    return list(_REGISTRY.values())


def accepted(level: str | None = None) -> str:
    """The accepted inputs, one ``name: accepts`` per format joined by "; " (only ``level``'s when given)."""
    return "; ".join(f"{f.name}: {f.accepts}" for f in _REGISTRY.values() if level in (None, f.level))


def detect(path: str) -> TraceFormat:
    """The first registered format whose ``sniff`` claims ``path``; a one-line :class:`TraceFormatError` else."""
    if not os.path.exists(path):
        raise TraceFormatError(f"{path} does not exist; give a trace: {accepted()}")
    for fmt in _REGISTRY.values():
        try:
            if fmt.sniff(path):
                return fmt
        except OSError:
            continue
    what = "directory" if os.path.isdir(path) else "file"
    raise TraceFormatError(f"{path}: no trace format pipeloom reads recognises this {what}; accepted: {accepted()}")


def read(path: str, meta: str | None = None):
    """``(format, run model)`` of ``path``: :func:`detect`, then the format's ``read``."""
    fmt = detect(path)
    return fmt, fmt.read(path, meta=meta)


def head(path: str, n: int = SNIFF_BYTES) -> bytes:
    """The first ``n`` bytes of a regular file (gzip-decompressed for ``.gz``); b"" for anything else."""
    if not os.path.isfile(path):
        return b""
    if path.lower().endswith(".gz"):
        import gzip

        try:
            with gzip.open(path, "rb") as fh:
                return fh.read(n)
        except (OSError, EOFError):
            return b""
    with open(path, "rb") as fh:
        return fh.read(n)


# ------------------------------------------------------------------------------------------- built-in formats
def _sniff_optrace(path: str) -> bool:
    from .ops.optrace import is_op_trace

    return is_op_trace(path)


def _read_optrace(path: str, meta: str | None = None):
    from .ops.optrace import read_optrace

    return read_optrace(path, meta)


_EVENT_LINE = re.compile(rb'^\s*\{\s*"event"\s*:', re.M)


def _sniff_worker_logs(path: str) -> bool:
    from .reader import _FILE_RE, find_worker_logs
    from .run import LogError

    if os.path.isdir(path):
        try:
            return bool(find_worker_logs(path))
        except LogError:
            return False
    if not os.path.isfile(path):
        return False
    if _FILE_RE.match(os.path.basename(path)):
        return True
    h = head(path)
    return b"\x00" not in h and (bool(_EVENT_LINE.search(h)) or b"Profiler Info" in h)


def _read_worker_logs(path: str, meta: str | None = None):
    from .reader import read_logs

    return read_logs(path, source="pipeloom")


def _worker_log_files(path: str) -> list[str]:
    from .reader import find_worker_logs

    return [p for _, _, p in find_worker_logs(path)]


def _sniff_torch(path: str) -> bool:
    from .torch_profile import find_traces

    if os.path.isdir(path):
        return bool(find_traces(path))
    return bool(find_traces(path)) and b'"traceEvents"' in head(path)


def _read_torch(path: str, meta: str | None = None):
    from .reader import read_logs

    return read_logs(path, source="torch")


def _torch_files(path: str) -> list[str]:
    from .torch_profile import find_traces

    return [p for p, _ in find_traces(path)]


register(TraceFormat("op-trace", "an op trace of any trainer, .parquet/.pq or .csv/.csv.gz (columns dp_rank, stage, "
                                 "step, optype, start_ts, duration; docs/diagnose.md)",
                     sniff=_sniff_optrace, read=_read_optrace, level="ops"))
register(TraceFormat("pipeloom-logs", "pipeloom worker logs: a directory of workerlog.<rank> files (or of "
                                      "machine<k>/ folders of them) or one such file, JSON lines or 'Profiler Info' "
                                      "text lines",
                     sniff=_sniff_worker_logs, read=_read_worker_logs, inputs=_worker_log_files))
register(TraceFormat("torch-profiler", "torch profiler traces (Chrome/Kineto JSON per rank, .json or .json.gz): one "
                                       "file or a directory of them, e.g. torchtitan's profile_trace/ with "
                                       "iteration_<N>/rank<R>_trace.json",
                     sniff=_sniff_torch, read=_read_torch, inputs=_torch_files))
