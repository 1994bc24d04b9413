"""Read and write schedule files in any format pipeloom knows, told apart by name and content (no torch).

    .json                         pipeloom JSON
    .csv with pipeloom's header   pipeloom CSV (``# pipeloom schedule ...`` or a ``device,step,job`` header)
    .csv of torch actions         torch.distributed.pipelining's CSV (``1F3,1I3,...`` per rank)

A plan remembers what it was made with (``meta``: the builder and the memory limit in units): JSON in its
``meta`` object, pipeloom CSV in its header line. torch's CSV cannot hold a comment (torch's
``_load_csv`` reads every row as a rank's actions and fails on a ``#`` line), so :func:`save` writes that
beside it as ``NAME.csv.meta.json`` and :func:`load` reads it back from there.

Every error names the file; files are written whole or not at all.
"""
from __future__ import annotations

import csv
import re

from ...core.errors import ScheduleFormatError
from ...core.files import InputFileError, load_json, read_input, write_text
from ...core.ir import Schedule
from . import native

#: the formats :func:`save` writes
FORMATS = ("pipeloom", "torch")
#: the file beside a torch CSV that holds what the plan was made with (torch's CSV has no room for it)
META_SUFFIX = ".meta.json"


def read_text(path: str) -> str:
    """The file as text (at most the schedule-file cap); a one-line :class:`ScheduleFormatError` naming it when
    it cannot be read."""
    try:
        return read_input(path, "schedule file")
    except InputFileError as e:
        raise ScheduleFormatError(f"{e} (expected a schedule as UTF-8 JSON or CSV, as written by "
                                  f"'pipeloom plan -o')") from None


def parse(text: str, name: str = "") -> Schedule:
    """A schedule from file text: JSON, pipeloom CSV or torch CSV (from the name's suffix and the content)."""
    low = name.lower()
    body = text.lstrip("\ufeff \t\r\n")
    if low.endswith(".json") or (not low.endswith(".csv") and body.startswith("{")):
        return native.from_json(text)
    from . import torch_csv  # only when a CSV is read: keeps `pipeloom --help` and plain plans quick to start

    if torch_csv.looks_like_torch_csv(text) or re.match(r"\s*(\d+\s*[A-Za-z_]|\()", body):
        # a torch action list, malformed or not: torch's errors
        return _with_sidecar(torch_csv.from_torch_csv(text), name)
    return native.from_csv(text)


def sidecar_text(schedule: Schedule) -> str:
    """The ``NAME.csv.meta.json`` of a torch CSV: the schedule's name, shape and ``meta`` (builder, limit)."""
    import json

    return json.dumps({"format": "pipeloom-torch-csv-meta/1", "name": schedule.name, "pp": schedule.pp,
                       "vpp": schedule.vpp, "microbatches": schedule.microbatches,
                       "meta": {k: v for k, v in schedule.meta.items() if k in ("builder", "mem_limit")}},
                      indent=1, allow_nan=False) + "\n"


def _with_sidecar(sched: Schedule, path: str) -> Schedule:
    """``sched`` (read from torch's CSV at ``path``) with the name and meta of ``path + META_SUFFIX``, if there."""
    import dataclasses
    import os

    side = str(path) + META_SUFFIX
    if not path or not os.path.isfile(side):
        return sched
    try:  # bounded, every error naming the file (core/files.py)
        data = load_json(side, "schedule meta file")
    except InputFileError as e:
        raise ScheduleFormatError(f"{e} (what the plan was made with); delete it or write the CSV again") from None
    if not isinstance(data, dict) or not isinstance(data.get("meta", {}), dict):
        raise ScheduleFormatError(f"{side}: expected a JSON object with name, pp, vpp, microbatches and meta")
    shape = (data.get("pp"), data.get("vpp"), data.get("microbatches"))
    if shape != (sched.pp, sched.vpp, sched.microbatches):
        raise ScheduleFormatError(f"{side} describes pp={shape[0]} vpp={shape[1]} m={shape[2]} but the CSV holds "
                                  f"pp={sched.pp} vpp={sched.vpp} m={sched.microbatches}: it belongs to another plan; "
                                  f"delete it or write both again")
    meta = native.plan_meta({k: ("none" if v is None else str(v)) for k, v in data.get("meta", {}).items()})
    name = data.get("name") if isinstance(data.get("name"), str) and data.get("name") else sched.name
    return dataclasses.replace(sched, name=name, meta={**sched.meta, **meta})


def load(path: str) -> Schedule:
    """Read a schedule file in any known format; every error names the file."""
    text = read_text(path)
    try:
        return parse(text, str(path))
    except ScheduleFormatError as e:
        raise ScheduleFormatError(f"{path}: {e}") from None
    except csv.Error as e:  # e.g. a field over the csv module's 128 KiB limit
        raise ScheduleFormatError(f"{path}: not a readable CSV schedule ({e})") from None
    except RecursionError:
        raise ScheduleFormatError(f"{path}: nested too deeply to be a schedule") from None


def render(schedule: Schedule, path: str = ".json", fmt: str = "pipeloom") -> str:
    """The text :func:`save` writes: ``fmt`` "torch" = torch's compute-only CSV; "pipeloom" = CSV or JSON by suffix."""
    if fmt not in FORMATS:
        raise ScheduleFormatError(f"unknown schedule format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    if fmt == "torch":
        from . import torch_csv

        if not str(path).lower().endswith(".csv"):
            raise ScheduleFormatError(f"{path}: a torch schedule is a CSV file; give a name ending in .csv")
        return torch_csv.to_torch_csv(schedule)
    return native.to_csv(schedule) if str(path).lower().endswith(".csv") else native.to_json(schedule)


def save(schedule: Schedule, path: str, fmt: str = "pipeloom") -> list[str]:
    """Write ``schedule`` to ``path`` whole or not at all (see :func:`render` for the formats); a torch CSV gets
    its ``path + META_SUFFIX`` beside it. Returns the paths written."""
    write_text(path, render(schedule, path, fmt))
    if fmt != "torch":
        return [str(path)]
    write_text(str(path) + META_SUFFIX, sidecar_text(schedule))
    return [str(path), str(path) + META_SUFFIX]
