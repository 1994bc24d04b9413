"""Read and write schedule files in any format pipeloom knows, told apart by name and content (no torch).

    .json                         pipeloom JSON
    .csv with pipeloom's header   pipeloom CSV (``# pipeloom schedule ...`` or a ``device,step,job`` header)
    .csv of torch actions         torch.distributed.pipelining's CSV (``1F3,1I3,...`` per rank)

Every error names the file; files are written whole or not at all.
"""
from __future__ import annotations

import csv

from ...core.errors import ScheduleFormatError
from ...core.files import write_text
from ...core.ir import Schedule
from . import native

#: the formats :func:`save` writes
FORMATS = ("pipeloom", "torch")


def read_text(path: str) -> str:
    """The file as text; a one-line :class:`ScheduleFormatError` naming it when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ScheduleFormatError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ScheduleFormatError(f"cannot read {path}: not a text file (expected a schedule as UTF-8 JSON "
                                  f"or CSV, as written by 'pipeloom plan -o')") from None


def parse(text: str, name: str = "") -> Schedule:
    """A schedule from file text: JSON, pipeloom CSV or torch CSV (from the name's suffix and the content)."""
    low = name.lower()
    body = text.lstrip("\ufeff \t\r\n")
    if low.endswith(".json") or (not low.endswith(".csv") and body.startswith("{")):
        return native.from_json(text)
    from . import torch_csv  # only when a CSV is read: keeps `pipeloom --help` and plain plans quick to start

    if torch_csv.looks_like_torch_csv(text):
        return torch_csv.from_torch_csv(text)
    return native.from_csv(text)


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


def save(schedule: Schedule, path: str, fmt: str = "pipeloom") -> None:
    """Write ``schedule`` to ``path`` whole or not at all (see :func:`render` for the formats)."""
    write_text(path, render(schedule, path, fmt))
