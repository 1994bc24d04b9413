"""Default plans at the depths real jobs use (pp 16-128): the candidates that make them good run at every size,
every plan reports its proven lower bound and gap, and deep plans are never slower than 1F1B at its memory.

Before, the building-block candidates were skipped above about 15 000 jobs: default ``vmin`` at pp 32, m 128
planned 1155 against 1F1B's 954 (and its own bound 887), and no plan above 400 jobs carried a bound."""
import json
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.cli import main
from pipeloom.core.ir import Placement
from pipeloom.schedule import registry
from pipeloom.schedule.planning import make_spec
from pipeloom.schedule.search import bounds, vblock
from pipeloom.schedule.validate import validate
from pipeloom.sim.simulate import simulate

EQUAL, ZB = "F=1,B=1,W=1,comm=0", "F=1,B=2,W=1,comm=0.5"
#: 1F1B's stage is the V's two chunks: twice each chunk cost, the same comm
STAGE = {EQUAL: "F=2,B=2,W=2,comm=0", ZB: "F=2,B=4,W=2,comm=0.5"}


def _plan(name, pp, m, costs=EQUAL, limit=None, vpp=2):
    spec = make_spec(pp=pp, vpp=vpp, microbatches=m, costs=costs, mem_limit=limit)
    s = registry.build(name, spec)
    return s, simulate(s, spec.costs, spec.mem), spec


def _onef1b(pp, m, costs):
    return _plan("1f1b", pp, m, STAGE[costs], vpp=1)[1].makespan


@pytest.mark.parametrize("name,pp", [("vmin", 32), ("vhalf", 32), ("vmin", 64)])
def test_default_low_memory_plans_meet_their_bound_and_beat_1f1b(name, pp):
    m = 4 * pp
    s, r, _ = _plan(name, pp, m)
    bound = s.meta["lower_bound"]  # now computed at every size
    assert bound is not None and r.makespan >= bound - 1e-9
    assert r.makespan <= 1.01 * bound  # vmin pp 32: 1155 before, bound 887
    assert r.makespan < _onef1b(pp, m, EQUAL)  # at a third / half of 1F1B's memory


@pytest.mark.parametrize("pp,m", [(16, 64), (128, 512)])
def test_bound_at_scale_is_the_critical_path_at_no_limit(pp, m):
    # F=B=W=1, no comm: the last device starts at pp-1 and then has 6m of work (two chunks x F, B, W)
    t0 = time.process_time()
    b = bounds.lower_bound(make_spec(pp=pp, vpp=2, microbatches=m), Placement.V)
    assert b.value == (pp - 1) + 6 * m
    assert time.process_time() - t0 < 5  # the full job graph: 393 216 jobs at pp 128


@pytest.mark.parametrize("pp,vpp,m,costs,limit,placement", [
    (3, 2, 5, ZB, "0.5p", Placement.V), (4, 2, 8, EQUAL, "1p", Placement.V), (4, 3, 6, ZB, 3.0, Placement.V),
    (5, 2, 7, "F=1:2:1:1:3:1:1:1:2:1,B=2,W=0.7,comm=0.3", "0.75p", Placement.V),
    (4, 2, 6, ZB, "1p", Placement.INTERLEAVED), (3, 1, 6, EQUAL, 2.0, Placement.INTERLEAVED)])
def test_one_microbatch_graph_gives_the_full_graph_bound(pp, vpp, m, costs, limit, placement):
    spec = make_spec(pp=pp, vpp=vpp, microbatches=m, costs=costs, mem_limit=limit)
    g = bounds.split_graph(spec, placement)  # every job of every microbatch
    v, term, _ = bounds.graph_bound(g)
    full = max(0.0, (v - len(g.jobs)) / g.tscale) if g.rounded else v / g.tscale
    b = bounds.lower_bound(spec, placement)
    assert b.value == pytest.approx(full) and b.term == term


def _cli_json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_and_simulate_json_report_bound_and_gap_at_scale(capsys, tmp_path):
    argv = ["-s", "vhalf", "--pp", "32", "-m", "96", "--costs", ZB]  # 18 432 jobs: no bound here before
    for cmd in (["plan"], ["simulate"]):
        d = _cli_json(capsys, cmd + argv + ["--json"])
        assert d["bound_limit"] == 17.0  # V-Half's (p+2)//2
        assert 0 < d["lower_bound"] <= d["makespan"]
        assert d["gap"] == pytest.approx(d["makespan"] / d["lower_bound"] - 1)
    out = tmp_path / "p.json"
    assert main(["plan", "-s", "1f1b", "--pp", "8", "-m", "16", "-o", str(out)]) == 0
    capsys.readouterr()
    d = _cli_json(capsys, ["simulate", "--plan", str(out), "--json"])
    assert d["bound_limit"] == 8.0 and d["lower_bound"] <= d["makespan"]  # its own peak: no limit given
    assert main(["show", str(out), "--width", "40"]) == 0
    assert "proven lower bound" in capsys.readouterr().out


@settings(max_examples=6, deadline=None)
@given(pp=st.sampled_from([16, 24, 32, 48]), k=st.sampled_from([2, 3, 4]), costs=st.sampled_from([EQUAL, ZB]),
       limit=st.sampled_from(["1p", "1.5p", "2p", None]))
def test_deep_zbv_valid_within_limit_never_slower_than_1f1b(pp, k, costs, limit):
    m = k * pp
    s, r, spec = _plan("zbv", pp, m, costs, limit)
    assert not validate(s, mem=spec.mem, mem_limit=spec.mem_limit)
    if spec.mem_limit is not None:
        assert max(r.peak_memory) <= spec.mem_limit + 1e-9
    assert r.makespan <= _onef1b(pp, m, costs) + 1e-9  # 1F1B's peak is 1p: equal or more memory here


@settings(max_examples=4, deadline=None)
@given(pp=st.sampled_from([16, 24, 32]), costs=st.sampled_from([EQUAL, ZB]),
       name=st.sampled_from(["vhalf", "vmin"]), limit=st.sampled_from(["0.5p", "0.75p", None]))
def test_deep_low_memory_plans_valid_within_limit(pp, costs, name, limit):
    s, r, spec = _plan(name, pp, 2 * pp, costs, limit)
    assert not validate(s, mem=spec.mem, mem_limit=s.meta["mem_limit"])
    assert max(r.peak_memory) <= s.meta["mem_limit"] + 1e-9
    assert r.makespan >= s.meta["lower_bound"] - 1e-9


def test_incremental_squeeze_check_matches_the_whole_row():
    # the building blocks' second squeeze checks only the slots a move changes; it must agree with the
    # whole-row peak on every move of rows whose peak fits, and keep its walk state right when a move is kept
    rng = random.Random(7)
    dm = (0.5, 0.5, -0.25, -0.25, -0.25, -0.25)
    checked = 0
    for _ in range(300):
        row = [rng.choice((-1, -1, 0, 1, 2, 3)) for _ in range(rng.randint(4, 40))]
        st0 = vblock._w_states(row, dm)
        cap = st0[3] + rng.choice((0.0, 0.25, 0.5))
        jobs = [i for i, k in enumerate(row) if k >= 0]
        free = [i for i, k in enumerate(row) if k < 0]
        if not jobs or not free:
            continue
        t = rng.choice(jobs)
        earlier = [s for s in free if s < t]
        if not earlier:
            continue
        s = rng.choice(earlier)
        new = list(row)
        new[s], new[t] = row[t], -1
        want = vblock._peak_implicit_w(new, dm) <= cap + 1e-9
        assert vblock._move_fits(new, dm, st0, s, t, cap) == want
        if want:
            st = tuple(list(x) if isinstance(x, list) else x for x in st0)
            vblock._move_fits(new, dm, st, s, t, cap, update=True)
            ref = vblock._w_states(new, dm)
            assert st[0] == ref[0] and st[1] == ref[1] and st[2] == pytest.approx(ref[2])
        checked += 1
    assert checked > 100
