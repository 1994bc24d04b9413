"""Measured per-chunk costs of a tensor-parallel run (``pipeloom run --tp N --costs measured``; no torch).

Every rank of a TP run logs its jobs, and the ``N`` ranks of a stage log the same jobs: the reader sees them as
one pipeline several times over (same ``pp_rank`` and ``dp_rank``). The TP index of a rank is its global rank
modulo ``N`` (TP is the innermost mesh dimension, :func:`pipeloom.runtime.tp_run.tp_groups`), so the ranks of
one TP index form a complete pipeline (one per dp replica). :func:`fit_tp_chunk_costs` fits each such pipeline
as a run without TP is fitted (:func:`pipeloom.trace.check.fit_chunk_costs`: per chunk and kind the median job
duration) and takes, per chunk and kind, the largest of the ``N`` fits, and the largest comm latency: a TP job
ends when its slowest rank does (its collectives wait for every peer), so the slowest rank's time is the cost
the stage pays.
"""
from __future__ import annotations

import dataclasses

from ..core.costs import Costs
from .check import CheckError, fit_chunk_costs
from .run import RunLog

__all__ = ["tp_index_runs", "fit_tp_chunk_costs"]


def tp_index_runs(run: RunLog, tp: int) -> list[RunLog]:
    """``run`` split by TP index (global rank % ``tp``): one :class:`RunLog` per index, each holding one rank per
    (dp replica, stage)."""
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be an integer >= 1, got {tp!r}")
    out = []
    for k in range(tp):
        ranks = [r for r in run.ranks if r.rank % tp == k]
        if not ranks:
            raise CheckError(f"no log of tensor-parallel index {k} (ranks r with r % {tp} == {k}): "
                             f"{len(run.ranks)} ranks logged, a tp={tp} run logs pp*dp*tp")
        out.append(dataclasses.replace(run, ranks=ranks, warnings=list(run.warnings)))
    return out


def fit_tp_chunk_costs(run: RunLog, tp: int, *, unit: float = 1e-3) -> Costs:
    """Per-chunk F, B, W and the comm latency of a ``tp``-way tensor-parallel run (module docstring), in units of
    ``unit`` seconds: per chunk and kind the largest of the TP indices' fitted costs. ``tp == 1`` is
    :func:`~pipeloom.trace.check.fit_chunk_costs` itself."""
    if tp == 1:
        return fit_chunk_costs(run, unit=unit)
    fits = [fit_chunk_costs(sub, unit=unit) for sub in tp_index_runs(run, tp)]
    nc = run.schedule.num_chunks
    per = [f.per_chunk(nc) for f in fits]  # [(F, B, W)] per TP index
    F, B, W = (tuple(max(p[i][c] for p in per) for c in range(nc)) for i in range(3))
    return dataclasses.replace(fits[0], F=F, B=B, W=W, comm=max(f.comm for f in fits))
