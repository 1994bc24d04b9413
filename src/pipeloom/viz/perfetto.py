"""Chrome trace / Perfetto JSON (the ``traceEvents`` format; no torch).

One process per machine with one thread per rank for a measured run, and one more process
"plan" with one thread per device for the planned schedule, so planned and measured sit
side by side. Jobs are complete events (``ph: X``) named like ``F3.1`` with category = kind;
memory is a counter track per row (``ph: C``); every step is a span on a "steps" thread.
Opens in https://ui.perfetto.dev and chrome://tracing.
"""
from __future__ import annotations

import json
import os

from ..core.files import atomic_write
from .timeline import KIND_NAMES, Timeline

# reserved colour names of the chrome://tracing viewer
_CNAME = {"F": "rail_response", "B": "rail_animation", "W": "good", "BW": "terrible"}
_STEPS_TID = 100000


def _meta(pid: int, name: str, sort: int) -> list[dict]:
    return [{"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": name}},
            {"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index", "args": {"sort_index": sort}}]


def _thread(pid: int, tid: int, name: str, sort: int) -> list[dict]:
    return [{"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}},
            {"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": sort}}]


def _rows_events(tl: Timeline, pid_of, tid_of, us: float, origin: float) -> list[dict]:
    ev: list[dict] = []
    for r, row in enumerate(tl.rows):
        pid, tid = pid_of(row), tid_of(r, row)
        for b in row.bars:
            args = {"kind": KIND_NAMES.get(b.kind, b.kind), "microbatch": b.mb, "chunk": b.chunk,
                    "local_chunk": b.local}
            if b.step is not None:
                args["step"] = b.step
            if b.late > 0:
                args[f"late_{tl.unit.replace(' ', '_')}"] = round(b.late, 6)
            ev.append({"name": b.name, "cat": b.kind, "ph": "X", "pid": pid, "tid": tid,
                       "ts": round((b.start - origin) * us, 3), "dur": round((b.end - b.start) * us, 3),
                       "cname": _CNAME.get(b.kind, "generic_work"), "args": args})
        for t, v in row.memory:
            ev.append({"name": f"memory {row.label}", "ph": "C", "pid": pid, "tid": tid,
                       "ts": round((t - origin) * us, 3), "args": {"units": round(v, 6)}})
    return ev


def chrome_trace(measured: Timeline | None = None, planned: Timeline | None = None, *,
                 us_per_unit: float = 1000.0, info: dict | None = None) -> dict:
    """Build the trace dict. ``us_per_unit``: microseconds per timeline time unit (ms -> 1000)."""
    events: list[dict] = []
    origin = min([t.t0 for t in (measured, planned) if t is not None] or [0.0])
    if measured is not None:
        machines = sorted({row.machine or 0 for row in measured.rows})
        for k in machines:
            events += _meta(k, f"machine {k}", k)
            events += _thread(k, _STEPS_TID, "steps", -1)
            for step, s, e in measured.steps:
                events.append({"name": f"step {step}", "cat": "step", "ph": "X", "pid": k, "tid": _STEPS_TID,
                               "ts": round((s - origin) * us_per_unit, 3),
                               "dur": round((e - s) * us_per_unit, 3), "cname": "grey", "args": {"step": step}})
        for r, row in enumerate(measured.rows):
            tid = row.rank if row.rank is not None else r
            events += _thread(row.machine or 0, tid, row.label, tid)
        events += _rows_events(measured, lambda row: row.machine or 0,
                               lambda r, row: row.rank if row.rank is not None else r, us_per_unit, origin)
    if planned is not None:
        pid = 1000
        events += _meta(pid, "plan (simulated)" if measured is None else "plan (simulated, same steps)", pid)
        for r, row in enumerate(planned.rows):
            events += _thread(pid, r, row.label, r)
        events += _rows_events(planned, lambda row: pid, lambda r, row: r, us_per_unit, origin)
    other = {"generator": "pipeloom", "time_unit": "1 timeline unit = "
             f"{us_per_unit:g} us ({(measured or planned).unit if (measured or planned) else ''})"}
    other.update(info or {})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_trace(path: str, measured: Timeline | None = None, planned: Timeline | None = None, *,
                us_per_unit: float = 1000.0, info: dict | None = None) -> str:
    """Write :func:`chrome_trace` to ``path`` (JSON); return the path."""
    data = chrome_trace(measured, planned, us_per_unit=us_per_unit, info=info)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_write(path) as fh:
        json.dump(data, fh, separators=(",", ":"))
    return path
