"""The tensor-parallel overlap modes by name (no torch): ``off | async | chunked:K | fill``.

What each mode overlaps with a column-parallel layer's input-gradient collective is described in
:mod:`pipeloom.runtime.tp_overlap`; the collectives themselves are in :mod:`pipeloom.models.tp_comm`.
"""
from __future__ import annotations

__all__ = ["OVERLAP_MODES", "parse_overlap"]

#: the overlap modes of ``pipeloom run --tp-overlap`` (``chunked:K`` with K >= 2 token pieces)
OVERLAP_MODES = ("off", "async", "chunked:K", "fill")


def parse_overlap(text: str) -> tuple[str, int]:
    """``off | async | chunked:K | fill`` -> (mode, K); K is 1 except for chunked (K >= 2). One-line ValueError."""
    t = str(text).strip()
    if t in ("off", "async", "fill"):
        return t, 1
    if t.startswith("chunked:"):
        try:
            k = int(t.split(":", 1)[1])
        except ValueError:
            k = 0
        if k >= 2:
            return "chunked", k
    raise ValueError(f"tensor-parallel overlap {text!r}: allowed are off, async, chunked:K (K >= 2 token pieces), fill")
