"""THE dependency and memory rules of a schedule, in one place (no torch).

Every engine that times, checks or runs a schedule (the simulator, the validator, the greedy
and CP-SAT searches, the run-log replay, the runtime's comm plan and the memory tracer) takes
these rules from here; none types them out again.

Events. A job completes one or two *events* of its (microbatch, chunk):

    ACT    the forward activation of (m, k) exists           made by F(m, k)
    GRAD   the input gradient of (m, k) exists               made by B(m, k) or BW(m, k)
    WGRAD  the weight gradient of (m, k) is accumulated      made by W(m, k) or BW(m, k)

Dependencies (what a job needs before it may start):

    F(m, k)    ACT(m, k-1)                  (k > 0; chunk 0 reads the microbatch itself)
    B(m, k)    ACT(m, k) and GRAD(m, k+1)   (k < last; the last chunk computes the loss gradient)
    BW(m, k)   the same as B(m, k)
    W(m, k)    GRAD(m, k)                   (the weight grad uses what B kept)

An edge whose producer runs on another device costs ``comm`` (:func:`crosses`); on the same
device nothing. ``ACT(m, k-1) -> F(m, k)`` and ``GRAD(m, k+1) -> B(m, k)`` are the only edges that
can cross devices (they are the pipeline's sends); ``ACT(m, k) -> B(m, k)`` and
``GRAD(m, k) -> W(m, k)`` always stay on one device.

Memory (units of one full-stage microbatch activation, per chunk pass; see :class:`MemModel`):
F allocates ``a(k)``, B frees ``b(k)``, W frees ``a(k) - b(k)``, BW frees ``a(k)``.

Durations: F ``F(k)``, B ``B(k)``, W ``W(k)``, BW ``B(k) + W(k)``.
"""
from __future__ import annotations

from typing import Sequence

from .ir import Job, Kind, Placement, device_of

ACT, GRAD, WGRAD = 0, 1, 2
EVENT_NAMES = ("ACT", "GRAD", "WGRAD")

#: the tolerance of every comparison of a time or an amount of memory (with each other, or with a limit) in the
#: planners, the validator and the post-passes: sums of durations and memory deltas drift in the last bits
EPS = 1e-9

#: the events each kind of job completes
PRODUCES: dict[Kind, tuple[int, ...]] = {
    Kind.F: (ACT,),
    Kind.B: (GRAD,),
    Kind.W: (WGRAD,),
    Kind.BW: (GRAD, WGRAD),
}


def needs(kind: Kind, mb: int, chunk: int, num_chunks: int) -> tuple[tuple[int, int, int], ...]:
    """The events ``(event, microbatch, chunk)`` job ``kind`` of (``mb``, ``chunk``) waits for."""
    if kind is Kind.F:
        return ((ACT, mb, chunk - 1),) if chunk > 0 else ()
    if kind is Kind.W:
        return ((GRAD, mb, chunk),)
    if chunk < num_chunks - 1:  # B or BW
        return ((ACT, mb, chunk), (GRAD, mb, chunk + 1))
    return ((ACT, mb, chunk),)


def handoff(kind: Kind, mb: int, chunk: int, num_chunks: int) -> tuple[tuple[int, int, int], int] | None:
    """The event a job hands to a job of another chunk, and that chunk: F's ACT goes up to ``chunk + 1``,
    B's or BW's GRAD down to ``chunk - 1``; None for the last chunk's F, chunk 0's B and every W.
    (These are the only edges of :func:`needs` between chunks, hence the pipeline's messages.)"""
    if kind is Kind.F:
        return ((ACT, mb, chunk), chunk + 1) if chunk < num_chunks - 1 else None
    if kind is not Kind.W and chunk > 0:
        return ((GRAD, mb, chunk), chunk - 1)
    return None


def received(kind: Kind, mb: int, chunk: int, num_chunks: int) -> tuple[int, int, int] | None:
    """The event of another chunk a job waits for (the other end of :func:`handoff`), or None."""
    return next((ev for ev in needs(kind, mb, chunk, num_chunks) if ev[2] != chunk), None)


def job_needs(job: Job, num_chunks: int) -> tuple[tuple[int, int, int], ...]:
    """:func:`needs` of a :class:`Job`."""
    return needs(job[0], job[1], job[2], num_chunks)


def producers(event: int, mb: int, chunk: int, *, split: bool | None = None) -> tuple[Job, ...]:
    """The jobs that can complete ``event`` of (``mb``, ``chunk``): for GRAD and WGRAD, B/W or BW
    (``split`` True: only the B/W job, False: only BW, None: both candidates)."""
    if event == ACT:
        return (Job(Kind.F, mb, chunk),)
    single = Kind.B if event == GRAD else Kind.W
    if split is None:
        return (Job(single, mb, chunk), Job(Kind.BW, mb, chunk))
    return (Job(single if split else Kind.BW, mb, chunk),)


def dependencies(job: Job, num_chunks: int, *, split: bool) -> tuple[Job, ...]:
    """The jobs ``job`` waits for, in a schedule whose backward is ``split`` into B/W (else fused BW)."""
    return tuple(p for ev, mb, c in job_needs(job, num_chunks) for p in producers(ev, mb, c, split=split))


def crosses(producer_chunk: int, consumer_chunk: int, pp: int, placement: Placement | str) -> bool:
    """True when an edge between the two chunks runs between devices (it then costs ``comm``)."""
    return device_of(producer_chunk, pp, placement) != device_of(consumer_chunk, pp, placement)


def edge_comm(pp: int, num_chunks: int, placement: Placement | str, comm: float) -> tuple[list[float], list[float]]:
    """Per chunk ``k``: the comm on the forward edge into ``k`` (from ``k-1``) and on the backward
    edge into ``k`` (from ``k+1``); 0 where the edge stays on one device or does not exist.
    The tables the hot loops index instead of calling :func:`crosses`."""
    dev = [device_of(c, pp, placement) for c in range(num_chunks)]
    fwd = [0.0] + [comm if dev[c] != dev[c - 1] else 0.0 for c in range(1, num_chunks)]
    bwd = [comm if dev[c] != dev[c + 1] else 0.0 for c in range(num_chunks - 1)] + [0.0]
    return fwd, bwd


def memory_delta(kind: Kind, a: float, b: float) -> float:
    """Change of a device's activation memory when a job of ``kind`` runs on a chunk that allocates
    ``a`` in F and frees ``b`` in B (so ``a - b`` in W)."""
    if kind is Kind.F:
        return a
    if kind is Kind.B:
        return -b
    if kind is Kind.W:
        return b - a
    return -a


def memory_deltas(num_chunks: int, a: Sequence[float], b: Sequence[float]) -> dict[Kind, list[float]]:
    """:func:`memory_delta` per kind and chunk, as tables for hot loops."""
    return {k: [memory_delta(k, a[c], b[c]) for c in range(num_chunks)] for k in Kind}


def duration(kind: Kind, chunk: int, dF: Sequence[float], dB: Sequence[float], dW: Sequence[float]) -> float:
    """How long a job of ``kind`` on ``chunk`` runs, given per-chunk F, B and W durations."""
    if kind is Kind.F:
        return dF[chunk]
    if kind is Kind.B:
        return dB[chunk]
    if kind is Kind.W:
        return dW[chunk]
    return dB[chunk] + dW[chunk]


def durations(num_chunks: int, dF: Sequence[float], dB: Sequence[float], dW: Sequence[float]) -> dict[Kind, list[float]]:
    """:func:`duration` per kind and chunk, as tables for hot loops."""
    return {k: [duration(k, c, dF, dB, dW) for c in range(num_chunks)] for k in Kind}


def peak_memory(seq: Sequence[Job], a: Sequence[float], b: Sequence[float],
                table: dict[Kind, list[float]] | None = None) -> tuple[float, list[float]]:
    """Peak and running memory after each job of one device's list (order alone decides it).

    ``table``: :func:`memory_deltas` of ``a`` and ``b`` when the caller has it (one table for all devices:
    building it per device costs O(chunks), which over pp devices is quadratic in pp)."""
    if table is None:
        table = memory_deltas(len(a), a, b)  # one lookup per job in the loop below (200k-job lists)
    cur, peak, trace = 0.0, 0.0, []
    append = trace.append
    for kind, _mb, c in seq:
        cur += table[kind][c]
        if cur > peak:
            peak = cur
        append(cur)
    return peak, trace
