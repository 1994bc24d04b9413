"""Drawing only: Gantt pictures, interactive HTML, Chrome/Perfetto traces, text Gantt (no torch).

Modules:
    timeline  drawable rows of job bars + memory curves, from a plan (SimResult) or a run
    gantt     PNG / SVG / PDF Gantt chart (matplotlib, imported only when drawing)
    html      self-contained interactive HTML page (hover details, zoom)
    perfetto  Chrome trace / Perfetto JSON, planned and measured side by side
    text      text Gantt for terminals

Run logs are read and analysed in :mod:`pipeloom.trace`; this package only draws.

Entry points: :func:`render_plan` (planned schedule -> files), :func:`write_outputs` (a timeline -> files).
"""
from __future__ import annotations

import os

from ..core.costs import MemModel
from ..sim.simulate import SimResult
from .gantt import draw_gantt
from .html import write_html
from .perfetto import write_trace
from .timeline import from_sim

__all__ = ["render_plan", "write_outputs", "in_seconds"]

OUTPUT_KINDS = (".png", ".svg", ".pdf", ".html", ".json")


def write_outputs(paths: list[str], *, timeline, planned=None, us_per_unit: float = 1000.0,
                  trace_info: dict | None = None) -> list[str]:
    """Write ``timeline`` to every path by suffix: .png/.svg/.pdf Gantt, .html page, .json Chrome trace.

    For a trace, ``planned`` (a second timeline) is written beside ``timeline`` when given.
    """
    out = []
    for p in paths:
        ext = os.path.splitext(p)[1].lower()
        if ext in (".png", ".svg", ".pdf"):
            out.append(draw_gantt(timeline, p))
        elif ext == ".html":
            out.append(write_html(timeline, p))
        elif ext == ".json":
            if planned is not None:
                out.append(write_trace(p, measured=timeline, planned=planned, us_per_unit=us_per_unit,
                                       info=trace_info))
            else:
                out.append(write_trace(p, planned=timeline, us_per_unit=us_per_unit, info=trace_info))
        else:
            raise ValueError(f"cannot write {p!r}: the output name must end in one of {', '.join(OUTPUT_KINDS)} "
                             f"(.json = Chrome/Perfetto trace)")
    return out


def render_plan(sim_result: SimResult, out_dir: str, *, stem: str | None = None, mem: MemModel | None = None,
                mem_limit: float | None = None, seconds_per_unit: float | None = None) -> list[str]:
    """Write the Gantt PNG, SVG, interactive HTML and Chrome trace JSON of a planned schedule.

    Returns the written paths (``<out_dir>/<stem>.gantt.png``, ``.gantt.svg``, ``.gantt.html``,
    ``.trace.json``; ``stem`` defaults to ``<name>-pp<pp>-vpp<vpp>-m<m>``). Times are in cost units (the
    trace draws one as one millisecond) or, with ``seconds_per_unit`` (the tuner's costs are seconds scaled
    to units), in seconds on every axis and in the trace.
    """
    s = sim_result.schedule
    stem = stem or f"{s.name}-pp{s.pp}-vpp{s.vpp}-m{s.microbatches}"
    os.makedirs(out_dir, exist_ok=True)
    if seconds_per_unit is not None:
        if not (seconds_per_unit > 0 and seconds_per_unit < float("inf")):
            raise ValueError(f"seconds_per_unit must be a finite number > 0, got {seconds_per_unit!r}")
        tl = from_sim(in_seconds(sim_result, seconds_per_unit), mem=mem, mem_limit=mem_limit, unit="s")
        us, note = 1e6, "planned schedule; times in seconds"
    else:
        tl = from_sim(sim_result, mem=mem, mem_limit=mem_limit)
        us, note = 1000.0, "planned schedule; 1 cost unit drawn as 1 ms"
    base = os.path.join(out_dir, stem)
    return write_outputs([base + ".gantt.png", base + ".gantt.svg", base + ".gantt.html", base + ".trace.json"],
                         timeline=tl, us_per_unit=us,
                         trace_info={"schedule": s.name, "pp": s.pp, "vpp": s.vpp, "microbatches": s.microbatches,
                                     "note": note})


def in_seconds(res: SimResult, seconds_per_unit: float) -> SimResult:
    """``res`` with every time (starts, ends, makespan, busy, idle, span) multiplied by ``seconds_per_unit``;
    bubbles and memory are ratios and units and stay as they are."""
    import dataclasses

    k = seconds_per_unit
    return dataclasses.replace(res, makespan=res.makespan * k, start=[[t * k for t in d] for d in res.start],
                               end=[[t * k for t in d] for d in res.end], busy=[t * k for t in res.busy],
                               idle=[t * k for t in res.idle], span=[t * k for t in res.span])

