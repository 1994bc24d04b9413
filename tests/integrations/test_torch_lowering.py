"""lower_early_recvs: torch's compute+comms lowering with every receive posted first (no processes).

The safety property checked here is gloo's: receives from one peer are matched to that peer's sends in posting
order, so on every rank the receives from each peer must come in the order that peer sends (derived here from
the plan's own compute order, not from torch's lowering)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch.distributed.pipelining")

from torch.distributed.pipelining import schedules as ts  # noqa: E402

from pipeloom.integrations.torch import lower_early_recvs, to_torch_actions  # noqa: E402
from pipeloom.schedule.planning import make_spec, plan  # noqa: E402

PLANS = {
    "zbv-1p": lambda: plan("zbv", make_spec(pp=2, microbatches=8, vpp=2, mem_limit="1p")),
    "interleaved-pp4-m6": lambda: plan("interleaved", make_spec(pp=4, microbatches=6, vpp=2)),
    "zbh1-pp4": lambda: plan("zbh1", make_spec(pp=4, microbatches=8)),
    "dualpipev-composites": lambda: plan("dualpipev", make_spec(pp=2, microbatches=4, vpp=2)),
}
RECV, SEND = (ts.RECV_F, ts.RECV_B), (ts.SEND_F, ts.SEND_B)


def _subs(a):
    return a.sub_actions or (a,)


def _expected_messages(order):
    """(sender, receiver) -> [(kind, receiving stage, mb)] in the sender's compute order."""
    home = {s.stage_index: r for r, acts in order.items() for a in acts for s in _subs(a)}
    last = max(home)
    out: dict = {}
    for r, acts in order.items():
        for a in acts:
            for s in _subs(a):
                st, mb, t = s.stage_index, s.microbatch_index, s.computation_type
                if t == ts.F and st < last and home[st + 1] != r:
                    out.setdefault((r, home[st + 1]), []).append(("F", st + 1, mb))
                elif t in (ts.I, ts.B) and st > 0 and home[st - 1] != r:
                    out.setdefault((r, home[st - 1]), []).append(("B", st - 1, mb))
    return home, out


@pytest.mark.parametrize("name", PLANS)
def test_receives_come_first_in_each_peers_send_order(name):
    s = PLANS[name]()
    order = to_torch_actions(s)
    lowered = lower_early_recvs(order)
    home, expected = _expected_messages(order)
    assert sorted(lowered) == sorted(order)
    for r, acts in lowered.items():
        compute = [a for a in acts if a.is_compute_op or a.computation_type == ts.OVERLAP_F_B]
        assert [str(a) for a in compute] == [str(a) for a in order[r]]  # the plan's order, untouched
        kinds = [a.computation_type for a in acts]
        first_compute = next(i for i, a in enumerate(acts) if a in compute)
        assert all(k not in RECV for k in kinds[first_compute:])  # every receive posted before any compute
        for peer in lowered:
            got = [("F" if a.computation_type == ts.RECV_F else "B", a.stage_index, a.microbatch_index)
                   for a in acts if a.computation_type in RECV
                   and home[a.stage_index + (-1 if a.computation_type == ts.RECV_F else 1)] == peer]
            assert got == expected.get((peer, r), [])
        sends = [("F" if a.computation_type == ts.SEND_F else "B",
                  a.stage_index + (1 if a.computation_type == ts.SEND_F else -1), a.microbatch_index)
                 for a in acts if a.computation_type in SEND]
        assert sorted(sends) == sorted(m for (src, _), msgs in expected.items() if src == r for m in msgs)


def test_torchs_own_lowering_posts_some_receive_right_before_its_consumer():
    """Why the early posting exists: for a zbv plan torch's lowering puts a receive directly before the action
    that waits for it (the transfer's handshake then lies on the critical path on gloo)."""
    s = PLANS["zbv-1p"]()
    order = to_torch_actions(s)
    home = {a.stage_index: r for r, acts in order.items() for a in acts}
    lowered = ts._add_send_recv({r: list(a) for r, a in order.items()}, stage_to_rank=lambda st: home[st],
                                num_stages=len(home))
    adjacent = 0
    for acts in lowered.values():
        for a, b in zip(acts, acts[1:]):
            if a.computation_type == ts.RECV_F and b.computation_type == ts.F and \
                    (a.stage_index, a.microbatch_index) == (b.stage_index, b.microbatch_index):
                adjacent += 1
            if a.computation_type == ts.RECV_B and b.computation_type in (ts.I, ts.B) and \
                    (a.stage_index, a.microbatch_index) == (b.stage_index, b.microbatch_index):
                adjacent += 1
    assert adjacent > 0
