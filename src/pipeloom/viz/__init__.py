"""See the pipeline: Gantt pictures, Chrome/Perfetto traces, worker-log merge, bubble check (no torch).

Modules:
    timeline  drawable rows of job bars + memory curves, from a plan (SimResult) or a run
    gantt     PNG / SVG / PDF Gantt chart (matplotlib, imported only when drawing)
    html      self-contained interactive HTML page (hover details, zoom)
    trace     Chrome trace / Perfetto JSON, planned and measured side by side
    logs      read workerlog.<rank> and machine<k>/workerlog.<rank>, keep profiled steps, align clocks
    check     measured vs planned bubbles, late jobs, straggler attribution, verdict
    synth     synthetic worker logs (a schedule timed, written as logs, with injected trouble)
    sweep     how small a slowdown the check finds (python -m pipeloom.viz.sweep)
    replay    per-job replay of a schedule (used by check and synth)
    text      text Gantt for terminals

Entry points: :func:`render_plan` (planned schedule -> files), :func:`render_run` (log dir -> files).
"""
from __future__ import annotations

import os

from ..sim.costs import MemModel
from ..sim.simulate import SimResult

__all__ = ["render_plan", "render_run", "write_outputs"]

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
            from .gantt import draw_gantt
            out.append(draw_gantt(timeline, p))
        elif ext == ".html":
            from .html import write_html
            out.append(write_html(timeline, p))
        elif ext == ".json":
            from .trace import write_trace
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
                mem_limit: float | None = None) -> list[str]:
    """Write the Gantt PNG, SVG, interactive HTML and Chrome trace JSON of a planned schedule.

    Returns the written paths (``<out_dir>/<stem>.gantt.png``, ``.gantt.svg``, ``.gantt.html``,
    ``.trace.json``; ``stem`` defaults to ``<name>-pp<pp>-vpp<vpp>-m<m>``). Trace times: one cost
    unit is drawn as one millisecond.
    """
    from .timeline import from_sim

    s = sim_result.schedule
    stem = stem or f"{s.name}-pp{s.pp}-vpp{s.vpp}-m{s.microbatches}"
    os.makedirs(out_dir, exist_ok=True)
    tl = from_sim(sim_result, mem=mem, mem_limit=mem_limit)
    base = os.path.join(out_dir, stem)
    return write_outputs([base + ".gantt.png", base + ".gantt.svg", base + ".gantt.html", base + ".trace.json"],
                         timeline=tl, us_per_unit=1000.0,
                         trace_info={"schedule": s.name, "pp": s.pp, "vpp": s.vpp, "microbatches": s.microbatches,
                                     "note": "planned schedule; 1 cost unit drawn as 1 ms"})


def render_run(log_dir: str, out_dir: str, *, stem: str = "run") -> list[str]:
    """Read a log directory, check it, and write the measured Gantt PNG/HTML and the trace (plan beside run)."""
    from .check import check_run, measured_timeline, planned_timeline
    from .logs import read_logs

    run = read_logs(log_dir)
    rep = check_run(run)
    tl = measured_timeline(run, late=rep.late_by_job)
    base = os.path.join(out_dir, stem)
    os.makedirs(out_dir, exist_ok=True)
    paths = write_outputs([base + ".gantt.png", base + ".gantt.html"], timeline=tl)
    paths += write_outputs([base + ".trace.json"], timeline=tl, planned=planned_timeline(run, rep),
                           trace_info=run.summary())
    return paths
