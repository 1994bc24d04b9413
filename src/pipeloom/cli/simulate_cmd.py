"""pipeloom simulate: plan a schedule and report makespan, bubbles and peak memory."""
from __future__ import annotations

from ..schedule.planning import evaluate
from .common import add_planning_options, fmt, plan_named, print_json, spec_from_args


def add_parser(sub) -> None:
    p = sub.add_parser("simulate", help="plan a schedule and simulate it under a cost model",
                       description="Plan a schedule, validate it and simulate it: makespan, bubble rate, "
                                   "stage bubble and per-device peak memory.")
    add_planning_options(p)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object (public contract)")
    p.set_defaults(func=run)


def run(args) -> int:
    spec = spec_from_args(args, args.schedule)
    sched = plan_named(args.schedule, spec, check=False)
    res = evaluate(sched, spec)
    if args.json:
        print_json(res)
    else:
        print_result(res)
    return 0 if res["valid"] else 1


def print_result(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{res['schedule']}  pp={res['pp']} vpp={res['vpp']} m={res['microbatches']}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("makespan", fmt(res["makespan"]))
    t.add_row("bubble (idle / pp*makespan)", fmt(res["bubble"]))
    t.add_row("stage bubble (max over devices)", fmt(res["stage_bubble"]))
    if res["peak_memory"] is not None:
        t.add_row("peak memory per device", " ".join(fmt(x, 3) for x in res["peak_memory"]))
    t.add_row("memory limit", fmt(res["memory_limit"]) if res["memory_limit"] is not None else "none")
    t.add_row("valid", "yes" if res["valid"] else "[red]NO[/red]")
    con = Console()
    con.print(t)
    for v in res["violations"]:
        con.print(f"[red]violation:[/red] {v}")
