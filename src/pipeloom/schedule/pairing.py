"""F&B pairing: run the forward of one microbatch and the backward of another as one overlapped pair, on any
schedule (no torch).

DualPipe(V) builds its pairs into its phases (:mod:`pipeloom.schedule.dualpipe`); this pass adds them to a
schedule that has none: ``zbv`` (its steady state alternates F and B of different microbatches), or 1F1B and
the interleaved 1F1B, which gives Megatron-Core's *combined 1F1B* (the EP all-to-all of one microbatch's
forward hidden behind another's backward, and back: ``--overlap-moe-expert-parallel-comm``, the "EP A2A
overlap" of its MoE docs). The order of every device stays as it is; only ``Schedule.overlapped`` grows.

Pairing rule: jobs ``i`` and ``i + 1`` of a device are a candidate when one is an F and the other a B or BW of
another microbatch, neither already in a pair. Candidates are tried in device order, device after device; one
is kept when the schedule, timed with ``costs`` (whose ``a2a_F``/``a2a_B`` say what a pair hides,
:func:`pipeloom.core.costs.pair_hidden`), neither deadlocks (a pair starts only when both jobs are ready) nor
gets longer. So pairing never makes a schedule slower under the costs it was made for, and with no
communication to hide it adds no pair that costs time.
"""
from __future__ import annotations

import dataclasses

from ..core.costs import Costs
from ..core.errors import DeadlockError
from ..core.ir import Kind, Schedule
from ..sim.simulate import simulate
from ..core.rules import EPS as _EPS


def pair_forward_backward(schedule: Schedule, costs: Costs | None = None) -> Schedule:
    """``schedule`` with the pairs of the module docstring's rule marked (``Schedule.overlapped``), timed with
    ``costs`` (default unit costs)."""
    costs = costs or Costs()
    base = dataclasses.replace(schedule, witness=None)
    best = simulate(base, costs).makespan
    pairs = set(base.overlapped)
    taken = {(d, k) for d, i in pairs for k in (i, i + 1)}
    for d, seq in enumerate(base.devices):
        for i in range(len(seq) - 1):
            a, b = seq[i], seq[i + 1]
            if (d, i) in taken or (d, i + 1) in taken or a.mb == b.mb:
                continue
            kinds = {a.kind, b.kind}
            if Kind.F not in kinds or not kinds & {Kind.B, Kind.BW}:
                continue
            trial = dataclasses.replace(base, overlapped=frozenset(pairs | {(d, i)}))
            try:
                t = simulate(trial, costs).makespan
            except DeadlockError:
                continue
            if t <= best + _EPS:
                pairs.add((d, i))
                taken |= {(d, i), (d, i + 1)}
                best = min(best, t)
    return dataclasses.replace(base, overlapped=frozenset(pairs))


__all__ = ["pair_forward_backward"]
