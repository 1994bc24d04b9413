"""The TP fuse post-pass (pipeloom.schedule.tp_fuse, simulate --tp-fuse): split B fused with its W where the
split buys nothing under TP costs; re-timed with the kernel, never longer, memory within the limit."""
from __future__ import annotations

import json

import pytest
from clirun import pipeloom

from pipeloom.core.costs import Costs, MemModel
from pipeloom.core.ir import Job, Kind, Placement, Schedule
from pipeloom.schedule import registry
from pipeloom.schedule.planning import make_spec, plan
from pipeloom.schedule.tp_fuse import fuse_for_tp, tp_makespan
from pipeloom.schedule.validate import validate
from pipeloom.sim.simulate import memory_profile, simulate
from pipeloom.sim.tp_jobs import TPJobTerms

COSTS = Costs.parse("F=1,B=1,W=1")


def _plan(name, pp=4, m=8):
    return plan(name, make_spec(pp=pp, vpp=registry.default_vpp(name), microbatches=m, costs=COSTS))


def _weight_jobs(s):
    """(mb, chunk) -> kinds of its weight-gradient jobs (W or BW), over all devices."""
    out = {}
    for jobs in s.devices:
        for j in jobs:
            if j.kind in (Kind.W, Kind.BW):
                out.setdefault((j.mb, j.chunk), []).append(j.kind)
    return out


def test_zero_tp_comm_makes_tp_makespan_the_simulators():
    s = _plan("zbv")
    assert tp_makespan(s, COSTS, TPJobTerms(0.0, 0.5, "off"))[0] == pytest.approx(simulate(s, COSTS).makespan)


@pytest.mark.parametrize("name", ["zbh1", "zbv", "zbvpp"])
@pytest.mark.parametrize("mode", ["off", "async", "chunked", "fill"])
def test_fusion_never_lengthens_and_keeps_a_valid_plan(name, mode):
    s = _plan(name)
    terms = TPJobTerms(0.4, 0.5, mode, 2 if mode == "chunked" else 1)
    limit = max(memory_profile(s)[0])
    out, summ = fuse_for_tp(s, COSTS, terms, mem=MemModel(), mem_limit=limit)
    assert summ["makespan_after"] <= summ["makespan_before"] + 1e-9
    assert tp_makespan(out, COSTS, terms)[0] == pytest.approx(summ["makespan_after"])
    assert not validate(out, mem=MemModel(), mem_limit=limit)
    assert max(memory_profile(out)[0]) <= limit + 1e-9
    # every (mb, chunk) still has exactly one weight-gradient job; the fused ones are BWs
    w = _weight_jobs(out)
    assert len(w) == s.microbatches * s.num_chunks and all(len(v) == 1 for v in w.values())
    assert sum(v == [Kind.BW] for v in w.values()) == len(summ["fused"])


def test_async_on_zbv_fusing_shortens_the_step():
    """zbv under async: a split B exposes the collective; fusing where the split buys nothing is shorter."""
    s = _plan("zbv")
    terms = TPJobTerms(0.4, 0.5, "async")
    out, summ = fuse_for_tp(s, COSTS, terms)
    assert summ["makespan_after"] < summ["makespan_before"] - 0.1
    assert out.name == "zbv+tp-fuse" and summ["fused"]


def test_chunk_zero_and_adjacent_pairs_are_fused_first():
    # one device, chunk 0: F0 F1 B0 B1 W0 W1; B0's split buys nothing (chunk 0: nothing waits for it)
    jobs = tuple(Job(k, mb, 0) for k, mb in ((Kind.F, 0), (Kind.F, 1), (Kind.B, 0), (Kind.B, 1), (Kind.W, 0),
                                             (Kind.W, 1)))
    s = Schedule(name="one", pp=1, vpp=1, microbatches=2, placement=Placement.INTERLEAVED, devices=(jobs,))
    out, summ = fuse_for_tp(s, COSTS, TPJobTerms(1.0, 0.8, "async"))
    # under async a fused BW hides 0.8 of the collective 1.0 in both: the plan ends 0.8 x 2 earlier
    assert summ["makespan_before"] == pytest.approx(2 + 2 * (1 + 1) + 2)
    assert summ["makespan_after"] == pytest.approx(summ["makespan_before"] - 2 * 0.8)
    assert [j.kind for j in out.devices[0]] == [Kind.F, Kind.F, Kind.BW, Kind.BW]


def test_dualpipe_pairs_are_left_alone():
    s = _plan("dualpipev", pp=4, m=8)
    if not s.overlapped:
        pytest.skip("dualpipev planned without overlapped pairs")
    out, summ = fuse_for_tp(s, COSTS, TPJobTerms(0.4, 0.5, "async"))
    assert out is s and summ["fused"] == []


def _cli(*args):
    return pipeloom("simulate", *args)


@pytest.mark.slow  # 8-45 s on 2 busy cores: make test runs it, make test-fast does not
def test_cli_simulate_tp_overlap_and_fuse():
    base = ["-s", "zbv", "--pp", "4", "-m", "8", "--tp-comm", "0.4", "--json"]
    spans = {}
    for mode in ("off", "async", "chunked:2", "fill"):
        r = _cli(*base, "--tp-overlap", mode)
        assert r.returncode == 0, r.stderr
        tp = json.loads(r.stdout)["tp"]
        assert tp["overlap"] == mode and tp["makespan"] >= json.loads(r.stdout)["makespan"]
        spans[mode] = tp["makespan"]
    assert spans["chunked:2"] < spans["async"] < spans["off"] and spans["fill"] < spans["off"]
    r = _cli(*base, "--tp-overlap", "async", "--tp-fuse")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["schedule"] == "zbv+tp-fuse" and res["valid"]
    assert res["tp"]["makespan"] < spans["async"] and res["tp"]["fuse"]["fused"]
    for bad, words in ((["--tp-overlap", "async"], "needs --tp-comm"), (["--tp-comm", "x"], "--tp-comm 'x'"),
                       (["--tp-comm", "1", "--tp-overlap", "chunked:1"], "K >= 2"),
                       (["--tp-comm", "1:2:3"], "3 values"), (["--tp-fuse"], "need --tp-comm")):
        r = _cli("-s", "zbv", "--pp", "4", "-m", "8", *bad)
        assert r.returncode == 2 and r.stderr.startswith("pipeloom: error:") and words in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_cli_plan_tp_fuse_writes_the_fused_plan(tmp_path):
    out = tmp_path / "p.json"
    r = pipeloom("plan", "-s", "zbv", "--pp", "4", "-m", "8", "--tp-comm", "0.4", "--tp-overlap", "async",
                 "--tp-fuse", "-o", out, "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    n = len(res["tp"]["fuse"]["fused"])
    assert n > 0 and res["valid"]
    r = _cli("--plan", str(out), "--tp-comm", "0.4", "--tp-overlap", "async", "--json")
    assert r.returncode == 0, r.stderr
    back = json.loads(r.stdout)
    assert back["tp"]["makespan"] == pytest.approx(res["tp"]["makespan"])
    from pipeloom.schedule import io as schedule_io
    s = schedule_io.load(str(out))
    assert sum(j.kind is Kind.BW for d in s.devices for j in d) == n


def test_cli_column_share_from_the_model():
    from pipeloom.models.presets import preset
    from pipeloom.tune.comm_terms import column_share

    m = preset("llama-tiny")
    r = _cli("-s", "zbv", "--pp", "2", "-m", "4", "--model", "llama-tiny", "--tp-comm", "0.05", "--tp-overlap",
             "fill", "--json")
    assert r.returncode == 0, r.stderr
    tp = json.loads(r.stdout)["tp"]
    share = column_share(m)
    # QKV (h x (q + 2 kv)) and gate+up (2 x h x ffn) of all four GEMM groups' weights
    want = (m.q_dim + 2 * m.kv_dim + 2 * m.ffn) / (m.q_dim + 2 * m.kv_dim + m.q_dim + 3 * m.ffn)
    assert tp["column_share"] == pytest.approx(share) == pytest.approx(want) and 0.5 < share < 1
    assert tp["makespan"] < tp["makespan_off"]
