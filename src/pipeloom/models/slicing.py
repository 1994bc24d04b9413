"""Cut a model's layers into pipeline chunks.

:func:`even_layer_split` is the default split of L layers into the schedule's chunks (no torch;
the analytic memory model counts with it too). :func:`chunk_modules` turns a model given as a list
of layers into pipeline chunk modules (for :class:`~pipeloom.runtime.executor.PipelineExecutor`):
``chunks`` is the per-global-chunk list of layer indices, e.g. ``Partition.chunks`` from
:mod:`pipeloom.partition` or :func:`even_layer_split`. The optional ``pre`` module (embedding)
runs first in chunk 0, the optional ``post`` module (norm + head) last in the final chunk.

torch is imported by :func:`chunk_modules` only, so the split is usable without it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:
    from torch import nn


def even_layer_split(n_layers: int, n_chunks: int) -> list[list[int]]:
    """Contiguous split of ``n_layers`` into ``n_chunks``; sizes filled round-robin
    (``size[j % n_chunks] += 1``, the uniform rule of :mod:`pipeloom.partition.layout`), so earlier chunks get the extra layers."""
    if n_chunks < 1 or n_layers < n_chunks:
        raise ValueError(f"cannot split {n_layers} layers into {n_chunks} chunks of at least one layer each")
    sizes = [0] * n_chunks
    for j in range(n_layers):
        sizes[j % n_chunks] += 1
    out, start = [], 0
    for s in sizes:
        out.append(list(range(start, start + s)))
        start += s
    return out


def chunk_modules(layers: Sequence[nn.Module], chunks: Sequence[Sequence[int]], which: Iterable[int], *,
                  pre: nn.Module | None = None, post: nn.Module | None = None) -> dict[int, nn.Module]:
    """Global chunk id -> ``nn.Sequential`` of its layers, for the chunks in ``which``.

    Layers are shared, not copied: build the full model on every rank (or on the meta device and
    materialise only what this returns) and keep the modules of this rank's chunks.
    """
    from torch import nn

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
