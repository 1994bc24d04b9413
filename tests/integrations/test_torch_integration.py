"""torch's schedule classes as pipeloom schedules (no processes), and pipeloom plans as torch action lists."""
from __future__ import annotations

import pytest

pytest.importorskip("torch.distributed.pipelining")

from torch.distributed.pipelining import schedules as ts  # noqa: E402

from pipeloom.core.errors import ScheduleError  # noqa: E402
from pipeloom.core.ir import Kind  # noqa: E402
from pipeloom.integrations.torch import (BUILTINS, from_torch_order, to_torch_actions,  # noqa: E402
                                         torch_builtin)
from pipeloom.schedule.io.torch_csv import to_torch_rows  # noqa: E402
from pipeloom.schedule.planning import make_spec, plan  # noqa: E402
from pipeloom.schedule.validate import validate  # noqa: E402
from pipeloom.sim.simulate import simulate  # noqa: E402


@pytest.mark.parametrize("name", BUILTINS)
@pytest.mark.parametrize("pp, m", [(2, 4), (4, 8), (4, 6)])
def test_every_builtin_is_a_valid_pipeloom_schedule(name, pp, m):
    if name == "DualPipeV" and m < 2 * pp:
        with pytest.raises(ScheduleError, match="torch:DualPipeV cannot plan"):
            torch_builtin(name, pp, m)
        return
    s = torch_builtin(name, pp, m)
    assert not validate(s)
    assert (s.pp, s.microbatches) == (pp, m)
    assert simulate(s).makespan > 0


@pytest.mark.parametrize("name", [b for b in BUILTINS if b != "1F1B"])
def test_torchs_own_order_round_trips_to_the_same_actions(name):
    """torch's order -> pipeloom -> torch rows: the same compute actions on every rank, in the same order."""
    pp, m = 4, 8
    s = torch_builtin(name, pp, m)
    cls = ts.get_schedule_class(name)
    from pipeloom.integrations.torch import _StageStandIn  # the same stand-ins torch_builtin plans with
    if issubclass(cls, ts.PipelineScheduleMulti):
        idx = [0, 2 * pp - 1] if name in ("ZBVZeroBubble", "DualPipeV") else [0, pp]
        obj = cls([_StageStandIn(i, 2 * pp, pp, 0) for i in idx], m, loss_fn=lambda o, t: o)
    else:
        obj = cls(_StageStandIn(0, pp, pp, 0), m, loss_fn=lambda o, t: o)
    torch_rows = {r: [str(a) for a in acts if a is not None and a.is_compute_op] for r, acts in obj.pipeline_order.items()}
    assert {r: row for r, row in enumerate(to_torch_rows(s))} == torch_rows


def test_torchs_1f1b_pipeline_order_is_off_by_one_and_we_use_the_executed_order():
    """torch 2.13: Schedule1F1B.pipeline_order's last rank forwards 1..m, never 0 (found while importing it)."""
    from pipeloom.integrations.torch import _StageStandIn
    obj = ts.Schedule1F1B(_StageStandIn(0, 2, 2, 0), 4, loss_fn=lambda o, t: o)
    last = [a.microbatch_index for a in obj.pipeline_order[1] if a is not None and a.computation_type == ts.F]
    assert last == [1, 2, 3, 4]  # if torch fixes this, torch_builtin may read pipeline_order for 1F1B too
    s = torch_builtin("1F1B", 2, 4)
    assert [str(j) for j in s.devices[1]] == ["F0.1", "BW0.1", "F1.1", "BW1.1", "F2.1", "BW2.1", "F3.1", "BW3.1"]
    assert [str(j) for j in s.devices[0][:3]] == ["F0.0", "F1.0", "BW0.0"]  # warm-up min(m, pp - stage) = 2


def test_pipeloom_plans_become_torch_actions_torch_accepts():
    for name, kw in (("zbv", dict(pp=2, microbatches=8, vpp=2, mem_limit="1p")),
                     ("interleaved", dict(pp=4, microbatches=6, vpp=2))):
        s = plan(name, make_spec(**kw))
        acts = to_torch_actions(s)
        assert ts._validate_schedule(acts, s.pp, s.num_chunks, s.microbatches) == {c: s.device_of(c)
                                                                                 for c in range(s.num_chunks)}
        back = from_torch_order(acts)
        assert sum(len(d) for d in back.devices) == s.num_jobs
        assert {j.kind for d in back.devices for j in d} == {j.kind for d in s.devices for j in d}


def test_unknown_names_and_shapes_are_one_line_errors():
    with pytest.raises(ScheduleError, match="unknown torch schedule 'nope'; choose one of: GPipe"):
        torch_builtin("nope", 2, 4)
    with pytest.raises(ScheduleError, match="needs exactly 2 stages per rank"):
        torch_builtin("ZBVZeroBubble", 2, 4, vpp=3)
    with pytest.raises(ScheduleError, match="one stage per rank"):
        torch_builtin("GPipe", 2, 4, vpp=2)
    assert Kind.BW in {j.kind for d in torch_builtin("gpipe", 2, 4).devices for j in d}  # names are case-blind
