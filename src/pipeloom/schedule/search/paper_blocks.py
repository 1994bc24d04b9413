"""The controllable-memory paper's own V-Half and V-Min blocks, squeezed under its memory count (no torch).

A candidate of the portfolio (:mod:`.portfolio`). :mod:`.vblock` builds a family of blocks and squeezes their
warm-up and cool-down under pipeloom's memory model, where an input-grad backward B frees half of its
forward's activation. The paper's released generator squeezes under its own count instead: B frees nothing,
W frees it all, and the cap is the repeated pattern's own peak. The moves the squeeze makes, hence the order,
differ; with uneven costs the generator's order is sometimes the shorter one (V-Half, pp 24, m 48, F/B/W
1/2/1, comm 0.5: 658 against 659 for the best block squeezed under pipeloom's model; pp 32, m 64: 883 against
889). This module builds exactly those two blocks (:func:`paper_blocks`, the offsets of the paper's code:
V-Min steps 1/1/1/1 with a gap of 2 slots when pp is a multiple of 3; V-Half steps 2/1/2/1 with a gap of 3
when pp is even) with :func:`.vblock.build` on a copy of the problem whose B frees nothing, capped at the
pattern's peak in that count. The caller re-times the job lists with the real costs and checks them under the
real memory model and limit (:func:`.localsearch.result_of`), so a block that does not fit is dropped.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterator

from ...core.ir import Job
from . import vblock


def applies(prob) -> bool:
    """V placement with two chunks per device (the blocks' shape)."""
    return vblock.applies(prob)


def paper_blocks(pp: int) -> list[vblock.Block]:
    """V-Half then V-Min as :class:`.vblock.Block` (first squeeze with W in place, as the paper's code)."""
    return [vblock.Block(s0=2, s1=1, s2=2, s3=1, t1=0, g=3 if pp % 2 == 0 else 0, t3=1),
            vblock.Block(s0=1, s1=1, s2=1, s3=1, t1=0, g=2 if pp % 3 == 0 else 0, t3=0)]


#: shapes above this many jobs try V-Half's block only (:func:`candidates`)
BIG_SHAPE = 12_288


def candidates(prob, max_jobs: int) -> Iterator[tuple[list[list[Job]], vblock.Block]]:
    """Job lists of the paper's blocks that fit the limit in the paper's count, whatever ``max_jobs``: the first
    that fits only (V-Half where it fits, else V-Min). V-Min's block trades time for memory: where V-Half's
    fits, V-Min's is the longer plan (pp 128, m 512, F/B/W 1/2/1, comm 0.5 at 0.75p: 6147 against 8672), and
    each squeeze costs about 1.5 s at that shape. On shapes above :data:`BIG_SHAPE` jobs V-Half's only: where
    only V-Min's fits, the building blocks of :mod:`.vblock` (which the portfolio runs wherever it runs these)
    were as short or shorter on every big shape measured (pp 32-128, m 4pp-8pp, F/B/W 1/2/1, comm 0.5 at 0.5p
    and V-Min's limit: 8 shapes, e.g. pp 128, m 512 at 0.5p 8642 against 8672)."""
    b0 = replace(prob, b=tuple(0.0 for _ in prob.b))  # B frees nothing; W frees the whole activation
    blocks = paper_blocks(prob.pp)
    if 3 * prob.m * prob.nc > BIG_SHAPE:
        blocks = blocks[:1]
    for blk in blocks:
        peak = vblock.pattern_peak(b0, blk, prob.limit)
        if peak is None or peak > prob.limit + 1e-9:
            continue
        seqs = vblock.build(b0, replace(blk, builder="paper-block"), cap=peak)
        if seqs is not None:
            yield seqs, replace(blk, builder="paper-block")
            return
