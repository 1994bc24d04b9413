"""The validator's vectorised path (builder witness) agrees with the job-by-job checks."""
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom import Job, Kind, Schedule, validate
from pipeloom.schedule.planning import make_spec, plan
from pipeloom.schedule.search import greedy as _greedy
from pipeloom.schedule import validate as vmod
from pipeloom.core.costs import MemModel

pytestmark = pytest.mark.skipif(not _greedy.accelerated(), reason="C extension not built (pip install -e . builds it)")


def _plain(s: Schedule) -> Schedule:
    """The same schedule without its witness (forces the job-by-job checks)."""
    return Schedule(s.name, s.pp, s.vpp, s.microbatches, s.placement, s.devices, s.overlapped, dict(s.meta))


def _mutate(s: Schedule, rng: random.Random) -> tuple[Schedule, float | None]:
    devs = [list(seq) for seq in s.devices]
    w = [list(x) for x in s.witness]
    limit = s.meta.get("mem_limit")
    what = rng.choice(["swap", "far_swap", "drop", "dup", "move", "kind", "limit", "rank", "none"])
    d = rng.randrange(s.pp)
    n = len(devs[d])
    i = rng.randrange(n)
    if what == "swap" and n > 1:  # neighbours: may break a dependency, may not
        j = min(i + 1, n - 1) if i + 1 < n else i - 1
        devs[d][i], devs[d][j] = devs[d][j], devs[d][i]
    elif what == "far_swap":
        j = rng.randrange(n)
        devs[d][i], devs[d][j] = devs[d][j], devs[d][i]
        w[d][i], w[d][j] = w[d][j], w[d][i]
    elif what == "drop":
        del devs[d][i], w[d][i]
    elif what == "dup":
        devs[d].insert(i, devs[d][i])
        w[d].insert(i, w[d][i])
    elif what == "move" and s.pp > 1:
        e = (d + 1) % s.pp
        devs[e].append(devs[d].pop(i))
        w[e].append(w[d].pop(i) + 10 ** 9)
    elif what == "kind":
        k, mb, c = devs[d][i]
        devs[d][i] = Job(Kind.BW if k is not Kind.BW else Kind.B, mb, c)
    elif what == "limit" and limit is not None:
        limit = limit - rng.choice([0.25, 0.5, 1.0])
    elif what == "rank":
        w[d][i] = rng.randrange(-5, 10 ** 6)
    return Schedule(s.name, s.pp, s.vpp, s.microbatches, s.placement, devs, s.overlapped, dict(s.meta),
                    tuple(w)), limit


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["zbv", "vhalf", "zbh1", "zbh2"]), st.integers(2, 6), st.integers(1, 12),
       st.sampled_from([None, "1p", "1.5p", "2p"]), st.integers(0, 10 ** 6))
def test_fast_path_agrees_with_job_by_job_checks(name, pp, m, limit, seed):
    vpp = 1 if name.startswith("zbh") else 2
    spec = make_spec(pp=pp, microbatches=m, vpp=vpp, mem_limit=limit)
    s = plan(name, spec)
    if s.witness is None:  # built by a local search or a safety net: nothing to prove with
        return
    mem = MemModel()
    assert vmod._proven_valid(s, mem, spec.mem_limit)
    assert validate(_plain(s), mem=mem, mem_limit=spec.mem_limit) == []
    rng = random.Random(seed)
    for _ in range(4):
        bad, lim = _mutate(s, rng)
        slow = validate(_plain(bad), mem=mem, mem_limit=lim)
        if vmod._proven_valid(bad, mem, lim):
            assert slow == [], f"fast path accepted an invalid schedule: {slow[:2]}"
        old = vmod.FAST_MIN_JOBS
        vmod.FAST_MIN_JOBS = 0
        try:
            assert validate(bad, mem=mem, mem_limit=lim) == slow
        finally:
            vmod.FAST_MIN_JOBS = old


def test_large_plan_takes_the_fast_path(monkeypatch):
    calls = []
    real = vmod._proven_valid

    def spy(*a):
        calls.append(real(*a))
        return calls[-1]

    monkeypatch.setattr(vmod, "_proven_valid", spy)
    s = plan("zbv", make_spec(pp=8, microbatches=256, vpp=2, mem_limit="1p"))
    assert s.num_jobs >= vmod.FAST_MIN_JOBS and calls == [True]
    # a wrong witness is not trusted: the job-by-job checks run and find the schedule valid anyway
    w = tuple(tuple(reversed(x)) for x in s.witness)
    flipped = Schedule(s.name, s.pp, s.vpp, s.microbatches, s.placement, s.devices, witness=w)
    assert validate(flipped, mem_limit=8.0) == [] and calls[-1] is False
    # and a real violation is reported with its message even though the witness came along
    assert any("exceeds the limit" in v for v in validate(s, mem_limit=5.0))
