"""Re-timing and local search of finished job lists under a :class:`~.greedy.Problem` (no torch).

Every job list here is timed by THE timing kernel (:func:`pipeloom.sim.kernel.time_order`, compiled when
the C extension is built) and its memory by :mod:`pipeloom.core.rules`: :func:`time_seqs` and
:func:`result_of` check lists made elsewhere (lock-step passes, building blocks, template passes), the
adjacent-swap :func:`local_search` and the wider :func:`insertion_search` improve them, first
improvement on (makespan, sum of job ends), within the memory limit. Deterministic.
"""
from __future__ import annotations

from ...core.costs import Costs, MemModel
from ...core import rules
from ...core.errors import DeadlockError
from ...core.ir import Job, make_schedule
from ...sim import kernel
from ...sim.simulate import simulate
from .greedy import _EPS, PassResult, Problem

__all__ = ["polish_result", "result_of", "evaluate_seqs", "time_seqs", "local_search", "insertion_search"]


def polish_result(prob: Problem, best: PassResult, ls_budget: int) -> PassResult:
    """Adjacent-swap local search (:func:`local_search`) within ``ls_budget`` job re-timings."""
    evals = ls_budget // max(3 * prob.m * prob.nc, 1)
    if evals >= 20:
        seqs = local_search(prob, best.seqs, evals)
        r = result_of(prob, seqs, best.policy)
        if r is not None and r.makespan < best.makespan - _EPS:
            r.improved = True
            return r
    return best


def result_of(prob: Problem, seqs: list[list[Job]], policy) -> PassResult | None:
    """Time and check job lists made outside :func:`run_pass`; None on deadlock or over the limit."""
    r = time_seqs(prob, seqs, detail=True)
    if r is None:
        return None
    peak = _peaks(prob, seqs)
    if max(peak) > prob.limit + _EPS:
        return None
    return PassResult(seqs, r[0], peak, policy, r[2], starts=r[3])


def _peaks(prob: Problem, seqs) -> list[float]:
    table = rules.memory_deltas(prob.nc, prob.a, prob.b)
    return [rules.peak_memory(seq, prob.a, prob.b, table)[0] for seq in seqs]


def evaluate_seqs(prob: Problem, seqs: list[list[Job]]) -> tuple[float, list[float]] | None:
    """(makespan, per-device peak memory) of job lists under ``prob`` with pipeloom's simulator; None on deadlock."""
    sched = make_schedule("tmp", prob.pp, prob.vpp, prob.m, prob.placement,
                          seqs)
    costs = Costs(F=prob.dF, B=prob.dB, W=prob.dW, comm=prob.comm)
    try:
        r = simulate(sched, costs, MemModel(a=prob.a, b=prob.b))
    except DeadlockError:
        return None
    return r.makespan, r.peak_memory


def time_seqs(prob: Problem, seqs: list[list[Job]], detail: bool = False):
    """(makespan, sum of job ends) of job lists timed by the kernel (:func:`pipeloom.sim.kernel.time_order`,
    the simulator's rules); None on deadlock.

    With ``detail``: (makespan, sum of ends, per-device end of the last job, per-device start
    of the first job).
    """
    if not detail:
        return _timer(prob)(seqs)
    try:
        tm = kernel.time_order(seqs, prob.m, prob.tables, durations=prob.dur_table)
    except DeadlockError:
        return None
    return (tm.makespan, tm.total, [e[-1] if e else 0.0 for e in tm.end],
            [s[0] if s else 0.0 for s in tm.start])


def _timer(prob: Problem):
    """The kernel's summary timer for ``prob``'s shape: job lists -> (makespan, sum of ends) or None."""
    return kernel.order_timer(prob.m, prob.tables, prob.dur_table)


def local_search(prob: Problem, seqs: list[list[Job]], max_evals: int) -> list[list[Job]]:
    """Improve job lists by adjacent swaps on a device (first improvement on (makespan, sum of ends)).

    A swap is tried only when the two jobs do not depend on each other and the device's
    memory stays within the limit; each candidate is re-timed with :func:`time_seqs`.
    """
    limit = prob.limit + _EPS
    seqs = [list(s) for s in seqs]
    timer = _timer(prob)
    cur = timer(seqs)
    if cur is None:
        return seqs
    evals = 0

    table = rules.memory_deltas(prob.nc, prob.a, prob.b)

    def delta(job):
        k, _, c = job
        return table[k][c]

    improved = True
    while improved and evals < max_evals:
        improved = False
        for d in range(prob.pp):
            seq = seqs[d]
            memv = 0.0
            for i in range(1, len(seq)):
                x, y = seq[i - 1], seq[i]
                memv_before = memv
                memv += delta(x)
                if x[1] == y[1] and (x[2] == y[2] or (x[0] == y[0] and abs(x[2] - y[2]) == 1)):
                    continue  # same microbatch and a chain dependency (F->B->W, F->F, B->B)
                if memv_before + delta(y) > limit:
                    continue
                seq[i - 1], seq[i] = y, x
                evals += 1
                r = timer(seqs)
                if r is not None and (r[0] < cur[0] - _EPS or (r[0] < cur[0] + _EPS and r[1] < cur[1] - _EPS)):
                    cur = r
                    improved = True
                    memv = memv_before + delta(y)
                else:
                    seq[i - 1], seq[i] = x, y
                if evals >= max_evals:
                    break
            if evals >= max_evals:
                break
    return seqs


def insertion_search(prob: Problem, seqs: list[list[Job]], max_evals: int, window: int = 8) -> list[list[Job]]:
    """Improve job lists by moving one job up to ``window`` places earlier or later on its device.

    First improvement on (makespan, sum of job ends), re-timed by the kernel (:func:`time_seqs`'s
    timer); a move is tried only when the device's running memory stays within the limit. Wider than
    the adjacent swaps of :func:`local_search` (a move is a chain of swaps whose intermediate steps
    may be worse), and slower: opt-in via the ``insert_budget`` option of the V-shape builders.
    Deterministic (fixed scan order).
    """
    limit = prob.limit + _EPS
    seqs = [list(s) for s in seqs]
    timer = _timer(prob)
    cur = timer(seqs)
    if cur is None:
        return seqs
    table = rules.memory_deltas(prob.nc, prob.a, prob.b)
    evals = 0
    improved = True
    while improved and evals < max_evals:
        improved = False
        for d in range(prob.pp):
            seq = seqs[d]
            n = len(seq)
            mem = _RunningMemory(seq, table, limit)
            for i in range(n):
                for j in range(max(0, i - window), min(n, i + window + 1)):
                    if j == i or not mem.move_fits(i, j):
                        continue
                    x = seq.pop(i)
                    seq.insert(j, x)
                    evals += 1
                    r = timer(seqs)
                    if r is not None and (r[0] < cur[0] - _EPS or (r[0] < cur[0] + _EPS and r[1] < cur[1] - _EPS)):
                        cur = r
                        improved = True
                        mem = _RunningMemory(seq, table, limit)
                    else:
                        seq.pop(j)
                        seq.insert(i, x)
                    if evals >= max_evals:
                        return seqs
    return seqs


class _RunningMemory:
    """A device's running memory (:func:`pipeloom.core.rules.memory_deltas`, summed in list order) and the
    test "does the list still fit after moving the job at ``i`` to ``j``" in O(|i - j|) instead of
    O(len): the sums before the moved window are the same; the window is summed again in its new order;
    after it, the old sums hold whenever the window ends on the same float (the same additions from the
    same value), else the rest is summed again. So the answer is exactly that of summing the moved list."""

    __slots__ = ("delta", "limit", "pre", "head_ok", "tail_ok")

    def __init__(self, seq: list[Job], table, limit: float) -> None:
        self.limit = limit
        self.delta = delta = [table[k][c] for k, _, c in seq]
        n = len(seq)
        pre = [0.0] * (n + 1)  # pre[k]: after the first k jobs
        m = 0.0
        for k in range(n):
            m += delta[k]
            pre[k + 1] = m
        head_ok = [True] * (n + 1)  # pre[1..k] all within the limit
        for k in range(1, n + 1):
            head_ok[k] = head_ok[k - 1] and pre[k] <= limit
        tail_ok = [True] * (n + 2)  # pre[k..n] all within the limit
        for k in range(n, 0, -1):
            tail_ok[k] = tail_ok[k + 1] and pre[k] <= limit
        self.pre, self.head_ok, self.tail_ok = pre, head_ok, tail_ok

    def move_fits(self, i: int, j: int) -> bool:
        lo, hi = (j, i) if j < i else (i, j)
        if not self.head_ok[lo]:
            return False
        delta, limit = self.delta, self.limit
        window = [delta[i]] + delta[j:i] if j < i else delta[i + 1:j + 1] + [delta[i]]
        m = self.pre[lo]
        for x in window:
            m += x
            if m > limit:
                return False
        if m == self.pre[hi + 1]:
            return self.tail_ok[hi + 2]
        for k in range(hi + 1, len(delta)):
            m += delta[k]
            if m > limit:
                return False
        return True
