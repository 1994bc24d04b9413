"""Megatron-Core ``--pipeline-model-parallel-layout`` strings, read and written (no torch).

The layout names what every virtual pipeline stage holds, stages separated by ``|`` and listed in
Megatron's order: virtual stage ``v`` of pipeline rank ``r`` is entry ``v * pp + r`` (all ranks'
first chunks, then all ranks' second chunks; pipeloom's global chunk order under the interleaved
placement). Letters: ``E`` embedding, ``t`` decoder (transformer) layer, ``m`` multi-token-prediction
layer, ``L`` loss (final norm + output head + loss). ``X*N`` repeats one letter, ``(...)*N`` repeats
a group (which may hold ``|``), commas are cosmetic, spaces are ignored, stages may be empty.
Example (DeepSeek-V3 on PP16 VPP2, Megatron-Core's docs): ``Et*3|(tt|)*29,m|L``.

We accept nested groups as well (Megatron's own expander does not); :func:`format_layout` writes
the compact form Megatron reads. A malformed string is a one-line :class:`LayoutError` naming the
position (0-based character index) and what was expected there.
"""
from __future__ import annotations

from typing import Sequence

from ..core.ir import Placement
from .layout import Partition, PartitionError, from_counts

#: the letters of a layout and what they stand for
LETTERS = {"E": "embedding", "t": "decoder layer", "m": "MTP layer", "L": "loss"}


class LayoutError(PartitionError):
    """A layout string that cannot be read (the message names the position)."""


def _err(text: str, pos: int, what: str) -> LayoutError:
    shown = text if len(text) <= 60 else text[:57] + "..."
    return LayoutError(f"pipeline layout {shown!r}: {what} at position {pos}")


class _Reader:
    """Recursive-descent reader: seq := (item | '|' | ',')*; item := (LETTER | '(' seq ')') ['*' N]."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.s = "".join(text.split())  # spaces ignored; positions below refer to this (no-space) text
        self.i = 0

    def seq(self, depth: int) -> list:
        """A flat list of tokens: letters and '|' separators (groups expanded)."""
        out: list[str] = []
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c == ")":
                if depth == 0:
                    raise _err(self.text, self.i, "')' without a matching '('")
                return out
            if c == ",":
                self.i += 1
                continue
            if c == "|":
                out.append("|")
                self.i += 1
                continue
            if c == "(":
                start = self.i
                self.i += 1
                inner = self.seq(depth + 1)
                if self.i >= len(s):
                    raise _err(self.text, start, "'(' is never closed")
                self.i += 1  # ')'
                if not inner:
                    raise _err(self.text, start, "empty group '()'")
                out.extend(inner * self.count(required=True, after="')'"))
                continue
            if c in LETTERS:
                self.i += 1
                out.extend([c] * self.count(required=False, after=repr(c)))
                continue
            if c == "*":
                raise _err(self.text, self.i, "'*' must follow a letter or a ')'")
            raise _err(self.text, self.i, f"unknown character {c!r} (allowed: E, t, m, L, |, (, ), *N, ',')")
        return out  # an unclosed '(' is reported by the caller, at its position

    def count(self, *, required: bool, after: str) -> int:
        s = self.s
        if self.i >= len(s) or s[self.i] != "*":
            if required:
                raise _err(self.text, self.i, f"expected '*N' (a repeat count) after {after}")
            return 1
        self.i += 1
        j = self.i
        while j < len(s) and s[j].isdigit():
            j += 1
        if j == self.i:
            raise _err(self.text, self.i, "expected a whole number after '*'")
        n = int(s[self.i:j])
        self.i = j
        return n


def parse_layout(text: str) -> list[list[str]]:
    """The stages of a layout string, each a list of letters (``"Et*2|tL"`` -> ``[[E,t,t],[t,L]]``)."""
    if not isinstance(text, str) or not text.strip():
        raise LayoutError("pipeline layout is empty; write stages like 'Et*4|t*4|t*4|t*4L'")
    r = _Reader(text)
    toks = r.seq(0)
    stages: list[list[str]] = [[]]
    for t in toks:
        if t == "|":
            stages.append([])
        else:
            stages[-1].append(t)
    return stages


def _stage_text(stage: Sequence[str]) -> str:
    out, i = [], 0
    while i < len(stage):
        j = i
        while j < len(stage) and stage[j] == stage[i]:
            j += 1
        n = j - i
        out.append(stage[i] if n == 1 else (stage[i] * 2 if n == 2 and stage[i] == "t" else f"{stage[i]}*{n}"))
        i = j
    return "".join(out)


def format_layout(stages: Sequence[Sequence[str]]) -> str:
    """The compact string of ``stages``: letter runs as ``t*N`` and runs of identical stages (before the
    last) as ``(..|)*N``, e.g. ``Et*3|(tt|)*29,m|L``."""
    for k, st in enumerate(stages):
        for x in st:
            if x not in LETTERS:
                raise LayoutError(f"stage {k} holds {x!r}; allowed: {', '.join(LETTERS)}")
    texts = [_stage_text(st) for st in stages]
    n = len(texts)
    parts: list[str] = []
    i = 0
    while i < n:
        j = i
        while j + 1 < n - 1 and texts[j + 1] == texts[i]:  # the last stage is written on its own
            j += 1
        k = j - i + 1
        last = i == n - 1
        if k >= 2:
            parts.append(f"({texts[i]}|)*{k}")
            if j + 1 < n:
                parts.append(",")  # cosmetic: separates the count from a following letter
        else:
            parts.append(texts[i] + ("" if last else "|"))
        i = j + 1
    return "".join(parts)


def layout_counts(stages: Sequence[Sequence[str]], pp: int) -> tuple[int, list[int]]:
    """``(vpp, decoder layers per global chunk)`` of a layout on ``pp`` pipeline ranks (interleaved order).

    Checks what Megatron-Core checks: the number of stages divisible by pp, ``E`` exactly once and first,
    ``L`` last (once), decoder layers before any MTP layer.
    """
    if not isinstance(pp, int) or pp < 1:
        raise LayoutError(f"pp must be an integer >= 1, got {pp!r}")
    n = len(stages)
    if n % pp:
        raise LayoutError(f"the layout has {n} stages, not a multiple of pp={pp}; give pp*vpp stages")
    flat = [x for st in stages for x in st]
    if flat.count("E") != 1 or not flat or flat[0] != "E":
        raise LayoutError("the layout must hold the embedding 'E' exactly once, as its first letter")
    if flat.count("L") != 1 or flat[-1] != "L":
        raise LayoutError("the layout must hold the loss 'L' exactly once, as its last letter")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        raise LayoutError("decoder layers 't' must come before MTP layers 'm'")
    return n // pp, [st.count("t") for st in stages]


def layout_to_partition(text: str, pp: int) -> Partition:
    """A pipeloom :class:`Partition` (interleaved placement) from a layout string.

    pipeloom models neither MTP layers nor empty chunks: those give a one-line error.
    """
    stages = parse_layout(text)
    vpp, counts = layout_counts(stages, pp)
    if any("m" in st for st in stages):
        raise LayoutError("the layout holds MTP layers 'm', which pipeloom's partitions do not model; "
                          "drop them to read it as a partition")
    if "E" not in stages[0] or "L" not in stages[-1]:
        raise LayoutError("pipeloom runs the embedding with the first chunk and the loss with the last: 'E' must "
                          "be in the first stage and 'L' in the last")
    empty = [k for k, n in enumerate(counts) if n == 0]
    if empty:
        raise LayoutError(f"stage {empty[0]} holds no decoder layer; pipeloom partitions need >= 1 layer per "
                          f"chunk (pp={pp}, vpp={vpp})")
    return from_counts(counts, pp, vpp, Placement.INTERLEAVED)


def layout_chunk_counts(text: str, pp: int) -> tuple[int, list[int]]:
    """``(vpp, decoder layers per global chunk)`` of a layout for the memory model and the tuner, which take
    a first chunk with only the embedding (``E|``) and a last chunk with only the loss (``|L``); any other chunk
    needs a decoder layer and MTP layers are refused (as :func:`layout_to_partition` does)."""
    stages = parse_layout(text)
    vpp, counts = layout_counts(stages, pp)
    if any("m" in st for st in stages):
        raise LayoutError("the layout holds MTP layers 'm', which pipeloom's memory model does not hold; drop them")
    if "E" not in stages[0] or "L" not in stages[-1]:
        raise LayoutError("pipeloom runs the embedding with the first chunk and the loss with the last: 'E' must "
                          "be in the first stage and 'L' in the last")
    empty = [k for k, n in enumerate(counts) if n == 0 and 0 < k < len(counts) - 1]
    if empty:
        raise LayoutError(f"stage {empty[0]} holds no decoder layer; only the first (embedding) and the last "
                          f"(loss) stage may hold none")
    return vpp, counts


def partition_to_layout(part: Partition) -> str:
    """The layout string of a partition (interleaved placement: Megatron's virtual-stage order)."""
    if part.vpp > 1 and part.placement is not Placement.INTERLEAVED:
        raise LayoutError(f"Megatron-Core layouts list virtual stages in interleaved order; a {part.placement.value}"
                          f"-placed partition (vpp={part.vpp}) has no such layout")
    return counts_to_layout(part.seg_layer_num)


def counts_to_layout(counts: Sequence[int]) -> str:
    """Layout string for decoder layers per global chunk, ``E`` in the first and ``L`` in the last."""
    stages = [["t"] * int(n) for n in counts]
    stages[0].insert(0, "E")
    stages[-1].append("L")
    return format_layout(stages)


__all__ = ["LETTERS", "LayoutError", "counts_to_layout", "format_layout", "layout_chunk_counts", "layout_counts",
           "layout_to_partition",
           "parse_layout", "partition_to_layout"]
