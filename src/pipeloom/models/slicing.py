"""Cut a model given as a list of layers into pipeline chunk modules (for :class:`PipelineExecutor`).

``chunks`` is the per-global-chunk list of layer indices, e.g. ``Partition.chunks`` from
:mod:`pipeloom.partition` or :func:`pipeloom.models.llama.even_layer_split`. The optional
``pre`` module (embedding) runs first in chunk 0, the optional ``post`` module (norm + head) last
in the final chunk.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from torch import nn


def chunk_modules(layers: Sequence[nn.Module], chunks: Sequence[Sequence[int]], which: Iterable[int], *,
                  pre: nn.Module | None = None, post: nn.Module | None = None) -> dict[int, nn.Module]:
    """Global chunk id -> ``nn.Sequential`` of its layers, for the chunks in ``which``.

    Layers are shared, not copied: build the full model on every rank (or on the meta device and
    materialise only what this returns) and keep the modules of this rank's chunks.
    """
    flat = [i for c in chunks for i in c]
    if flat != list(range(len(layers))):
        raise ValueError(f"chunks must list layers 0..{len(layers) - 1} once each, contiguous and in order; "
                         f"got {[list(c) for c in chunks]}")
    if any(len(c) == 0 for c in chunks):
        raise ValueError("every chunk needs at least one layer")
    n = len(chunks)
    out: dict[int, nn.Module] = {}
    for k in which:
        if not 0 <= k < n:
            raise ValueError(f"chunk {k} out of range 0..{n - 1}")
        mods = ([pre] if (k == 0 and pre is not None) else []) + [layers[i] for i in chunks[k]]
        if k == n - 1 and post is not None:
            mods.append(post)
        out[k] = nn.Sequential(*mods)
    return out
