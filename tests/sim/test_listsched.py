"""The list-scheduling loop (pipeloom.sim.listsched): its board in Python and in C (_accel.c) against the
hand-written rule oracle (tests/ruleoracle.py), every constructive pass on it, and mutations of one copy of
a rule caught in a second."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ruleoracle import chunk_dur, oracle_needs, oracle_peaks, oracle_time

from pipeloom.core import rules
from pipeloom.core.costs import Costs, MemModel
from pipeloom.core.ir import Job, Kind, Placement, device_of
from pipeloom.schedule import zb_looped
from pipeloom.schedule.optimal import _greedy_orders
from pipeloom.schedule.search import greedy as g, lockstep, portfolio
from pipeloom.sim import kernel, listsched

C = kernel.ext


def _random_order(rnd: random.Random, pp: int, nc: int, m: int, placement, split: bool) -> list[Job]:
    """A random commit order that the oracle finds valid: each job after every job it needs."""
    todo = [Job(Kind.F, mb, c) for mb in range(m) for c in range(nc)]
    todo += [Job(k, mb, c) for mb in range(m) for c in range(nc) for k in ((Kind.B, Kind.W) if split else (Kind.BW,))]
    placed: set[Job] = set()
    out = []
    while todo:
        ready = [j for j in todo if all(any(x in placed for x in alts) for alts in oracle_needs(j, nc))]
        j = rnd.choice(ready)
        todo.remove(j)
        placed.add(j)
        out.append(j)
    return out


@st.composite
def cases(draw):
    pp = draw(st.integers(1, 4))
    vpp = draw(st.integers(1, 3))
    placement = draw(st.sampled_from([Placement.V, Placement.INTERLEAVED])) if vpp == 2 else Placement.INTERLEAVED
    nc = pp * vpp
    m = draw(st.integers(1, 4))
    vals = st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0]), min_size=nc, max_size=nc)
    dF, dB, dW = draw(vals), draw(vals), draw(vals)
    comm = draw(st.sampled_from([0.0, 0.25, 1.0]))
    a = draw(vals)
    b = [x * draw(st.sampled_from([0.0, 0.5, 1.0])) for x in a]
    split = draw(st.booleans())
    seed = draw(st.integers(0, 10 ** 6))
    return pp, nc, m, placement, dF, dB, dW, comm, a, b, split, seed


def _board_vs_oracle(case, impl: str = "python") -> bool:
    """Place a random valid order on the board (``impl``: Python or C) and compare every start, end and peak
    with the oracle's timing of the resulting per-device lists; True when all agree."""
    pp, nc, m, placement, dF, dB, dW, comm, a, b, split, seed = case
    order = _random_order(random.Random(seed), pp, nc, m, placement, split)
    tables = kernel.Rules.make(pp, nc, placement, comm)
    board = listsched.Board.make(pp, m, tables, dF, dB, dW, a, b)
    dev = [device_of(c, pp, placement) for c in range(nc)]
    jobs = [(dev[c], kernel.KIND_INDEX[k] * nc + c, mb) for k, mb, c in order]
    if impl == "python":
        ends = []
        for d, slot, mb in jobs:
            e = board.place(d, slot, mb)
            if e is None:
                return False
            ends.append(e)
        peak = board.peak
    else:
        out = C.board_replay(m, pp, tables.needs, tables.produces, board.dur, board.dmem, list(tables.dev), jobs)
        if out is None:
            return False
        _st, ends, peak = out
    seqs = [[] for _ in range(pp)]
    for job in order:
        seqs[dev[job[2]]].append(job)
    timed = oracle_time(seqs, nc, pp, placement, chunk_dur(dF, dB, dW), comm)
    assert timed is not None, "the oracle finds the random order invalid (test bug)"
    want = {}
    for d, seq in enumerate(seqs):
        for i, job in enumerate(seq):
            want[job] = timed[1][d][i]
    return [want[j] for j in order] == ends and list(peak) == oracle_peaks(seqs, a, b)


@settings(max_examples=120, deadline=None)
@given(case=cases())
def test_board_places_like_the_rule_oracle_python_and_c(case):
    """Python board, C board and the hand-written oracle agree on every start, end and peak."""
    assert _board_vs_oracle(case, "python")
    if C is not None:
        assert _board_vs_oracle(case, "c")


def _mutations():
    """One wrong copy of each rule, as a monkeypatch of core/rules.py."""
    needs, delta, dur, edge_comm = rules.needs, rules.memory_delta, rules.duration, rules.edge_comm

    def no_grad_edge(kind, mb, chunk, num_chunks):  # B no longer waits for the gradient from chunk + 1
        return tuple(x for x in needs(kind, mb, chunk, num_chunks) if x[0] != rules.GRAD or kind is Kind.W)

    def w_frees_a(kind, a, b):  # W frees a instead of a - b
        return -a if kind is Kind.W else delta(kind, a, b)

    def bw_is_b(kind, chunk, dF, dB, dW):  # the fused backward lasts B only
        return dB[chunk] if kind is Kind.BW else dur(kind, chunk, dF, dB, dW)

    def comm_on_act(kind, mb, chunk, num_chunks):  # F waits for its own chunk's ACT (a self-loop: stuck)
        return needs(kind, mb, chunk, num_chunks) + (((rules.ACT, mb, chunk),) if kind is Kind.F else ())

    def free_grad_edge(pp, num_chunks, placement, comm):  # a gradient crosses devices without comm
        return edge_comm(pp, num_chunks, placement, comm)[0], [0.0] * num_chunks

    return {"needs: B without GRAD": ("needs", no_grad_edge), "edge_comm: GRAD edge free": ("edge_comm", free_grad_edge), "memory_delta: W frees a": ("memory_delta", w_frees_a),
            "duration: BW = B": ("duration", bw_is_b), "needs: F waits for itself": ("needs", comm_on_act)}


#: small fixed cases covering split and fused backwards, comm, uneven costs, V and looped placement
_FIXED = [(2, 4, 3, Placement.V, [1.0, 2.0, 1.0, 1.5], [2.0, 1.0, 2.0, 2.0], [1.0, 0.5, 1.0, 1.0], 0.5,
           [1.0] * 4, [0.5] * 4, split, seed) for split in (True, False) for seed in range(3)]
_FIXED += [(3, 3, 2, Placement.INTERLEAVED, [1.0, 1.5, 1.0], [1.0, 2.0, 2.0], [0.5, 1.0, 1.0], 0.25,
            [1.0, 1.0, 0.5], [0.5, 0.25, 0.5], split, 7) for split in (True, False)]


def _agrees(case) -> bool:
    try:
        return _board_vs_oracle(case)
    except ValueError:  # the board refuses tables whose rules contradict each other
        return False


_GREEDY = [g.make_problem(3, 2, 5, Placement.V, Costs(F=1.0, B=2.0, W=1.0, comm=0.5), MemModel(), 1.5),
           g.make_problem(2, 2, 4, Placement.INTERLEAVED, Costs(F=1.0, B=1.0, W=1.0), MemModel(), None)]


def _greedy_results(run) -> list:
    out = []
    for prob in _GREEDY:
        try:  # (made again: a Problem derives its tables from core.rules)
            prob = g.make_problem(prob.pp, prob.vpp, prob.m, prob.placement, Costs(F=prob.dF, B=prob.dB, W=prob.dW,
                                  comm=prob.comm), MemModel(), None if prob.limit == float("inf") else prob.limit)
        except ValueError:  # the board refuses contradicting tables
            out.append("refused")
            continue
        for pol in portfolio.policy_grid(prob)[:6]:
            try:
                r = run(prob, pol)
            except ValueError:  # the board refuses contradicting tables
                r = "refused"
            out.append(r if r is None or r == "refused" else (r.seqs, r.peak, r.makespan))
    return out


@pytest.mark.parametrize("name", list(_mutations()))
def test_a_mutated_rule_is_caught_in_seconds(name, monkeypatch):
    """A wrong copy of a rule in core/rules.py is caught by the oracle comparison above; the Python greedy pass
    (on the board) changes with it, and so does the C pass (run_pass reads the same tables on the compiled board),
    which gives exactly the Python pass's (wrong) results. (The greedy runs no fused backward.)"""
    assert all(_board_vs_oracle(c) for c in _FIXED)
    forms = {"python": g._run_pass_py} | ({"c": g._run_pass_c} if C is not None else {})
    before = {k: _greedy_results(f) for k, f in forms.items()}
    attr, fn = _mutations()[name]
    monkeypatch.setattr(rules, attr, fn)
    kernel._make_rules.cache_clear()
    try:
        assert not all(_agrees(c) for c in _FIXED)
        if attr != "duration":
            py = _greedy_results(forms["python"])
            assert py != before["python"], "the Python greedy pass did not see the mutated rule"
            if "c" in forms:
                c = _greedy_results(forms["c"])
                assert c != before["c"], "the C greedy pass did not see the mutated rule"
                assert c == py, "the C greedy pass and the Python pass differ under the mutated rule"
    finally:
        kernel._make_rules.cache_clear()


def test_every_constructive_pass_places_its_jobs_through_the_board(monkeypatch):
    """The greedy pass, the template pass, the lock-step pass and the solver's warm start all read readiness
    from :meth:`Board.ready` and commit through :meth:`Board.commit` (so a rule is edited in one place)."""
    calls: dict[str, int] = {}
    real_ready, real_commit = listsched.Board.ready, listsched.Board.commit

    def ready(self, slot, mb):
        calls["ready"] = calls.get("ready", 0) + 1
        return real_ready(self, slot, mb)

    def commit(self, d, slot, mb, start):
        calls["commit"] = calls.get("commit", 0) + 1
        return real_commit(self, d, slot, mb, start)

    monkeypatch.setattr(listsched.Board, "ready", ready)
    monkeypatch.setattr(listsched.Board, "commit", commit)
    prob = g.make_problem(3, 2, 4, Placement.V, Costs(F=1.0, B=2.0, W=1.0, comm=0.5), MemModel(), None)
    looped = g.make_problem(2, 2, 4, Placement.INTERLEAVED, Costs(F=1.0, B=2.0, W=1.0, comm=0.5), MemModel(), None)
    runs = {
        "greedy": lambda: g._run_pass_py(prob, g.Policy()),
        "template": lambda: [zb_looped.template_pass_py(looped, [zb_looped.fb_order(2, 2, 4, d, w) for d, w in
                                                                  enumerate(zb_looped.warmups(looped, t))], t)
                             for t in zb_looped.template_grid()[:3]],
        "lockstep": lambda: lockstep._one_pass_py(prob, True, True, None),
        "warm start": lambda: _greedy_orders(3, 4, 6, Placement.V, True, [1.0] * 6, [2.0] * 6, [1.0] * 6, 0.5,
                                             [1.0] * 6, [0.5] * 6, None, False),
    }
    for name, run in runs.items():
        calls.clear()
        assert run(), name
        njobs = 3 * 4 * 6 if name != "template" else 3 * 4 * 4
        assert calls.get("commit", 0) >= njobs and calls.get("ready", 0) > 0, (name, calls)
