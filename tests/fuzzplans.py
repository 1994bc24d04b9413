"""Helpers to fuzz the runtime (no torch): random valid plans and a model of the P2P transport.

:func:`random_plan` draws a random *valid* schedule: devices pick random ready jobs in turn, so
microbatches run out of order, B/W splits and BW mix freely, and the lists never deadlock.

:func:`check_transport` replays a schedule's comm plan under strict NCCL-like rules (per link,
op i completes only after op i-1 and only once both ends issued it; a rank issues a receive as
soon as its link cursor reaches it and a send once its job ran) and returns the problems found
(empty = every rank finishes and every message matches).
"""
from __future__ import annotations

import random

from pipeloom.core.ir import Job, Kind, Placement, Schedule, device_of
from pipeloom.runtime.commplan import build_comm_plan, needed, produced


def random_plan(pp: int, vpp: int, microbatches: int, *, placement: str = "interleaved", seed: int = 0,
                split: float = 0.5, name: str = "random") -> Schedule:
    """A random valid schedule; ``split`` = probability that a (mb, chunk) gets B+W instead of BW."""
    rng = random.Random(seed)
    nc = pp * vpp
    pl = Placement(placement)
    todo: list[list[Job]] = [[] for _ in range(pp)]
    for m in range(microbatches):
        for k in range(nc):
            d = device_of(k, pp, pl)
            todo[d].append(Job(Kind.F, m, k))
            if rng.random() < split:
                todo[d] += [Job(Kind.B, m, k), Job(Kind.W, m, k)]
            else:
                todo[d].append(Job(Kind.BW, m, k))
    done: set[tuple[str, int, int]] = set()

    def ready(j: Job) -> bool:
        if j.kind is Kind.F:
            return j.chunk == 0 or ("F", j.mb, j.chunk - 1) in done
        if j.kind is Kind.W:
            return ("G", j.mb, j.chunk) in done
        return ("F", j.mb, j.chunk) in done and (j.chunk == nc - 1 or ("G", j.mb, j.chunk + 1) in done)

    out: list[list[Job]] = [[] for _ in range(pp)]
    while any(todo):
        cands = [(d, j) for d in range(pp) for j in todo[d] if ready(j)]
        d, j = cands[rng.randrange(len(cands))]
        todo[d].remove(j)
        out[d].append(j)
        ev = {Kind.F: ("F",), Kind.B: ("G",), Kind.W: ("W",), Kind.BW: ("G", "W")}[j.kind]
        done |= {(e, j.mb, j.chunk) for e in ev}
    return Schedule(name, pp, vpp, microbatches, pl, tuple(tuple(x) for x in out), meta={"seed": seed})


def check_transport(sched: Schedule, plan=None) -> list[str]:
    """Replay the comm plan (default: :func:`build_comm_plan`) under strict in-order link
    semantics; list mismatches or deadlocks."""
    plan = plan or build_comm_plan(sched)
    problems: list[str] = []
    # link symmetry: a's ops to b and b's ops to a must be the same messages, directions flipped
    for a in range(sched.pp):
        for b, ops in plan.ops(a).items():
            other = plan.ops(b).get(a, ())
            mine = [(op.msg, op.send) for op in ops]
            theirs = [(op.msg, not op.send) for op in other]
            if mine != theirs:
                problems.append(f"link {a}-{b}: the two ends disagree on the op order")
    if problems:
        return problems
    pp = sched.pp
    pos = [0] * pp
    cursor = [{p: 0 for p in plan.ops(d)} for d in range(pp)]
    produced_msgs: list[set] = [set() for _ in range(pp)]  # sends whose data exists
    issued: dict[tuple[int, int, int], bool] = {}  # (rank, peer, index) -> issued
    completed: dict[tuple[int, int], int] = {}  # (min, max) link -> ops completed in order
    arrived: list[set] = [set() for _ in range(pp)]
    while True:
        progress = False
        for d in range(pp):  # issue ops the cursors can reach
            for p, ops in plan.ops(d).items():
                c = cursor[d][p]
                while c < len(ops) and (not ops[c].send or ops[c].msg in produced_msgs[d]):
                    issued[(d, p, c)] = True
                    c += 1
                    progress = True
                cursor[d][p] = c
        for d in range(pp):  # complete matched ops, strictly in order per link
            for p, ops in plan.ops(d).items():
                if d > p:
                    continue
                key = (d, p)
                i = completed.get(key, 0)
                while i < len(ops) and issued.get((d, p, i)) and issued.get((p, d, i)):
                    op = ops[i]
                    arrived[p if op.send else d].add(op.msg)
                    i += 1
                    progress = True
                completed[key] = i
        for d in range(pp):  # run jobs whose inputs are here
            while pos[d] < len(sched.devices[d]):
                j = sched.devices[d][pos[d]]
                n = needed(j, sched)
                if n is not None and n[1] != d and n[0] not in arrived[d]:
                    break
                pr = produced(j, sched)
                if pr is not None and pr[1] != d:
                    produced_msgs[d].add(pr[0])
                pos[d] += 1
                progress = True
        if not progress:
            break
    stuck = [f"device {d} at {sched.devices[d][pos[d]]}" for d in range(pp) if pos[d] < len(sched.devices[d])]
    if stuck:
        problems.append("transport deadlock: " + ", ".join(stuck))
    return problems
