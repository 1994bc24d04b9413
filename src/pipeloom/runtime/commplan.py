"""Which messages a schedule sends, and the order both ends of a link agree on (no torch).

Messages (the edges between chunks of :mod:`pipeloom.core.rules`: :func:`~pipeloom.core.rules.handoff`):

    ("act",  m, k)   output of F(m, k), needed by F(m, k+1)          k = 0 .. C-2
    ("grad", m, k)   input grad from B/BW(m, k), needed by B/BW(m, k-1)   k = 1 .. C-1

A message crosses devices only when ``device_of(k) != device_of(k±1)``; otherwise it is a local
hand-off (V placement turns chunk pp-1 -> pp on the same device) and never touches the network.

Link order. Every point-to-point op between two ranks goes into one sequence per unordered
pair ``{a, b}`` that both ranks derive from the schedule alone, so sends and receives match
one-to-one in order on any backend (NCCL matches P2P strictly in issue order per pair and
serialises a pair's ops on one stream; gloo would also allow tags). The sequence is sorted by
the end time of the producing job in a *sequential* unit-cost list schedule of the plan
(each device runs its jobs strictly in its list order, every job takes one time unit, a job
starts when its dependencies ended). Why this cannot deadlock: if rank ``a`` must issue a send
``s`` before a receive ``r`` on the link, then ``s`` was produced strictly earlier than ``r``
in a valid execution, so the job producing ``s`` cannot depend on ``r``; ranks issue receives
eagerly and a send as soon as its data exists and every earlier op on that link is issued, so
the first op any rank blocks on is always eventually issued by its peer (induction on the
unit-time order). Within one direction the order equals the sender's job order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..core import rules
from ..core.errors import DeadlockError
from ..core.ir import Job, Schedule
from ..sim import kernel


class Msg(NamedTuple):
    kind: str  # "act" | "grad"
    mb: int
    chunk: int  # the chunk that PRODUCES the message

    def __str__(self) -> str:
        return f"{self.kind}(mb={self.mb}, chunk {self.chunk}->{self.chunk + (1 if self.kind == 'act' else -1)})"


class Op(NamedTuple):
    send: bool
    peer: int  # pp rank (device) of the other end
    msg: Msg


@dataclass(frozen=True, slots=True)
class CommPlan:
    """Per device: the ordered ops on each link, and which message each job needs / produces."""

    links: tuple[dict[int, tuple[Op, ...]], ...]
    """``links[d][peer]`` = ops of device d on the link to ``peer``, in link order"""
    needs: dict[tuple[int, Job], tuple[tuple[Msg, int] | None, ...]]
    """(device, job) -> ((msg, src device) received over the network, or local) needed to start it"""

    def ops(self, device: int) -> dict[int, tuple[Op, ...]]:
        return self.links[device]


_MSG_KIND = {rules.ACT: "act", rules.GRAD: "grad"}


def produced(job: Job, sched: Schedule) -> tuple[Msg, int] | None:
    """The message a job produces and the device that consumes it (None if none, e.g. the last F)."""
    h = rules.handoff(job.kind, job.mb, job.chunk, sched.num_chunks)
    if h is None:
        return None
    (ev, mb, c), to_chunk = h
    return Msg(_MSG_KIND[ev], mb, c), sched.device_of(to_chunk)


def needed(job: Job, sched: Schedule) -> tuple[Msg, int] | None:
    """The message a job consumes and the device that produces it (None for F of chunk 0 etc.)."""
    ev = rules.received(job.kind, job.mb, job.chunk, sched.num_chunks)
    if ev is None:
        return None
    return Msg(_MSG_KIND[ev[0]], ev[1], ev[2]), sched.device_of(ev[2])


def unit_time_ends(sched: Schedule) -> list[list[int]]:
    """End time of every job when each device runs its list in order and every job takes 1.

    Raises ValueError if the lists block each other (an invalid schedule)."""
    ones = [[1.0] * len(seq) for seq in sched.devices]
    try:
        tm = kernel.time_order(sched.devices, sched.microbatches,
                               kernel.Rules.make(sched.pp, sched.num_chunks, sched.placement), job_durations=ones)
    except DeadlockError as e:
        stuck = ", ".join(f"device {d} at {j}" for d, _i, j, _w in e.stuck) or str(e)
        raise ValueError(f"schedule cannot execute: every device waits ({stuck})") from None
    return [[int(t) for t in ends] for ends in tm.end]


def build_comm_plan(sched: Schedule) -> CommPlan:
    """Derive the link orders and per-job message needs of ``sched`` (see the module docstring)."""
    ends = unit_time_ends(sched)
    per_pair: dict[tuple[int, int], list[tuple[tuple[int, int, int], int, int, Msg]]] = {}
    needs: dict[tuple[int, Job], tuple[tuple[Msg, int] | None, ...]] = {}
    for d, i, j in sched.jobs():
        p = produced(j, sched)
        if p is not None and p[1] != d:
            msg, dst = p
            key = (ends[d][i], d, i)
            per_pair.setdefault((min(d, dst), max(d, dst)), []).append((key, d, dst, msg))
        n = needed(j, sched)
        needs[(d, j)] = (n if (n is not None and n[1] != d) else None,)
    links: list[dict[int, list[Op]]] = [dict() for _ in range(sched.pp)]
    for (a, b), items in per_pair.items():
        items.sort(key=lambda t: t[0])
        for _, src, dst, msg in items:
            links[src].setdefault(dst, []).append(Op(True, dst, msg))
            links[dst].setdefault(src, []).append(Op(False, src, msg))
    return CommPlan(tuple({p: tuple(ops) for p, ops in lk.items()} for lk in links), needs)
