"""torch's schedule CSV: what pipeloom writes loads and validates in torch's own code; what torch writes reads back."""
from __future__ import annotations

import pytest

from pipeloom.core.errors import ScheduleFormatError
from pipeloom.core.ir import Job, Kind, Schedule
from pipeloom.schedule import io as schedule_io
from pipeloom.schedule.io.torch_csv import from_torch_csv, from_torch_rows, to_torch_csv, to_torch_rows
from pipeloom.schedule.planning import make_spec, plan
from pipeloom.schedule.validate import validate

torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")

PLANS = [
    ("1f1b", dict(pp=2, microbatches=4)),
    ("interleaved", dict(pp=2, microbatches=5, vpp=2)),
    ("zbh1", dict(pp=4, microbatches=8)),
    ("zbv", dict(pp=2, microbatches=8, vpp=2, mem_limit="1p", costs="F=1:1:1:3,B=1,W=1")),
    ("dualpipev", dict(pp=2, microbatches=8, vpp=2)),
]


def _relabel(s: Schedule, perm: dict[int, int]) -> Schedule:
    return Schedule(s.name, s.pp, s.vpp, s.microbatches, s.placement,
                    tuple(tuple(Job(j.kind, perm[j.mb], j.chunk) for j in seq) for seq in s.devices), s.overlapped)


def _torch_actions(text: str) -> dict:
    rows = [line.split(",") for line in text.strip().splitlines()]
    return {r: [torch_schedules._Action.from_str(c) for c in row] for r, row in enumerate(rows)}


@pytest.mark.parametrize("name, kw", PLANS, ids=[p[0] for p in PLANS])
def test_export_passes_torchs_validator_and_comm_lowering(name, kw):
    s = plan(name, make_spec(**kw))
    actions = _torch_actions(to_torch_csv(s))
    stage_to_rank = torch_schedules._validate_schedule(actions, s.pp, s.num_chunks, s.microbatches)
    assert stage_to_rank == {c: s.device_of(c) for c in range(s.num_chunks)}
    if s.overlapped:
        assert any(a.computation_type == torch_schedules.OVERLAP_F_B for row in actions.values() for a in row)
    with_comms = torch_schedules._add_send_recv(actions, lambda st: stage_to_rank[st], s.num_chunks)
    # torch's dry-run simulator does not know composites (it reads their placeholder stage -1): give it the parts
    flat = {r: [x for a in row for x in (a.sub_actions or (a,))] for r, row in with_comms.items()}
    torch_schedules._simulate_comms_compute(flat, lambda st: stage_to_rank[st], s.num_chunks)  # raises on deadlock


@pytest.mark.parametrize("name, kw", PLANS, ids=[p[0] for p in PLANS])
def test_round_trip_keeps_every_job_and_pair(name, kw):
    s = plan(name, make_spec(**kw))
    back = from_torch_csv(to_torch_csv(s))
    assert not validate(back)
    assert (back.pp, back.vpp, back.placement) == (s.pp, s.vpp, s.placement)
    # microbatches may be renumbered on export (the last chunk forwards 0, 1, 2, ...): compare up to that
    last = s.num_chunks - 1
    order = [j.mb for j in s.devices[s.device_of(last)] if j.kind is Kind.F and j.chunk == last]
    assert back.devices == _relabel(s, {old: new for new, old in enumerate(order)}).devices
    assert back.overlapped == s.overlapped


def test_the_last_stage_forwards_in_microbatch_order_after_export():
    s = plan("1f1b", make_spec(pp=2, microbatches=3))
    shuffled = _relabel(s, {0: 2, 1: 0, 2: 1})  # valid, but the last stage now forwards 2, 0, 1
    assert not validate(shuffled)
    rows = to_torch_rows(shuffled)
    last_f = [c for c in rows[1] if c.startswith("1F")]
    assert last_f == ["1F0", "1F1", "1F2"]
    assert to_torch_rows(shuffled) == to_torch_rows(s)


def test_vocabulary_is_torchs():
    s = plan("zbh1", make_spec(pp=2, microbatches=2))
    cells = {c for row in to_torch_rows(s) for c in row}
    assert {"0F0", "1I0", "1W0", "0I1", "0W1"} <= cells
    bw = plan("1f1b", make_spec(pp=2, microbatches=2))
    assert "1B0" in {c for row in to_torch_rows(bw) for c in row}  # BW = torch's full backward B


def test_import_drops_comms_reads_empty_cells_and_composites():
    rows = [["0F0", "", "0SEND_F0", "0UNSHARD", "0RECV_B0", "(0F1;0B0)OVERLAP_F_B", "0B1", "0REDUCE_GRAD"],
            ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1F1", "1B1"]]
    s = from_torch_rows(rows)
    assert [str(j) for j in s.devices[0]] == ["F0.0", "F1.0", "BW0.0", "BW1.0"]
    assert s.overlapped == {(0, 1)}
    assert (s.pp, s.vpp, s.microbatches) == (2, 1, 2)
    assert not validate(s)


def test_v_placement_is_read_from_where_stages_run():
    s = from_torch_csv("0F0,3F0,3B0,0B0\n1F0,2F0,2B0,1B0\n")
    assert s.placement.value == "v" and s.vpp == 2


@pytest.mark.parametrize("text, msg", [
    ("0F0,0X1\n", "row 1, cell 2: cannot read torch action '0X1'"),
    ("(0F0)OVERLAP_F_B\n", "must hold two actions"),
    ("0F0,1F0\n0B0,1B0\n", "stage 0 on ranks 0 and 1"),
    ("0F0,0B0\n1F0,1B0\n2F0,2B0\n", "same number of stages"),
    ("1F0,1B0\n0F0,0B0\n", "neither interleaved"),
])
def test_bad_torch_files_are_one_line_errors(text, msg):
    if "same number" in msg:
        text = "0F0,0B0,2F0,2B0\n1F0,1B0\n"
    with pytest.raises(ScheduleFormatError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        from_torch_csv(text)


def test_load_tells_formats_apart(tmp_path):
    s = plan("1f1b", make_spec(pp=2, microbatches=2))
    for fmt, name in (("torch", "t.csv"), ("pipeloom", "p.csv"), ("pipeloom", "p.json")):
        schedule_io.save(s, str(tmp_path / name), fmt)
        assert schedule_io.load(str(tmp_path / name)).devices == s.devices
    assert (tmp_path / "t.csv").read_text().splitlines()[0].startswith("0F0,")
    with pytest.raises(ScheduleFormatError, match="bad.csv: row 1, cell 2"):
        (tmp_path / "bad.csv").write_text("0F0,zz\n")
        schedule_io.load(str(tmp_path / "bad.csv"))
