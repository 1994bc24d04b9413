"""Planning, validating and simulating are near-linear in the number of jobs, whatever the pipeline degree.

1F1B at pp 4096, m 1 took about 150 s before (a memory table of all chunks rebuilt per device: quadratic in
pp; pp 65 536, the cap, ran for hours), ZB-H1 and ZB-V minutes (each device's chunks found by a scan of all
chunks), ZB-VPP tens of seconds (its template pass picked the next device by a scan of all devices); each
now takes about a second of CPU. The bound below is generous (a loaded 2-core machine)."""
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


@pytest.mark.slow  # 8-45 s on 2 busy cores: make test runs it, make test-fast does not
@pytest.mark.parametrize("name,vpp", [("zbh1", 1), ("zbv", 2), ("zbvpp", 2)])
def test_large_pp_search_builders_plan_in_seconds(name, vpp):
    pp, m = 16_384, 1  # before: ZB-H1 about 75 s of CPU, ZB-V 15 s, ZB-VPP minutes
    t0 = time.process_time()
    spec = make_spec(pp=pp, microbatches=m, vpp=vpp)
    sched = plan(name, spec)
    res = simulate(sched, spec.costs, spec.mem)
    assert time.process_time() - t0 < 10
    # one microbatch: its forward crosses every chunk, then its backward comes back; W fills no gap on the
    # critical path, so the makespan is at least the chain of F and B, plus the last device's W
    nc = pp * vpp
    assert res.makespan >= 2 * nc / vpp + 1 / vpp - 1e-9


def test_dualpipev_refuses_a_quadratic_program_in_one_line():
    """dualpipev at m < 2pp builds the 2pp-microbatch program (pp x 2pp slots): pp 65 536, m 1 ran for hours;
    now it is refused at once with what to give instead, and pp 1024 (the largest declared) still builds."""
    from pipeloom.core.errors import ScheduleError

    t0 = time.process_time()
    with pytest.raises(ScheduleError, match=r"give m >= 2pp = 131072 or pp <= 1024"):
        plan("dualpipev", make_spec(pp=65_536, microbatches=1, vpp=2))
    assert time.process_time() - t0 < 1
