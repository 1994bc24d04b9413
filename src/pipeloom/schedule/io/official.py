"""The official zero-bubble generators' schedules as pipeloom schedules (../shared/reference/official_zb.json).

Used by ``bench/zb_vs_official.py`` and the tests to hold pipeloom against the published generators. Units and the
job-string format are those of the reference README: job ``F3c1`` = forward of microbatch 3
on the device's local chunk 1; for ``zbv`` local chunk 0 of device d is global chunk d and
local chunk 1 is global chunk 2pp-1-d (V placement); one-chunk generators use chunk d.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from ...core.costs import Costs
from ...core.files import load_json
from ...core.ir import Job, Kind, Placement, Schedule, device_of, make_schedule

_JOB = re.compile(r"^(BW|F|B|W)(\d+)c(\d+)$")

#: our builder for each official generator
BUILDER_OF = {"zbv": "zbv", "zbh1": "zbh1", "zbh2": "zbh2", "1f1b": "1f1b"}


def reference_path() -> Path | None:
    """$PIPELOOM_REFERENCE, else ../shared/reference/official_zb.json next to the repository, else the
    copy shipped with the tests (tests/data/official_zb.json.gz, byte-identical once decompressed, so a
    clean clone without ../shared still runs the reference tests); None if absent."""
    env = os.environ.get("PIPELOOM_REFERENCE")
    if env:  # an explicit path is authoritative: no silent fallback
        return Path(env) if Path(env).is_file() else None
    here = Path(__file__).resolve()
    root = next((p for p in here.parents if (p / "pyproject.toml").is_file()), None)  # the checkout, if any
    if root is None:
        return None
    cands = [root.parent / "shared" / "reference" / "official_zb.json",
             root / "shared" / "reference" / "official_zb.json",
             root / "tests" / "data" / "official_zb.json.gz"]
    for p in cands:
        if p.is_file():
            return p
    return None


def load_reference(path: Path | str | None = None) -> dict | None:
    p = Path(path) if path else reference_path()
    if p is None or not p.is_file():
        return None
    return load_json(p, "reference file", gzip_ok=True)  # bounded, every error naming the file (core/files.py)


def case_costs(case: dict) -> Costs:
    c = case["costs"]
    return Costs(F=c["F"], B=c["B"], W=c["W"], comm=c["comm"])


def official_schedule(case: dict) -> Schedule:
    """The official job lists of ``case`` as a pipeloom :class:`Schedule` (global chunk ids)."""
    pp, vpp = case["pp"], case["vpp"]
    placement = Placement.V if vpp >= 2 else Placement.INTERLEAVED
    devs = []
    for d, seq in enumerate(case["jobs"]):
        out = []
        for s in seq:
            m = _JOB.match(s)
            if not m:
                raise ValueError(f"reference case {case['id']}: cannot parse job {s!r}")
            kind, mb, lc = Kind(m.group(1)), int(m.group(2)), int(m.group(3))
            chunks = [c for c in range(pp * vpp) if device_of(c, pp, placement) == d]
            out.append(Job(kind, mb, chunks[lc]))
        devs.append(out)
    return make_schedule(f"official-{case['generator']}", pp, vpp, case["microbatches"], placement, devs,
                         source=case["id"])
