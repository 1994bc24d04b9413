"""Comm plan and transport model of the runtime, checked without processes."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom import api
from pipeloom.runtime.commplan import Msg, Op, build_comm_plan, needed, produced, unit_time_ends
from pipeloom.trace.writer import parse_profile_steps
from fuzzplans import check_transport, random_plan
from pipeloom.schedule import registry
from pipeloom.core.ir import Job, Kind, Schedule
from pipeloom.schedule.validate import validate


def _builders():
    out = []
    for name in registry.names():
        vpp = 1 if registry.get(name).vpp in ("1",) else 2
        for pp in (2, 4):
            out.append((name, pp, vpp))
    return out


@pytest.mark.parametrize("name,pp,vpp", _builders())
def test_every_builder_transport_matches_and_finishes(name, pp, vpp):
    try:
        sched = api.plan(name, api.make_spec(pp=pp, microbatches=2 * pp, vpp=vpp))
    except ValueError as e:
        pytest.skip(f"{name} does not build pp={pp} vpp={vpp}: {e}")
    assert check_transport(sched) == []


@settings(max_examples=60)
@given(pp=st.integers(1, 4), vpp=st.integers(1, 3), m=st.integers(1, 6), seed=st.integers(0, 10**6),
       placement=st.sampled_from(["interleaved", "v"]), split=st.sampled_from([0.0, 0.5, 1.0]))
def test_random_plans_are_valid_and_transport_never_deadlocks(pp, vpp, m, seed, placement, split):
    sched = random_plan(pp, vpp, m, placement=placement, seed=seed, split=split)
    assert validate(sched) == []
    assert check_transport(sched) == []


def test_every_cross_device_message_has_one_send_and_one_recv():
    sched = random_plan(4, 2, 5, placement="v", seed=3)
    plan = build_comm_plan(sched)
    sends, recvs = [], []
    for d in range(sched.pp):
        for peer, ops in plan.ops(d).items():
            for op in ops:
                (sends if op.send else recvs).append((op.msg, d if op.send else peer, peer if op.send else d))
    assert sorted(sends) == sorted(recvs)
    expected = set()
    for d, _i, j in sched.jobs():
        p = produced(j, sched)
        if p is not None and p[1] != d:
            expected.add((p[0], d, p[1]))
    assert set(sends) == expected and len(sends) == len(expected)


def test_v_placement_turn_is_local():
    # chunk pp-1 -> pp sits on the last device under V placement: no message on any link
    sched = random_plan(3, 2, 2, placement="v", seed=1)
    plan = build_comm_plan(sched)
    turn = {op.msg for d in range(3) for ops in plan.ops(d).values() for op in ops
            if op.msg.chunk in (2, 3) and ((op.msg.kind == "act" and op.msg.chunk == 2)
                                           or (op.msg.kind == "grad" and op.msg.chunk == 3))}
    assert turn == set()


def test_needed_and_produced_pairing():
    sched = random_plan(2, 2, 1, seed=0)  # 4 chunks interleaved
    assert needed(Job(Kind.F, 0, 0), sched) is None
    assert needed(Job(Kind.F, 0, 2), sched) == (Msg("act", 0, 1), 1)
    assert needed(Job(Kind.B, 0, 3), sched) is None  # last chunk: loss grad
    assert needed(Job(Kind.BW, 0, 1), sched) == (Msg("grad", 0, 2), 0)
    assert produced(Job(Kind.F, 0, 3), sched) is None
    assert produced(Job(Kind.B, 0, 0), sched) is None
    assert produced(Job(Kind.W, 0, 2), sched) is None


def test_checker_detects_disagreeing_link_order():
    sched = random_plan(2, 1, 3, seed=5)
    plan = build_comm_plan(sched)
    ops0 = list(plan.ops(0)[1])
    ops0[0], ops0[1] = ops0[1], ops0[0]
    links = ({**plan.links[0], 1: tuple(ops0)}, plan.links[1])
    assert check_transport(sched, dataclasses.replace(plan, links=links))


def test_checker_detects_transport_deadlock():
    # pp=2, one microbatch: link order must be act before grad; the reverse cannot complete
    sched = Schedule("t", 2, 1, 1, "interleaved",
                     ((Job(Kind.F, 0, 0), Job(Kind.BW, 0, 0)), (Job(Kind.F, 0, 1), Job(Kind.BW, 0, 1))))
    plan = build_comm_plan(sched)
    assert [op.msg.kind for op in plan.ops(0)[1]] == ["act", "grad"]
    rev = tuple(tuple(reversed(plan.links[d][1 - d])) for d in range(2))
    links = ({1: rev[0]}, {0: rev[1]})
    problems = check_transport(sched, dataclasses.replace(plan, links=links))
    assert any("deadlock" in p for p in problems)


def test_unit_time_rejects_deadlocking_lists():
    sched = Schedule("bad", 2, 1, 1, "interleaved",
                     ((Job(Kind.BW, 0, 0), Job(Kind.F, 0, 0)), (Job(Kind.F, 0, 1), Job(Kind.BW, 0, 1))))
    with pytest.raises(ValueError, match="cannot execute"):
        unit_time_ends(sched)


def test_link_order_within_a_direction_is_sender_job_order():
    sched = random_plan(3, 2, 4, placement="interleaved", seed=11)
    plan = build_comm_plan(sched)
    for d in range(3):
        order = {produced(j, sched)[0]: i for i, j in enumerate(sched.devices[d]) if produced(j, sched)}
        for peer, ops in plan.ops(d).items():
            idx = [order[op.msg] for op in ops if op.send]
            assert idx == sorted(idx)


@pytest.mark.parametrize("text,expected", [("3:5", (3, 5)), ("2", (2, 3)), (None, None), ("none", None)])
def test_parse_profile_steps(text, expected):
    assert parse_profile_steps(text) == expected


@pytest.mark.parametrize("text", ["5:3", "a:b", "-1:2", "3:3"])
def test_parse_profile_steps_rejects(text):
    with pytest.raises(ValueError, match="profile-steps"):
        parse_profile_steps(text)
