"""The planners' pause of Python's cyclic garbage collector (no torch).

A plan at depth builds millions of small, acyclic objects (every candidate's job lists: 393 216 ``Job`` tuples
per candidate at pp 128, m 512, vpp 2). Each ``Job`` holds a ``Kind`` member, so the collector keeps tracking
it, and its young-generation passes, triggered every few hundred allocations, end in full passes over all the
candidates built so far: about a quarter of the plan's CPU time at that shape (zbv, F/B/W 1/2/1, comm 0.5 at
0.75p: 2.7 -> 2.1 s), for nothing (the search leaves no cyclic garbage worth the name, a handful of objects,
and the same peak memory). :func:`paused` turns the collector off for the duration of a call and restores the
caller's setting afterwards (nested pauses and callers that turned it off themselves are left as they were);
reference counting frees everything as usual meanwhile.
"""
from __future__ import annotations

import functools
import gc
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)

__all__ = ["paused"]


def paused(fn: F) -> F:
    """Decorator: run ``fn`` with the cyclic garbage collector off (restored afterwards, also on error)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        was = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was:
                gc.enable()
    return run  # type: ignore[return-value]
