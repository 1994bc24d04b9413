"""Planning, validating and simulating are near-linear in the number of jobs, whatever the pipeline degree.

1F1B at pp 4096, m 1 (12 288 jobs) took about 150 s before (a memory table of all chunks rebuilt per device:
quadratic in pp; pp 65 536, the cap, ran for hours); it now takes well under a second of CPU. The bound
below is generous (a loaded 2-core machine)."""
import time

import pytest

from pipeloom import make_spec, plan, simulate
from pipeloom.schedule.validate import validate


@pytest.mark.parametrize("name,pp,m", [("1f1b", 4096, 1), ("fthenb", 4096, 2), ("eager1f1b", 2048, 1)])
def test_large_pp_plans_in_seconds(name, pp, m):
    t0 = time.process_time()
    spec = make_spec(pp=pp, microbatches=m)
    sched = plan(name, spec)  # builds and validates
    res = simulate(sched, spec.costs, spec.mem)
    assert not validate(sched, mem=spec.mem)
    assert time.process_time() - t0 < 10
    # F 1 and BW 2 (B 1 + W 1), no comm: the classic (m - 1 + pp) * (F + BW)
    assert res.makespan == 3 * (m - 1 + pp)
    assert max(res.peak_memory) <= m
