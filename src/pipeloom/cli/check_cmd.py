"""pipeloom check: compare a measured run's bubbles with its plan; find late jobs and the straggler."""
from __future__ import annotations

import argparse

from .common import check_out_path, nonnegative_int, number_type, wrap


def add_parser(sub) -> None:
    p = sub.add_parser(
        "check", help="bubble check of a run: planned vs measured bubble per device, late jobs, straggler rank",
        description=wrap("Read the worker logs of a run (the plan comes from their meta line), fit the job durations, "
                    "replay the plan, and report per device the planned and measured bubble, the jobs that started "
                    "late and by how much, the rank that causes them (its own jobs grew or started late; ranks "
                    "that only waited are not blamed) and a verdict. For FThenB, 1F1B and balanced interleaved "
                    "VPP the closed-form bubble positions of seed 002 are compared as well."),
        epilog="exit status: 0 when the check ran (1 with --strict and a verdict other than OK), 2 on bad input\n"
               "example:\n  pipeloom check logs\n  pipeloom check logs --json | jq .stragglers",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logdir", help="directory of workerlog.<rank> files or of machine<k>/ folders")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: planned_bubble, measured_bubble, stragglers, late_jobs, verdict, ...")
    p.add_argument("--straggler-threshold", type=number_type(0, 1, hi_open=True), default=0.03, metavar="FRACTION",
                   help="a rank is a straggler when it alone lengthens the step by this share of the planned "
                        "makespan (default: %(default)s)")
    p.add_argument("--late-tolerance", type=number_type(0, unit="a number of milliseconds"), default=None, metavar="MS",
                   help="a job is late when it starts this much after its planned start "
                        "(default: the larger of the median job time and 3%% of the planned makespan)")
    p.add_argument("--bubble-tolerance", type=number_type(0, 1, hi_open=True), default=0.05, metavar="FRACTION",
                   help="measured bubble may exceed the planned one by this much before the verdict says so "
                        "(default: %(default)s)")
    p.add_argument("--top", type=nonnegative_int, default=10, help="late jobs to list (default: %(default)s)")
    p.add_argument("--png", metavar="PATH", help="also draw the measured Gantt with late jobs framed (.png, .svg or .pdf)")
    p.add_argument("--strict", action="store_true", help="exit with status 1 unless the verdict is OK")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..trace.check import check_run, measured_timeline
    from ..trace.reader import read_logs
    from .common import print_json

    if args.png:
        check_out_path("--png", args.png, (".png", ".svg", ".pdf"))
    run_log = read_logs(args.logdir)
    rep = check_run(run_log, straggler_threshold=args.straggler_threshold,
                    late_tolerance=None if args.late_tolerance is None else args.late_tolerance / 1e3,
                    bubble_tolerance=args.bubble_tolerance)
    if args.png:
        from ..viz import write_outputs
        write_outputs([args.png], timeline=measured_timeline(run_log, late=rep.late_by_job))
    if args.json:
        d = rep.to_dict()
        if args.png:
            d["png"] = args.png
        print_json(d)
    else:
        _print(rep, run_log, args)
    return 1 if args.strict and not rep.ok else 0


def _print(rep, run_log, args) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    con = Console()
    con.width = max(con.width, 100)  # the tables need ~90 columns; piped output defaults to 80
    con.print(f"[bold]{rep.schedule}[/bold] pp={rep.pp} dp={rep.dp}  steps {rep.steps}  "
              f"{len(run_log.ranks)} ranks on {len(run_log.machines)} machine(s), clocks: {rep.clock_alignment}")
    fit = rep.fit
    scale = ", ".join(f"{k} {v * 1e3:.3g} ms" for k, v in fit["seconds_per_cost_unit"].items())
    con.print(f"fitted time per cost unit: {scale}; comm latency {fit['comm_s'] * 1e3:.3g} ms; "
              f"planned step {rep.planned_makespan_s * 1e3:.4g} ms, measured {rep.measured_makespan_s * 1e3:.4g} ms")
    t = Table(title="bubble per device (idle share of the step)", box=box.SIMPLE_HEAD, pad_edge=False)
    cols = ["rank", "pp"] + (["dp"] if rep.dp > 1 else []) + ["planned", "measured", "slowdown", "delay ms",
                                                             "step +%", "caused", ""]
    for c in cols:
        t.add_column(c, justify="right", no_wrap=True, min_width=max(len(c), 4))
    pr = {p["rank"]: p for p in rep.per_rank}
    for d in rep.per_device:
        p = pr.get(d["rank"], {})
        diff = d["measured_bubble"] - d["planned_bubble"]
        color = "red" if diff > args.bubble_tolerance else "green"
        cells = [str(d["rank"]), str(d["pp_rank"])] + ([str(d["dp_rank"])] if rep.dp > 1 else [])
        cells += [f"{100 * d['planned_bubble']:.1f}%", f"[{color}]{100 * d['measured_bubble']:.1f}%[/{color}]",
                  f"{p['slowdown']:.2f}x" if p.get("slowdown") else "-", f"{p.get('own_delay_s', 0) * 1e3:.1f}",
                  f"{100 * p.get('impact_frac', 0):.1f}", str(p.get("late_jobs_caused", 0)),
                  "[bold red]SLOW[/bold red]" if p.get("straggler") else ""]
        t.add_row(*cells)
    t.add_row(*(["all", ""] + ([""] if rep.dp > 1 else []) +
                [f"{100 * rep.planned_bubble:.1f}%", f"{100 * rep.measured_bubble:.1f}%", "", "", "",
                 str(rep.late_jobs), ""]))
    legend = ("slowdown = median job time / fitted; delay = own late starts; step +% = how much this rank "
                 "alone lengthens the step; caused = late jobs it causes; SLOW = straggler")
    con.print(t)
    con.print(f"[dim]{legend}[/dim]")
    if rep.closed_form:
        c = Table(title="seed 002 closed form vs measured, ms of idle: before the first job (lead), "
                        "in between (middle), after the last job (tail)", box=box.SIMPLE_HEAD, pad_edge=False)
        for col in ("stage", "lead plan", "meas", "middle plan", "meas", "tail plan", "meas"):
            c.add_column(col, justify="right", no_wrap=True, min_width=len(col))
        for r in rep.closed_form:
            c.add_row(str(r["stage"]), *(f"{x * 1e3:.3g}" for x in (r["lead"], r["measured_lead"], r["middle"],
                                                                    r["measured_middle"], r["tail"],
                                                                    r["measured_tail"])))
        con.print(c)
    if rep.late:
        lt = Table(title=f"late jobs: {rep.late_jobs} (tolerance {fit['late_tolerance_s'] * 1e3:.3g} ms), "
                         f"latest first", box=box.SIMPLE_HEAD, pad_edge=False)
        for col in ("step", "rank", "job", "late ms", "caused by rank"):
            lt.add_column(col, justify="right")
        for r in rep.late[: max(0, args.top)]:
            lt.add_row(str(r["step"]), str(r["rank"]), r["job"], f"{r['late_s'] * 1e3:.3g}",
                       "-" if r["cause_rank"] is None else str(r["cause_rank"]))
        con.print(lt)
    for w in rep.warnings:
        con.print(f"[yellow]warning:[/yellow] {w}")
    style = "green" if rep.ok else "red"
    con.print(f"[bold {style}]verdict: {rep.verdict}[/bold {style}]")
