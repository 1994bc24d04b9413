"""torch.distributed.pipelining's schedule CSV, both ways (no torch needed).

torch's format (``_PipelineScheduleRuntime._load_csv`` / ``_dump_csv``): one row per rank, one cell
per action, ``{stage}{type}{microbatch}``; an empty cell is idle. The vocabulary maps one to one
(written down once, here, beside :class:`~pipeloom.core.ir.Job`'s string form):

    pipeloom  F3.1   forward of microbatch 3 on global chunk 1   torch  1F3
    pipeloom  B3.1   input-gradient backward                     torch  1I3
    pipeloom  W3.1   weight-gradient backward                    torch  1W3
    pipeloom  BW3.1  both fused (full backward)                   torch  1B3

torch's stage index is pipeloom's global chunk. Two jobs that pipeloom runs as one overlapped pair
(DualPipe) are torch's composite ``(a;b)OVERLAP_F_B``. Files with communication
(``compute_comms``) also hold ``SEND_F``/``RECV_F``/``SEND_B``/``RECV_B``/``UNSHARD``/``RESHARD``/
``REDUCE_GRAD`` cells: reading drops them (pipeloom derives its own comm plan).

The trap on export: torch keeps the last stage's losses in the order that stage runs its
forwards and assumes that order is microbatch 0, 1, 2, ... A valid plan whose last chunk forwards
microbatches in another order would run with wrong losses and gradients. Microbatches are
interchangeable, so :func:`to_torch_rows` renumbers them (a bijection, which keeps every
dependency) so that the last chunk forwards 0, 1, 2, ... in order.
"""
from __future__ import annotations

import csv
import io
import re

from ...core.errors import ScheduleFormatError
from ...core.ir import Job, Kind, Placement, Schedule, device_of
from ...core.torch_kinds import KIND_OF_LETTER, TORCH_LETTER  # noqa: F401  (the one map; re-exported)
from .native import _check_size

#: communication and sharding actions a compute+comms file may hold; reading drops them
COMM_ACTIONS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD")

_ACTION = r"^(\d+)(F|I|W|B)(\d+)$"
_COMM = r"^(\d+)(" + "|".join(COMM_ACTIONS) + r")(\d*)$"
_OVERLAP = r"^\((.*)\)OVERLAP_F_B$"


def torch_action(job: Job) -> str:
    """torch's action string of a job: ``F3.1`` -> ``1F3``."""
    return f"{job.chunk}{TORCH_LETTER[job.kind]}{job.mb}"


def renumbering(schedule: Schedule) -> dict[int, int]:
    """old microbatch -> new: the last chunk's forwards, in the order its device runs them, become 0, 1, 2, ..."""
    last = schedule.num_chunks - 1
    order = [j.mb for j in schedule.devices[schedule.device_of(last)] if j.kind is Kind.F and j.chunk == last]
    if sorted(order) != list(range(schedule.microbatches)):
        raise ScheduleFormatError(f"cannot export for torch: the last chunk ({last}) does not forward every "
                                  f"microbatch 0..{schedule.microbatches - 1} exactly once; validate the plan first")
    return {old: new for new, old in enumerate(order)}


def to_torch_rows(schedule: Schedule) -> list[list[str]]:
    """One row of torch action strings per rank (microbatches renumbered, see the module docstring)."""
    new = renumbering(schedule)
    rows = []
    for d, seq in enumerate(schedule.devices):
        row, i = [], 0
        while i < len(seq):
            a = Job(seq[i].kind, new[seq[i].mb], seq[i].chunk)
            if (d, i) in schedule.overlapped and i + 1 < len(seq):
                b = Job(seq[i + 1].kind, new[seq[i + 1].mb], seq[i + 1].chunk)
                row.append(f"({torch_action(a)};{torch_action(b)})OVERLAP_F_B")
                i += 2
                continue
            row.append(torch_action(a))
            i += 1
        rows.append(row)
    return rows


def to_torch_csv(schedule: Schedule) -> str:
    """torch's ``compute_only`` CSV text of ``schedule``."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(to_torch_rows(schedule))
    return buf.getvalue()


def _job_of(cell: str, rank: int, col: int) -> Job:
    m = re.match(_ACTION, cell)
    if not m:
        raise ScheduleFormatError(f"row {rank + 1}, cell {col + 1}: cannot read torch action {cell!r}; expected "
                                  f"STAGE F|I|W|B MICROBATCH (e.g. 1F3), a (a;b)OVERLAP_F_B composite, an empty "
                                  f"cell, or one of {', '.join(COMM_ACTIONS)}")
    return Job(KIND_OF_LETTER[m.group(2)], int(m.group(3)), int(m.group(1)))


def from_torch_rows(rows: list[list[str]], *, name: str = "torch") -> Schedule:
    """A pipeloom :class:`Schedule` from torch's per-rank action rows (compute-only or compute+comms).

    pp = the number of rows; the placement is read from where each stage appears (interleaved: stage
    ``s`` on rank ``s % pp``; V: zigzag); microbatches and chunks from the actions.
    """
    devices: list[list[Job]] = []
    overlapped: set[tuple[int, int]] = set()
    for r, row in enumerate(rows):
        seq: list[Job] = []
        for c, raw in enumerate(row):
            cell = raw.strip()
            if not cell or re.match(_COMM, cell):
                continue
            ov = re.match(_OVERLAP, cell)
            if ov:
                parts = [p.strip() for p in ov.group(1).split(";") if p.strip()]
                if len(parts) != 2:
                    raise ScheduleFormatError(f"row {r + 1}, cell {c + 1}: an OVERLAP_F_B composite must hold "
                                              f"two actions, got {cell!r}")
                overlapped.add((r, len(seq)))
                seq += [_job_of(p, r, c) for p in parts]
                continue
            seq.append(_job_of(cell, r, c))
        devices.append(seq)
    pp = len(devices)
    jobs = [j for seq in devices for j in seq]
    if pp == 0 or not jobs:
        raise ScheduleFormatError("torch schedule CSV holds no actions; expected one row of actions per rank")
    nc = max(j.chunk for j in jobs) + 1
    if nc % pp:
        raise ScheduleFormatError(f"torch schedule CSV names stages 0..{nc - 1} on {pp} ranks; every rank must hold "
                                  f"the same number of stages")
    vpp, m = nc // pp, max(j.mb for j in jobs) + 1
    _check_size(pp, vpp, m, len(jobs), "torch schedule CSV")
    home = {}
    for d, seq in enumerate(devices):
        for j in seq:
            if home.setdefault(j.chunk, d) != d:
                raise ScheduleFormatError(f"torch schedule CSV runs stage {j.chunk} on ranks {home[j.chunk]} and {d}; "
                                          f"a stage belongs to one rank")
    placement = next((p for p in (Placement.INTERLEAVED, Placement.V)
                      if all(device_of(c, pp, p) == d for c, d in home.items())), None)
    if placement is None:
        raise ScheduleFormatError("torch schedule CSV places stages neither interleaved (stage s on rank s % pp) "
                                  "nor in a V (zigzag); pipeloom schedules use one of those two")
    return Schedule(name, pp, vpp, m, placement, tuple(tuple(s) for s in devices), frozenset(overlapped),
                    meta={"source": "torch"})


def from_torch_csv(text: str, *, name: str = "torch") -> Schedule:
    """Parse torch's schedule CSV text (see :func:`from_torch_rows`)."""
    try:
        rows = list(csv.reader(io.StringIO(text.removeprefix("\ufeff"))))
    except csv.Error as e:
        raise ScheduleFormatError(f"torch schedule CSV: {e}") from None
    while rows and not any(c.strip() for c in rows[-1]):
        rows.pop()  # a trailing empty line is no rank
    return from_torch_rows(rows, name=name)


def looks_like_torch_csv(text: str) -> bool:
    """True when the first non-empty cell reads as a torch action (and not as pipeloom's CSV header)."""
    for line in text.removeprefix("\ufeff").splitlines():
        cells = [c.strip() for c in line.split(",") if c.strip()]
        if cells:
            first = cells[0]
            return bool(re.match(_ACTION, first) or re.match(_COMM, first) or re.match(_OVERLAP, first))
    return False
