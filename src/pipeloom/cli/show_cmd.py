"""pipeloom show: draw a saved schedule as a Gantt chart in the terminal."""
from __future__ import annotations

from ..schedule.ir import Schedule
from ..sim.costs import Costs
from ..sim.simulate import simulate


def add_parser(sub) -> None:
    p = sub.add_parser("show", help="draw a saved schedule (.csv/.json) as a Gantt chart",
                       description="Simulate a saved schedule and draw it as a text Gantt chart: one row per "
                                   "device, F/B/W/BW boxes labelled with the microbatch, '.' for idle time.")
    p.add_argument("file", help="schedule file written by 'pipeloom plan' (or by hand)")
    p.add_argument("--costs", default="F=1,B=1,W=1,comm=0", help="durations used to lay out the chart")
    p.add_argument("--width", type=int, default=0, help="columns for the chart (default: terminal width)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..viz.text import text_gantt

    sched = Schedule.load(args.file)
    res = simulate(sched, Costs.parse(args.costs))
    print(text_gantt(res, width=args.width or None))
    return 0
