"""pipeloom trace: merge per-rank worker logs into a Chrome/Perfetto trace and Gantt pictures."""
from __future__ import annotations

import argparse

from .common import check_out_path, wrap


def add_parser(sub) -> None:
    p = sub.add_parser(
        "trace", help="merge worker logs (pipeloom run --log-dir, or machine<k>/workerlog.<rank>) into a trace",
        description=wrap("Read LOGDIR/workerlog.<rank> (or LOGDIR/machine<k>/workerlog.<rank> gathered from several "
                    "machines), keep the profiled steps, align the machines' clocks (sync events, else the first "
                    "P2P pairs), skip malformed lines (counted), and write a Chrome trace / Perfetto JSON with one "
                    "process per machine and one thread per rank, the plan (replayed with the measured job "
                    "durations) beside it. Open it in https://ui.perfetto.dev or chrome://tracing."),
        epilog="example:\n  pipeloom run ... --log-dir logs --profile-steps 3:5\n"
               "  pipeloom trace logs --out trace.json --png gantt.png --html gantt.html",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logdir", help="directory of workerlog.<rank> files or of machine<k>/ folders, or torch profiler "
                                  "traces (a file or a directory; docs/diagnose.md lists the formats)")
    p.add_argument("--out", "-o", default="trace.json", metavar="TRACE.json",
                   help="Chrome/Perfetto trace to write (default: %(default)s)")
    p.add_argument("--png", metavar="PATH", help="also draw the measured Gantt chart (.png, .svg or .pdf)")
    p.add_argument("--html", metavar="PATH", help="also write the interactive HTML Gantt page")
    p.add_argument("--step", type=int, default=None, help="draw only this profiled step (default: all)")
    p.add_argument("--no-plan", action="store_true", help="leave the planned schedule out of the trace")
    p.set_defaults(func=run)


def run(args) -> int:
    from rich.console import Console

    import os

    from ..viz import write_outputs
    from ..trace.check import check_run
    from ..trace.timelines import measured_timeline, planned_timeline
    from ..trace.formats import accepted, detect

    con = Console()
    # output names first: nothing is written unless every output can be
    check_out_path("--out", args.out, (".json",), " (the trace is JSON)")
    if args.png:
        check_out_path("--png", args.png, (".png", ".svg", ".pdf"))
    if args.html:
        check_out_path("--html", args.html, (".html",))
    fmt = detect(args.logdir)
    if fmt.level != "jobs":
        raise ValueError(f"{args.logdir} is an {fmt.name} (ops, not pipeline jobs): pipeloom trace merges job-level "
                         f"logs ({accepted('jobs')}); for an op trace, pipeloom check {args.logdir} writes its "
                         f"Perfetto timeline")
    inputs = {os.path.realpath(p) for p in fmt.files(args.logdir)}
    for opt, p in (("--out", args.out), ("--png", args.png), ("--html", args.html)):
        if p and os.path.realpath(p) in inputs:
            raise ValueError(f"{opt} {p} is an input of this command; write the outputs elsewhere")
    run_log = fmt.read(args.logdir)
    if args.step is not None and args.step not in run_log.steps:
        raise ValueError(f"--step {args.step} is not among the profiled steps {run_log.steps}")
    planned, late, note = None, {}, None
    try:
        rep = check_run(run_log)
        late = rep.late_by_job
        if not args.no_plan:
            planned = planned_timeline(run_log, rep, step=args.step)
    except ValueError as e:  # CheckError: draw the run anyway
        note = f"plan not drawn: {e}"
        rep = None
    tl = measured_timeline(run_log, step=args.step, late=late)
    written = write_outputs([args.out], timeline=tl, planned=planned, trace_info=run_log.summary())
    if args.png:
        written += write_outputs([args.png], timeline=tl)
    if args.html:
        written += write_outputs([args.html], timeline=tl)
    s = run_log.summary()
    con.print(f"read {s['ranks']} rank log(s) on {s['machines']} machine(s): schedule {s['schedule']}"
              f"{' (inferred from the job order)' if s['schedule_inferred'] else ''}, pp={s['pp']} dp={s['dp']}, "
              f"steps {s['steps']}, {s['jobs']} jobs")
    offs = ", ".join(f"{k} {v * 1e3:+.3f} ms" for k, v in s["clock_offsets_s"].items())
    con.print(f"clocks aligned by {s['clock_alignment']}: {offs}")
    if s["dropped_jobs_outside_window"]:
        con.print(f"dropped {s['dropped_jobs_outside_window']} job(s) outside the profiled steps")
    if s["malformed_lines"]:
        con.print(f"[yellow]skipped {s['malformed_lines']} malformed line(s)[/yellow]")
    for w in s["warnings"]:
        if "malformed" not in w:
            con.print(f"[yellow]warning:[/yellow] {w}")
    if note:
        con.print(f"[yellow]{note}[/yellow]")
    if rep is not None:
        con.print(f"check: {rep.verdict}  (details: pipeloom check {args.logdir})")
    for pth in written:
        con.print(f"wrote {pth}")
    return 0
