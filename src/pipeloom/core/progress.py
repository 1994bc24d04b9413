"""Progress reports from long work (planning, solving, searching), shown by whoever listens (no torch).

Library code calls :func:`report` with a short phrase ("solving with CP-SAT, at most 60 s"); by
default nothing listens and it costs one global read. The CLI listens while a command runs (a
rich status line on a terminal's stderr, plain lines with ``pipeloom --progress``), so --json
stdout never holds progress.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

_listener: Callable[[str], None] | None = None


def report(message: str) -> None:
    """Tell the listener (if any) what the current long step is doing."""
    if _listener is not None:
        _listener(message)


def active() -> bool:
    """True while someone listens (skip building costly messages otherwise)."""
    return _listener is not None


@contextmanager
def listening(fn: Callable[[str], None]) -> Iterator[None]:
    """Send :func:`report` messages to ``fn`` inside the ``with`` block."""
    global _listener
    old, _listener = _listener, fn
    try:
        yield
    finally:
        _listener = old
