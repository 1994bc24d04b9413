"""pipeloom simulate: plan a schedule and report makespan, bubbles and peak memory."""
from __future__ import annotations

from ..schedule.planning import evaluate
from .common import add_planning_options, fmt, plan_named, print_json, spec_from_args
from .dp_options import add_dp_options, dp_result, dp_wanted


def add_parser(sub) -> None:
    p = sub.add_parser("simulate", help="plan a schedule and simulate it under a cost model",
                       description="Plan a schedule, validate it and simulate it: makespan, bubble rate, "
                                   "stage bubble and per-device peak memory.")
    add_planning_options(p)
    add_dp_options(p, gantt=True)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object (public contract)")
    p.set_defaults(func=run)


def run(args) -> int:
    spec = spec_from_args(args, args.schedule)
    sched = plan_named(args.schedule, spec, check=False)
    res = evaluate(sched, spec)
    if dp_wanted(args) and res["makespan"] is not None:
        from ..sim.simulate import simulate
        sim = simulate(sched, spec.costs, spec.mem)
        dpr = dp_result(args, sched, sim)
        res.update(dpr.to_dict())
        if args.dp_gantt:
            from ..viz.gantt import draw_gantt
            from ..viz.timeline import from_sim
            from .common import check_out_path
            check_out_path("--dp-gantt", args.dp_gantt, (".png", ".svg", ".pdf"))
            tl = from_sim(sim, mem=spec.mem)
            tl.dp_bands = dpr.intervals
            print(f"wrote {draw_gantt(tl, args.dp_gantt)}", file=__import__("sys").stderr)
    elif getattr(args, "dp_gantt", None):
        raise ValueError("--dp-gantt draws the dp reduction: give --dp N with --model or --param-bytes")
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
    if "step_time" in res:
        t.add_row(f"step time with dp={res['dp']} reduction", fmt(res["step_time"]))
        t.add_row("dp exposed (un-hidden tail)", fmt(res["dp_exposed"]))
        t.add_row("dp hidden share", "-" if res["dp_hidden_share"] is None else f"{res['dp_hidden_share']:.1%}")
    t.add_row("memory limit", fmt(res["memory_limit"]) if res["memory_limit"] is not None else "none")
    t.add_row("valid", "yes" if res["valid"] else "[red]NO[/red]")
    con = Console()
    con.print(t)
    for v in res["violations"]:
        con.print(f"[red]violation:[/red] {v}")
