"""The insertion search's memory test (localsearch._RunningMemory.move_fits) against the plain one: move the
job, sum the device's memory in list order, compare every running sum with the limit. Deltas that are not
exact binary fractions (1/3, 1/7, 0.1) make the window's sum differ in the last bit from the old running
sum, so both branches of the fast test (old sums reused / rest summed again) are exercised."""
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.core import rules
from pipeloom.core.ir import Job, Kind
from pipeloom.schedule.search.localsearch import _RunningMemory


def _plain_fits(seq, table, limit):
    m = 0.0
    for k, _mb, c in seq:
        m += table[k][c]
        if m > limit:
            return False
    return True


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**6), nc=st.integers(1, 3), n=st.integers(1, 40),
       a=st.sampled_from([1.0, 1 / 3, 0.1, 2.5]), frac=st.sampled_from([0.5, 1 / 7, 0.3]),
       slack=st.sampled_from([0.0, 0.5, 1.0, 3.0]))
def test_move_fits_is_the_plain_running_sum(seed, nc, n, a, frac, slack):
    rng = random.Random(seed)
    table = rules.memory_deltas(nc, [a * (c + 1) for c in range(nc)], [a * (c + 1) * frac for c in range(nc)])
    seq = [Job(rng.choice([Kind.F, Kind.F, Kind.B, Kind.W, Kind.BW]), rng.randrange(4), rng.randrange(nc))
           for _ in range(n)]
    # a limit near the list's own peak, so that some moves fit and some do not
    m, peak = 0.0, 0.0
    for k, _mb, c in seq:
        m += table[k][c]
        peak = max(peak, m)
    limit = peak - a + slack
    mem = _RunningMemory(seq, table, limit)
    for i in range(n):
        for j in range(max(0, i - 8), min(n, i + 9)):
            if j == i:
                continue
            moved = list(seq)
            moved.insert(j, moved.pop(i))
            want = _plain_fits(moved, table, limit)
            assert mem.move_fits(i, j) == want, (i, j)
