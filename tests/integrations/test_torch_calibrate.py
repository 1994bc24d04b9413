"""costs_from_torch_profile: per-action costs of torch's runtime read from profiler traces (no torch needed).

The traces are written by hand with known spans, so every expected number below is worked out from the
definitions (module docstring of pipeloom.integrations.torch_calibrate), not produced by the code."""
from __future__ import annotations

import gzip
import json

import pytest

from pipeloom.integrations.torch_calibrate import costs_from_torch_profile, profile_costs
from pipeloom.trace.run import LogError

MAIN, OTHER = 7, 99  # the step's thread, and another one (gloo's) whose events must be ignored


def _span(name, start, end, op=None, tid=MAIN):
    """A PP: span from ``start`` to ``end`` ms, with one child operator starting at ``op`` (ms)."""
    out = [{"ph": "X", "name": name, "ts": start * 1e3, "dur": (end - start) * 1e3, "pid": 1, "tid": tid}]
    if op is not None:
        out.append({"ph": "X", "name": "aten::mm", "ts": op * 1e3, "dur": (end - op) * 1e3 * 0.9, "pid": 1,
                    "tid": tid})
    return out


def _traces():
    """pp 2, V placement (stages 0 and 3 on rank 0, 1 and 2 on rank 1), one microbatch."""
    r0 = (_span("PP:0F0", 0.0, 1.0, 0.1) + _span("PP:0SEND_F0", 1.0, 1.2)
          + _span("PP:3F0", 1.3, 6.0, 5.0)            # waited for stage 2's output until 5.0 - lead
          + [{"ph": "X", "name": "gloo:recv", "ts": 1.4e3, "dur": 10.0, "pid": 1, "tid": OTHER}]
          + _span("PP:3I0", 6.0, 7.0, 6.1) + _span("PP:3SEND_B0", 7.0, 7.1)
          + _span("PP:3W0", 7.2, 8.0, 7.3)
          + _span("PP:0I0", 8.1, 12.0)                 # stage 0's I: a no-op that waited until 12.0
          + _span("PP:0W0", 12.1, 14.1, 12.2))
    r1 = (_span("PP:1RECV_F0", 0.3, 0.4) + _span("PP:1F0", 0.5, 2.5, 1.5)
          + _span("PP:2F0", 2.6, 3.6, 2.7) + _span("PP:2SEND_F0", 3.6, 3.8)
          + _span("PP:2I0", 3.9, 8.5, 7.5)
          + _span("PP:1I0", 8.6, 9.6, 8.7) + _span("PP:1SEND_B0", 9.6, 9.8)
          + _span("PP:2W0", 9.9, 10.9, 10.0) + _span("PP:1W0", 11.0, 12.0, 11.1))
    return {0: {"traceEvents": r0, "distributedInfo": {"rank": 0}},
            1: {"traceEvents": r1, "distributedInfo": {"rank": 1}}}


def _write(tmp_path, traces):
    d = tmp_path / "iteration_3"
    d.mkdir()
    (d / "rank0_trace.json").write_text(json.dumps(traces[0]))
    with gzip.open(d / "rank1_trace.json.gz", "wt") as f:
        json.dump(traces[1], f)
    return tmp_path


def test_costs_from_hand_written_traces(tmp_path):
    p = profile_costs(_write(tmp_path, _traces()))
    assert p.lead == pytest.approx(0.1)  # every span that cannot wait starts its first operator 0.1 ms in
    c = p.costs
    # each: from the action's work start (first operator - lead when it may wait) to its span's end, plus the
    # send spans that follow it (receive postings and gaps are not the action's); stage 0's I is a no-op (0.1)
    assert c.F == pytest.approx((1.2, 1.1, 1.2, 1.1))
    assert c.B == pytest.approx((0.1, 1.2, 1.1, 1.1))
    assert c.W == pytest.approx((2.0, 1.0, 1.0, 0.8))
    # waits: 3F0 got stage 2's output 1.3 after its send was posted, 1F0 0.4, 2I0 0.4, 0I0 2.3: lower quartile 0.4
    assert sorted(p.comm_samples) == pytest.approx([0.4, 0.4, 1.3, 2.3])
    assert c.comm == pytest.approx(0.4)
    assert profile_costs(tmp_path, comm_quantile=0.5).costs.comm == pytest.approx(0.85)
    assert (p.ranks, p.steps) == (2, 1)
    assert costs_from_torch_profile(tmp_path) == c
    assert profile_costs({r: [t] for r, t in _traces().items()}).costs == c  # loaded traces work the same
    # other quantiles of the four latencies 0.4, 0.4, 1.3, 2.3: the 75% point lies 1/4 of the way from 1.3 to 2.3
    assert profile_costs(tmp_path, comm_quantile=0.75).costs.comm == pytest.approx(1.55)
    assert profile_costs(tmp_path, comm_quantile=1.0).costs.comm == pytest.approx(2.3)
    with pytest.raises(ValueError, match="comm_quantile must lie in"):
        profile_costs(tmp_path, comm_quantile=1.5)
    with pytest.raises(ValueError, match="^quantile must lie in"):
        profile_costs(tmp_path, quantile=-0.1)


def test_a_late_first_operator_after_the_send_is_no_wait():
    """1F0's span begins after stage 0's send was posted: its late first operator is not a wait for the transfer
    (the process may have been descheduled), so it gives no latency sample; its cost is still counted from its
    first operator."""
    t = _traces()
    for ev in t[1]["traceEvents"]:
        if ev["name"] == "PP:1F0":
            ev["ts"], ev["dur"] = 1.1e3, 1.4e3
    p = profile_costs({r: [x] for r, x in t.items()})
    assert sorted(p.comm_samples) == pytest.approx([0.4, 1.3, 2.3])
    assert p.costs.F[1] == pytest.approx(1.1)


def test_a_profile_plans_like_its_costs_say():
    """The costs plan: zbv planned from them is valid and no slower, in pipeloom's simulator, than the order
    that was profiled (torch's ZBV for this shape)."""
    pytest.importorskip("torch.distributed.pipelining")
    from pipeloom.core.costs import runtime_mem_model
    from pipeloom.integrations.torch import torch_builtin
    from pipeloom.schedule.planning import evaluate, make_spec, plan
    c = profile_costs({r: [t] for r, t in _traces().items()}).costs
    for m in (4,):
        spec = make_spec(pp=2, microbatches=m, vpp=2, costs=c, mem=runtime_mem_model("torch"))
        theirs = evaluate(torch_builtin("ZBVZeroBubble", 2, m), spec)
        spec = make_spec(pp=2, microbatches=m, vpp=2, costs=c, mem=runtime_mem_model("torch"),
                         mem_limit=max(theirs["peak_memory"]))
        ours = evaluate(plan("zbv", spec), spec)
        assert ours["valid"] and ours["makespan"] <= theirs["makespan"] + 1e-9, (m, ours, theirs)


def test_full_backwards_only_and_no_spans_are_one_line_errors(tmp_path):
    t = _traces()
    for ev in t[0]["traceEvents"] + t[1]["traceEvents"]:
        ev["name"] = ev["name"].replace("I0", "B0")
    t[0]["traceEvents"] = [e for e in t[0]["traceEvents"] if e["name"] != "PP:0W0"]
    t[1]["traceEvents"] = [e for e in t[1]["traceEvents"] if not e["name"].endswith("W0")]
    t[0]["traceEvents"] = [e for e in t[0]["traceEvents"] if e["name"] != "PP:3W0"]
    with pytest.raises(LogError, match="stage 0 ran only full backwards"):
        profile_costs({r: [x] for r, x in t.items()})
    (tmp_path / "rank0_trace.json").write_text('{"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 2}]}')
    with pytest.raises(LogError, match="rank0_trace.json holds no pipeline actions"):
        profile_costs(tmp_path)
    with pytest.raises(LogError, match="no torch profiler traces"):
        profile_costs(tmp_path / "nothing-here")


def test_peak_with_retention_counts_what_each_w_leaves_until_the_step_ends():
    """One device, m 3, one unit per microbatch, B frees half: F0 B0 W0 F1 BW1 F2 B2 W2. With each W leaving k
    held (torch's I then W), and a fused BW (torch's full backward) leaving nothing: after W0 k stays, so F1 and F2
    peak at 1 + k, and the last W leaves 2k. Were BW to leave k too, F2 would peak at 1 + 2k."""
    from pipeloom.core.costs import MemModel
    from pipeloom.core.ir import Job, Kind, Schedule
    from pipeloom.integrations.torch_calibrate import peak_with_retention

    F, B, W, BW = Kind.F, Kind.B, Kind.W, Kind.BW
    s = Schedule("hand", 1, 1, 3, "interleaved", [[Job(F, 0, 0), Job(B, 0, 0), Job(W, 0, 0), Job(F, 1, 0),
                                                   Job(BW, 1, 0), Job(F, 2, 0), Job(B, 2, 0), Job(W, 2, 0)]])
    mem = MemModel(a=1.0, b=0.5)
    assert peak_with_retention(s, mem, [0.0]) == pytest.approx([1.0])
    assert peak_with_retention(s, mem, [0.25]) == pytest.approx([1.25])
    assert peak_with_retention(s, mem, [0.75]) == pytest.approx([1.75])
    assert peak_with_retention(s, mem, [0.9]) == pytest.approx([1.9])
    with pytest.raises(ValueError, match="kept has 2 values but the schedule has 1 chunks"):
        peak_with_retention(s, mem, [0.1, 0.2])
