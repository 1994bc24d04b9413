"""pipeloom's own schedule files: JSON (``pipeloom-schedule/1``) and CSV (no torch).

CSV: a ``# pipeloom schedule key=value ...`` header line (optional in a hand-written file; ``builder`` and
``mem_limit``, in units, say what a planned schedule was made with), then ``device,step,job,overlap`` rows
(``overlap`` optional). JSON: one object with the shape fields and
one list of job strings per device. Every reading error is a :class:`ScheduleFormatError` (files are read and
written by :mod:`.files`, which names the file in each).
"""
from __future__ import annotations

import csv
import io
import json
from typing import Sequence

from ...core.errors import ScheduleFormatError
from ...core.files import InputFileError, parse_json
from ...core.ir import Job, Placement, Schedule, device_of, job_strings

#: the most jobs a schedule file may describe (header shape: pp x vpp x microbatches forward jobs)
from ...core.limits import MAX_JOBS  # noqa: E402  (every cap lives in core/limits.py)
#: how many times more forward jobs than the file holds a header may announce (see :func:`_check_size`)
SLACK = 100
#: what the CSV ``overlap`` column may hold: empty or 0 = not overlapped, 1 = overlapped with the next job
OVERLAP_VALUES = {"": False, "0": False, "1": True}
_PLACEMENTS = ", ".join(p.value for p in Placement)


def to_dict(schedule: Schedule) -> dict:
    return {
        "format": "pipeloom-schedule/1",
        "name": schedule.name,
        "pp": schedule.pp,
        "vpp": schedule.vpp,
        "microbatches": schedule.microbatches,
        "placement": schedule.placement.value,
        "devices": [job_strings(seq) for seq in schedule.devices],
        "overlapped": sorted([list(p) for p in schedule.overlapped]),
        "meta": schedule.meta,
    }


def to_json(schedule: Schedule, indent: int | None = 1) -> str:
    """JSON text; with ``indent`` each device's job list is one line (and written by json's C encoder)."""
    d = to_dict(schedule)
    if indent is None:
        return json.dumps(d)
    devices = d.pop("devices")
    overlapped = d.pop("overlapped")
    head = json.dumps(d, indent=indent)
    pad = " " * indent
    rows = ",\n".join(pad * 2 + json.dumps(seq) for seq in devices)
    return (f'{head[:-2]},\n{pad}"overlapped": {json.dumps(overlapped)},\n'
            f'{pad}"devices": [\n{rows}\n{pad}]\n}}')


def from_dict(data: dict) -> Schedule:
    devs = data.get("devices", [])
    if not isinstance(devs, list) or not all(isinstance(d, list) for d in devs):
        raise ScheduleFormatError("schedule JSON: 'devices' must be a list with one list of jobs per device, "
                                  "e.g. [[\"F0.0\", \"BW0.0\"], [\"F0.1\", \"BW0.1\"]]")
    try:
        devices = [[Job.parse(s) for s in seq] for seq in data["devices"]]
    except KeyError as e:
        raise ScheduleFormatError(f"schedule JSON lacks the key {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise ScheduleFormatError(f"schedule JSON has a bad job list: {e}") from None
    pp = _count(data.get("pp", len(devices)), "pp")
    inferred = _infer_shape(devices, pp)
    placement = data.get("placement", inferred[2])
    if placement not in [p.value for p in Placement]:
        raise ScheduleFormatError(f"schedule JSON: placement must be one of {_PLACEMENTS}, got {placement!r}")
    overlapped = data.get("overlapped", [])
    if not isinstance(overlapped, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(_is_int(x) and x >= 0 for x in p) for p in overlapped):
        raise ScheduleFormatError("schedule JSON: overlapped must be a list of [device, index] pairs of "
                                  "integers >= 0")
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise ScheduleFormatError(f"schedule JSON: meta must be an object, got {type(meta).__name__}")
    vpp = _count(data.get("vpp", inferred[0]), "vpp")
    microbatches = _count(data.get("microbatches", inferred[1]), "microbatches")
    _check_size(pp, vpp, microbatches, sum(len(d) for d in devices), "schedule JSON")
    return Schedule(
        name=str(data.get("name", "custom")),
        pp=pp,
        vpp=vpp,
        microbatches=microbatches,
        placement=Placement(placement),
        devices=tuple(tuple(s) for s in devices),
        overlapped=frozenset(tuple(p) for p in overlapped),
        meta=dict(meta),
    )


def from_json(text: str) -> Schedule:
    try:  # invalid JSON, too deep, a number of thousands of digits, a key twice: one line
        data = parse_json(text.removeprefix("\ufeff"), "schedule JSON")
    except InputFileError as e:
        raise ScheduleFormatError(str(e)) from None
    if not isinstance(data, dict):
        raise ScheduleFormatError("schedule JSON must be an object with a 'devices' list")
    return from_dict(data)


def to_csv(schedule: Schedule) -> str:
    """CSV with a ``# pipeloom`` header line of key=value pairs, then ``device,step,job,overlap`` rows."""
    buf = io.StringIO()
    buf.write(
        f"# pipeloom schedule name={schedule.name} pp={schedule.pp} vpp={schedule.vpp} "
        f"microbatches={schedule.microbatches} placement={schedule.placement.value}{_limit_tokens(schedule.meta)}\n"
    )
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["device", "step", "job", "overlap"])
    ov = schedule.overlapped
    for d, seq in enumerate(schedule.devices):
        w.writerows([(d, i, job, 1 if (d, i) in ov else 0) for i, job in enumerate(job_strings(seq))])
    return buf.getvalue()


def _limit_tokens(meta: dict) -> str:
    """`` builder=NAME mem_limit=UNITS`` of a planned schedule: what it was planned with (see :func:`plan_meta`)."""
    out = ""
    if isinstance(meta.get("builder"), str) and meta["builder"].strip() and " " not in meta["builder"]:
        out += f" builder={meta['builder']}"
    if "mem_limit" in meta:
        lim = meta["mem_limit"]
        out += f" mem_limit={'none' if lim is None else f'{float(lim):g}'}"
    return out


def plan_meta(header: dict) -> dict:
    """``builder`` and ``mem_limit`` (units, None = no limit) from ``key=value`` header fields; a bad limit is an
    error naming it."""
    meta: dict = {}
    if header.get("builder"):
        meta["builder"] = header["builder"]
    if "mem_limit" in header:
        v = header["mem_limit"]
        if v == "none":
            meta["mem_limit"] = None
        else:
            try:
                lim = float(v)
            except ValueError:
                lim = -1.0
            if not (lim > 0 and lim < float("inf")):
                raise ScheduleFormatError(f"header: mem_limit must be a number of units > 0 or none, got {v!r}")
            meta["mem_limit"] = lim
    return meta


def from_csv(text: str) -> Schedule:
    """Parse :meth:`to_csv` output, or a hand-written ``device,step,job`` file.

    The header comment is optional: without it pp, vpp, microbatches and placement are
    inferred from the jobs. Rows are ordered by (device, step).
    """
    header: dict[str, str] = {}
    rows: list[tuple[int, int, Job, bool]] = []
    body = []
    for n, line in enumerate(text.removeprefix("\ufeff").splitlines(), 1):
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            for tok in s.lstrip("#").split():
                if "=" in tok:
                    k, v = tok.split("=", 1)
                    header[k] = v
            continue
        body.append((n, line))
    if not body:
        raise ScheduleFormatError("CSV has no rows; expected a 'device,step,job' header then one row per job")
    reader = csv.reader([b for _, b in body])
    cols = [c.strip().lower() for c in next(reader)]
    need = ("device", "step", "job")
    if not all(c in cols for c in need):
        raise ScheduleFormatError(
            f"CSV header is {','.join(cols)!r}; it must name the columns device,step,job (overlap optional)"
        )
    idx = {c: cols.index(c) for c in cols}
    for (n, _), row in zip(body[1:], reader):
        try:
            d = int(row[idx["device"]])
            st = int(row[idx["step"]])
            job = Job.parse(row[idx["job"]])
            ov_text = row[idx["overlap"]].strip() if "overlap" in idx and len(row) > idx["overlap"] else ""
        except (IndexError, ValueError) as e:
            raise ScheduleFormatError(f"CSV line {n}: {e if str(e) else 'too few columns'}") from None
        if d < 0 or st < 0:
            raise ScheduleFormatError(f"CSV line {n}: device and step must be >= 0")
        if ov_text not in OVERLAP_VALUES:
            raise ScheduleFormatError(f"CSV line {n}: overlap must be 0, 1 or empty, got {ov_text!r}")
        rows.append((d, st, job, OVERLAP_VALUES[ov_text]))
    if not rows:
        raise ScheduleFormatError("CSV has a column header but no job rows; expected one 'device,step,job' row per job")
    pp = _count(header.get("pp", max(r[0] for r in rows) + 1), "CSV header: pp")
    vpp_h = header.get("vpp")
    mb_h = header.get("microbatches")
    _check_size(pp, _count(vpp_h, "CSV header: vpp") if vpp_h is not None else 1,
                _count(mb_h, "CSV header: microbatches") if mb_h is not None else 1, len(rows), "CSV header")
    if any(r[0] >= pp for r in rows):
        raise ScheduleFormatError(f"CSV names a device >= pp={pp}")
    per: list[list[tuple[int, Job, bool]]] = [[] for _ in range(pp)]
    for d, st, job, ov in rows:
        per[d].append((st, job, ov))
    devices, overlapped = [], set()
    for d, lst in enumerate(per):
        lst.sort(key=lambda t: t[0])
        steps = [t[0] for t in lst]
        if len(set(steps)) != len(steps):
            raise ScheduleFormatError(f"CSV gives device {d} two jobs at the same step")
        devices.append([t[1] for t in lst])
        overlapped |= {(d, i) for i, t in enumerate(lst) if t[2]}
    inferred = _infer_shape(devices, pp)
    if header.get("placement", inferred[2]) not in [p.value for p in Placement]:
        raise ScheduleFormatError(f"CSV header: placement must be one of {_PLACEMENTS}, got {header['placement']!r}")
    try:
        return Schedule(
            name=header.get("name", "custom"),
            pp=pp,
            vpp=_count(header.get("vpp", inferred[0]), "CSV header: vpp"),
            microbatches=_count(header.get("microbatches", inferred[1]), "CSV header: microbatches"),
            placement=Placement(header.get("placement", inferred[2])),
            devices=tuple(tuple(s) for s in devices),
            overlapped=frozenset(overlapped),
            meta=plan_meta(header),
        )
    except ScheduleFormatError:
        raise
    except ValueError as e:
        raise ScheduleFormatError(f"CSV header: {e}") from None


def _check_size(pp: int, vpp: int, microbatches: int, jobs: int, where: str) -> None:
    """Before anything is allocated from a header: refuse a shape over :data:`MAX_JOBS`, or one far beyond
    what the file's jobs can fill (every (microbatch, chunk) needs its own F; up to :data:`SLACK` times the
    file's jobs are let through so that the validator names the missing ones)."""
    need = pp * vpp * microbatches
    if need > MAX_JOBS:
        raise ScheduleFormatError(f"{where}: pp={pp} vpp={vpp} microbatches={microbatches} means {need:,} forward "
                                  f"jobs, more than the {MAX_JOBS:,} a schedule file may describe")
    if need > SLACK * jobs + 10_000:  # a few missing jobs are the validator's to report, one by one
        raise ScheduleFormatError(f"{where}: pp={pp} vpp={vpp} microbatches={microbatches} needs at least {need:,} "
                                  f"jobs (one F per microbatch and chunk) but the file holds only {jobs:,}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _count(x, name: str) -> int:
    """A shape field of a schedule file: an integer >= 1."""
    if isinstance(x, str) and x.strip().isdigit():
        x = int(x)
    if not _is_int(x) or x < 1:
        raise ScheduleFormatError(f"{name} must be an integer >= 1, got {x!r}")
    return x


def _infer_shape(devices: Sequence[Sequence[Job]], pp: int) -> tuple[int, int, str]:
    """Infer (vpp, microbatches, placement) from jobs when a file does not say."""
    jobs = [j for seq in devices for j in seq]
    if not jobs:
        return 1, 0, Placement.INTERLEAVED.value
    nc = max(j.chunk for j in jobs) + 1
    vpp = max(1, -(-nc // max(pp, 1)))
    mbs = max(j.mb for j in jobs) + 1
    placement = Placement.INTERLEAVED.value
    for d, seq in enumerate(devices):
        for j in seq:
            if device_of(j.chunk, pp, Placement.INTERLEAVED) != d:
                placement = Placement.V.value
    return vpp, mbs, placement
