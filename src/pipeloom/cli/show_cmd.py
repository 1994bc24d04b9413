"""pipeloom show: draw a saved schedule as a Gantt chart (terminal, PNG, SVG, HTML, Chrome trace)."""
from __future__ import annotations

import argparse

from ..core import progress
from ..core.costs import Costs, parse_mem_limit
from ..core.errors import DeadlockError
from ..sim.simulate import simulate
from .common import (add_costs_option, add_mem_limit_option, add_mem_option, check_out_path, fmt,
                     mem_model_from_args, positive_int, wrap)
from ..schedule import io as schedule_io


def add_parser(sub) -> None:
    p = sub.add_parser(
        "show", help="draw a saved schedule (.csv/.json) as a Gantt chart (terminal, .png, .svg, .html, trace)",
        description=wrap("Simulate a saved schedule and draw it: one row per device, F/B/W/BW boxes labelled with the "
                    "microbatch, local chunks by shade, idle time visible, activation memory under each row. "
                    "Without --out the chart is printed as text."),
        epilog="examples:\n  pipeloom plan -s 1f1b --pp 4 -m 8 -o 1f1b.json\n  pipeloom show 1f1b.json\n"
               "  pipeloom show 1f1b.json --out gantt.png --out gantt.html --out trace.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="schedule file written by 'pipeloom plan' (or by hand): .json or .csv")
    add_costs_option(p, help="durations used to lay out the chart (default: %(default)s)")
    add_mem_option(p, help="activation memory model (default a=1/vpp, b=a/2)")
    add_mem_limit_option(p, purpose="draw this memory limit under each row")
    p.add_argument("--out", "-o", action="append", default=[], metavar="PATH",
                   help="write a picture instead of printing: .png, .svg or .pdf (Gantt), .html (interactive: hover, "
                        "zoom) or .json (Chrome/Perfetto trace); repeat for several")
    p.add_argument("--width", type=_width, default=0,
                   help=f"columns of the text chart, at least {MIN_WIDTH} (default: terminal width)")
    p.set_defaults(func=run)


MIN_WIDTH = 20


def _width(text: str) -> int:
    v = positive_int(text)
    if v < MIN_WIDTH:
        raise argparse.ArgumentTypeError(f"must be >= {MIN_WIDTH} columns, got {v}")
    return v


def run(args) -> int:
    import os

    from ..schedule.validate import summary, validate
    from ..viz import OUTPUT_KINDS

    for out in args.out:
        if os.path.exists(out) and os.path.samefile(out, args.file):
            raise ValueError(f"--out {out} is the schedule file itself; give the picture or trace another name")
        check_out_path("--out", out, OUTPUT_KINDS, " (.json = Chrome/Perfetto trace)")
    progress.report(f"reading {args.file}")
    sched = schedule_io.load(args.file)
    costs, mem = Costs.parse(args.costs), mem_model_from_args(args)
    limit = parse_mem_limit(args.mem_limit, sched.pp)
    progress.report(f"validating and simulating {sched.num_jobs:,} jobs")
    v = validate(sched)
    if v:
        raise ValueError(f"{args.file}: cannot be drawn, schedule {sched.name!r} is invalid: {summary(v)}")
    try:
        res = simulate(sched, costs, mem)
    except DeadlockError as e:
        raise ValueError(f"{args.file}: cannot be drawn, {e}") from None
    bound = bound_line(sched, costs, mem, limit, res)
    if not args.out:
        from ..viz.text import text_gantt
        head, *rest = text_gantt(res, width=args.width or None).split("\n")
        print("\n".join([head, memory_line(res.peak_memory, sched.pp, limit), bound, *rest]))
        return 0
    from ..viz import write_outputs
    from ..viz.timeline import from_sim

    print(memory_line(res.peak_memory, sched.pp, limit))
    print(bound)
    progress.report(f"drawing {', '.join(args.out)}")
    tl = from_sim(res, mem=mem, mem_limit=limit)
    for path in write_outputs(args.out, timeline=tl, us_per_unit=1000.0,
                              trace_info={"schedule": sched.name, "note": "1 cost unit drawn as 1 ms"}):
        print(f"wrote {path}")
    return 0


def memory_line(peaks: list[float], pp: int, limit: float | None) -> str:
    """The header line on activation memory: peak per device, the largest in units and in p (1p = pp units)."""
    top = max(peaks) if peaks else 0.0
    over = "" if limit is None else (f", limit {fmt(limit)}" + (" EXCEEDED" if top > limit + 1e-9 else ""))
    return (f"peak memory per device (units): {' '.join(fmt(x, 3) for x in peaks)}  "
            f"(max {fmt(top, 3)} = {top / pp:.3g}p{over})")


def bound_line(sched, costs, mem, limit, res) -> str:
    """The makespan, its proven lower bound and the gap (:func:`pipeloom.schedule.search.bounds.plan_bound`)."""
    from ..schedule.registry import PlanSpec
    from ..schedule.search.bounds import plan_bound

    spec = PlanSpec(pp=sched.pp, microbatches=sched.microbatches, vpp=sched.vpp, costs=costs, mem=mem)
    b = plan_bound(sched, spec, res.makespan, max(res.peak_memory), limit)
    if b["lower_bound"] is None:
        return f"makespan {fmt(res.makespan)} (no lower bound for this schedule)"
    gap = "-" if b["gap"] is None else f"{b['gap']:.2%}"
    return (f"makespan {fmt(res.makespan)}, proven lower bound {fmt(b['lower_bound'])} at memory "
            f"{fmt(b['bound_limit'], 3)} units: gap {gap}")
