"""Lock-step ZB-V construction (private helper, no torch): one more candidate for :func:`.portfolio.search`.

This is pipeloom's own implementation of the *idea* of the official ZB-V generator (Qi et
al. 2024, "Pipeline Parallelism with Controllable Memory", and the ``zbv`` module of
sail-sg/zero-bubble-pipeline-parallelism), written against :class:`_greedy.Problem` so that it
takes per-chunk costs and memory, ``comm``, and any memory limit. It applies to V placement
with exactly two chunks per device (local chunk 0 = global chunk ``d`` going down, local chunk 1
= global chunk ``2pp-1-d`` coming back up); for any other shape :func:`candidates` yields nothing.

Unlike the event-driven greedy of :mod:`.greedy`, jobs are *appended device by device in
rounds* and timed as they are appended (a job starts when its device is free and its
dependencies, plus ``comm`` on cross-device edges, have ended: :meth:`pipeloom.sim.listsched.Board.place`
on the list-scheduling board, which reads the rules of :mod:`pipeloom.core.rules`; compiled in
``_accel.c`` as ``lockstep_pass``):

1. Warm-up, part 1: one forward of chunk 0 on every device; then, from the last device up,
   device ``d`` runs more chunk-0 forwards (each round also on every device above it) while
   they fit before the microbatch comes back on chunk 1 and while ``mem + a*(2+2d)`` fits the
   limit (headroom for the microbatches in flight), then its first chunk-1 forward.
2. Warm-up, part 2: from device 1 down, forwards are added in rounds alternating chunk 0 and
   chunk 1 (from the last device up to ``d``) until device ``d`` has at least as many
   forwards as device ``d-1`` and more chunk-1 forwards (unless ``d-1`` has run all m).
3. Steady state, ``2m`` rounds. Each round every device first runs one input-grad backward B:
   of its chunk 1 while chunk 1 has not run more Bs than chunk 0, else of chunk 0 when its
   input from device d+1 is there (always on the last device, or once chunk 1 is done), else
   of chunk 1 again. Devices running a chunk-0 B go first, from device pp-1 to 0, then those
   running a chunk-1 B, from device 0 to pp-1. Then every device runs one forward (chunk 1's
   when its input is ready, else chunk 0's, else none). Before each of
   these jobs pending weight-grad jobs W (oldest first) are run while they end before the job's
   cross-device input arrives (they fill the wait), and one more when the wait would push the
   device's bubble past the largest bubble allowed so far ("approved bubble"; ``fill_b`` /
   ``fill_f`` switch this on for B of chunk 1 / for F). A forward that would break the memory
   limit first runs pending Ws.
4. The remaining Ws run at the end.

The pass is repeated with the per-device bubbles of the previous pass as the approved
bubbles while the largest bubble shrinks (the official refinement), for the four
``(fill_b, fill_f)`` combinations. Every pass whose job lists are valid (all dependencies
placed before use, memory within the limit, every job exactly once) is a candidate; the
caller keeps the one with the smallest makespan. A pass that breaks a rule (possible for
shapes the construction was not made for: m < pp, tight limits, very uneven costs) is
dropped, never repaired.

Uneven costs across chunks (e.g. a heavy last chunk: loss and head) can mislead the construction:
it decides warm-up depths and W fills from the real durations, and those greedy decisions can
cost more than they save. The official generator, and torch's ``ZBVZeroBubble`` built from it, see
one F, B and W for every chunk. So ``candidates(prob, uniform=True)`` runs the same passes on
:func:`uniform` (every chunk at the mean duration of its kind, comm and memory unchanged); the
job lists are then timed with the real costs by the caller. Measured: pp 8, m 8, heavy last chunk
(F=B=W=1, twice that on the last chunk, comm 0.1) at torch's ZBV peak under torch's memory model:
86.8 from the real-cost passes, 80.4 from the uniform-cost ones (torch's ZBVZeroBubble: 80.8).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Iterator

from ...core import rules
from ...core.ir import Job, Kind, Placement
from ...sim import kernel, listsched
from .accel import accelerated, ext
from ...core.rules import EPS as _EPS

#: refinement passes per (fill_b, fill_f) combination at most
MAX_LEVELS = 8


@dataclass(frozen=True, slots=True)
class LockstepPolicy:
    """Identifies one lock-step pass (recorded in the schedule's meta as its 'policy')."""

    builder: str = "lockstep"
    fill_b: bool = True
    fill_f: bool = True
    level: int = 0
    """refinement pass (0: no approved bubble)"""
    costs: str = "real"
    """'real': built with the problem's durations; 'uniform': with :func:`uniform`'s (timed with the real ones)"""


class _Broken(Exception):
    """The construction broke a rule for this shape; the pass is dropped."""


def applies(prob) -> bool:
    return prob.vpp == 2 and prob.placement is Placement.V and prob.m >= 1


def uneven(prob) -> bool:
    """True when some kind (F, B or W) does not take the same time on every chunk."""
    return any(max(x) - min(x) > _EPS for x in (prob.dF, prob.dB, prob.dW))


def uniform(prob):
    """``prob`` with every chunk's F, B and W at the mean over chunks of its kind (comm, memory, limit kept)."""
    nc = prob.nc
    return replace(prob, dF=(sum(prob.dF) / nc,) * nc, dB=(sum(prob.dB) / nc,) * nc, dW=(sum(prob.dW) / nc,) * nc)


def _one_pass(prob, fill_b: bool, fill_f: bool, approved: list[float] | None):
    """One lock-step pass: (job lists per device, per-device bubble) or raises :class:`_Broken`.

    Runs :func:`_one_pass_py` (the specification) or, when built, its compiled form ``lockstep_pass`` in
    ``_accel.c`` (identical results: tests/schedule/test_lockstep_c.py)."""
    if accelerated():
        out = ext.lockstep_pass((prob.pp, prob.m, prob.limit + _EPS, _EPS, bool(fill_b), bool(fill_f)),
                                prob.tables.needs, prob.tables.produces, prob.dur_table,
                                prob.mem_tab, prob.tables.dev, prob.a,
                                None if approved is None else list(approved), Job, kernel.KINDS)
        if out is None:
            raise _Broken
        return out
    return _one_pass_py(prob, fill_b, fill_f, approved)


def _one_pass_py(prob, fill_b: bool, fill_f: bool, approved: list[float] | None):
    """The pass in Python on the list-scheduling board (:class:`pipeloom.sim.listsched.Board`): jobs are
    appended device by device and timed as appended (:meth:`~pipeloom.sim.listsched.Board.place`); the
    board reads readiness and memory from :mod:`pipeloom.core.rules`."""
    pp, m, nc = prob.pp, prob.m, prob.nc
    a = prob.a
    limit = prob.limit + _EPS
    board = listsched.Board.for_problem(prob)
    cur, done, dur, mnc = board.free, board.done, board.dur, board.mnc
    lo = list(range(pp))                      # local chunk 0 of device d
    hi = [nc - 1 - d for d in range(pp)]      # local chunk 1 of device d
    sF, sB, sW = (kernel.KIND_INDEX[k] * nc for k in (Kind.F, Kind.B, Kind.W))
    # slots: 0 = F(lo), 1 = F(hi), 2 = B(hi), 3 = B(lo), as the board's slot (kind index * nc + chunk)
    slot_of = [(sF + lo[d], sF + hi[d], sB + hi[d], sB + lo[d]) for d in range(pp)]
    cnt = [[0, 0, 0, 0] for _ in range(pp)]
    bub = [0.0] * pp
    pend: list[deque] = [deque() for _ in range(pp)]
    appr = approved if approved is not None else [-1.0] * pp
    max_appr = max(appr)
    ACT, GRAD = rules.ACT * mnc, rules.GRAD * mnc

    def allowed(d: int) -> float:
        """largest bubble device d may reach without a W being inserted to avoid it"""
        return max(max(bub), max_appr - appr[d])

    def put(d: int, slot: int) -> None:
        mb = cnt[d][slot]
        if mb >= m:
            raise _Broken
        js = slot_of[d][slot]
        r = board.ready(js, mb)
        if r < 0:
            raise _Broken
        s = cur[d] if cur[d] >= r else r
        if cnt[d][0] > 0:
            bub[d] += s - cur[d]
        if slot < 2 and not board.admits(d, js, limit):
            raise _Broken
        board.commit(d, js, mb, s)
        if slot >= 2:
            pend[d].append((mb, js - sB))
        cnt[d][slot] = mb + 1

    def put_w(d: int) -> None:
        if not pend[d]:
            raise _Broken
        mb, c = pend[d].popleft()
        board.commit(d, sW + c, mb, cur[d])

    def fill(d: int, slot: int, extra: bool) -> None:
        """run pending Ws that end before the job's cross-device input; one more if ``extra`` and
        the wait would exceed the allowed bubble"""
        mb = cnt[d][slot]
        if mb >= m:
            raise _Broken
        arr = board.arrival(slot_of[d][slot], mb)
        if arr is None:
            return
        while pend[d] and arr >= cur[d] + dur[sW + pend[d][0][1]] - _EPS:
            put_w(d)
        if extra and pend[d] and arr - cur[d] > allowed(d) - bub[d] + _EPS:
            put_w(d)

    # ---- warm-up, part 1
    for d in range(pp):
        put(d, 0)
    for d in range(pp - 1, -1, -1):
        if d < pp - 1:
            due = board.ready(slot_of[d][1], 0)  # F(0) of chunk hi[d]: its input from device d+1
            head = a[lo[d]] * (2 + 2 * d)
            while (board.mem[d] + head <= limit and cur[d] + dur[sF + lo[d]] <= due + _EPS and cnt[d][0] < m):
                for j in range(d + 1):
                    put(j, 0)
        put(d, 1)
    # ---- warm-up, part 2
    it = 0
    for d in range(1, pp):
        idle = 0
        while (cnt[d][0] + cnt[d][1] < cnt[d - 1][0] + cnt[d - 1][1]
               or cnt[d][1] <= cnt[d - 1][1] < m):
            placed = False
            for j in range(pp - 1, d - 1, -1):
                if cnt[j][it] < m:
                    put(j, it)
                    placed = True
            it = 1 - it
            idle = 0 if placed else idle + 1
            if idle >= 2:
                raise _Broken
    # ---- steady state
    for _ in range(2 * m):
        firsts, seconds = [], []          # B(lo) ranks (top-down), B(hi) ranks (bottom-up)
        for d in range(pp):
            if cnt[d][3] >= cnt[d][2]:
                seconds.append((d, 2))
            elif d == pp - 1 or cnt[d][2] >= m or done[GRAD + cnt[d][3] * nc + lo[d + 1]] >= 0:
                firsts.append((d, 3))
            else:
                seconds.append((d, 2))
        for d, slot in firsts[::-1] + seconds:
            if cnt[d][slot] >= m:
                continue
            fill(d, slot, extra=(slot == 3 or fill_b))
            put(d, slot)
        for d in range(pp):
            if cnt[d][1] >= m:
                continue
            slot = None
            if cnt[d][1] >= cnt[d][0]:
                slot = 0
            elif d == pp - 1 or done[ACT + cnt[d][1] * nc + hi[d + 1]] >= 0:
                slot = 1
            elif cnt[d][0] < m and (d == 0 or done[ACT + cnt[d][0] * nc + lo[d - 1]] >= 0):
                slot = 0
            if slot is None:
                continue
            while not board.admits(d, slot_of[d][slot], limit):
                put_w(d)
            fill(d, slot, extra=fill_f)
            put(d, slot)
    for d in range(pp):
        while pend[d]:
            put_w(d)
    if any(cnt[d] != [m, m, m, m] for d in range(pp)):
        raise _Broken
    return board.seqs, bub


def candidates(prob, max_jobs: int | None = None, *,
               uniform_costs: bool = False) -> Iterator[tuple[list[list[Job]], LockstepPolicy]]:
    """Job lists of every valid lock-step pass (see the module docstring), with their identity.

    ``max_jobs`` bounds the job placements summed over the passes (None: no bound). With
    ``uniform_costs`` the passes are built on :func:`uniform` (nothing when the costs are already
    even across chunks: the passes would repeat the real-cost ones); time them with the real costs.
    """
    if not applies(prob):
        return
    tag = "real"
    if uniform_costs:
        if not uneven(prob):
            return
        prob, tag = uniform(prob), "uniform"
    njobs = 6 * prob.m * prob.pp
    spent = 0
    for fill_b in (True, False):
        for fill_f in (True, False):
            approved = None
            best = None
            for level in range(MAX_LEVELS):
                if max_jobs is not None and spent + njobs > max_jobs:
                    return
                spent += njobs
                try:
                    seqs, bub = _one_pass(prob, fill_b, fill_f, approved)
                except _Broken:
                    break
                yield seqs, LockstepPolicy(fill_b=fill_b, fill_f=fill_f, level=level, costs=tag)
                worst = max(bub)
                if best is not None and worst >= best - _EPS:
                    break
                best = worst
                approved = bub
