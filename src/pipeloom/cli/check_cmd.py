"""pipeloom check: compare a measured run's bubbles with its plan; find late jobs and the straggler."""
from __future__ import annotations

import os

import argparse
import contextlib

from .common import check_out_path, nonnegative_int, number_type, positive_int, wrap


def add_parser(sub) -> None:
    p = sub.add_parser(
        "check", help="bubble check of a run: planned vs measured bubble per device, late jobs, straggler rank",
        description=wrap("Read the worker logs of a run (the plan comes from their meta line), fit the job durations, "
                    "replay the plan, and report per device the planned and measured bubble, the jobs that started "
                    "late and by how much, the rank that causes them (its own jobs grew or started late; ranks "
                    "that only waited are not blamed) and a verdict. For FThenB, 1F1B and balanced interleaved "
                    "VPP the closed-form bubble positions are compared as well. Every input (worker logs, torch "
                    "profiler traces, op traces of any trainer) then gets the what-if straggler analysis: slowdown S, "
                    "the workers, stages and op types that cause it, verdicts, a heatmap and a Perfetto timeline "
                    "(docs/diagnose.md)."),
        epilog="exit status: 0 when the check ran (1 with --strict and a verdict other than OK), 2 on bad input\n"
               "example:\n  pipeloom check logs\n  pipeloom check logs --json | jq .stragglers\n"
               "  pipeloom check trace.parquet --meta meta.yaml --steps 10:30\n"
               "op traces: exit status 1 with --strict when there is a verdict; worker logs: --strict follows the "
               "bubble check's verdict",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logdir", help="directory of workerlog.<rank> files or of machine<k>/ folders, torch profiler "
                                  "traces (a file or a directory), or an op trace of any trainer (.parquet or .csv); "
                                  "the formats of docs/diagnose.md")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: planned_bubble, measured_bubble, stragglers, late_jobs, verdict, and the "
                        "what-if keys slowdown, mw, ms, by_worker, by_stage, by_optype, imbalanced_stages, verdicts, "
                        "replay_error, whatif_stragglers, whatif {...} (with verdict_details: kind, text, score, "
                        "subject of each verdict), and format (the input format that read it)")
    p.add_argument("--straggler-threshold", type=number_type(0, 1, hi_open=True), default=0.03, metavar="FRACTION",
                   help="a rank is a straggler when it alone lengthens the step by this share of the planned "
                        "makespan (default: %(default)s)")
    p.add_argument("--late-tolerance", type=number_type(0, unit="a number of milliseconds"), default=None, metavar="MS",
                   help="a job is late when it starts this much after its planned start "
                        "(default: the larger of the median job time and 3%% of the planned makespan)")
    p.add_argument("--bubble-tolerance", type=number_type(0, 1, hi_open=True), default=0.05, metavar="FRACTION",
                   help="measured bubble may exceed the planned one by this much before the verdict says so "
                        "(default: %(default)s)")
    p.add_argument("--top", type=nonnegative_int, default=10,
                   help="late jobs to list, and rows of the what-if table (default: %(default)s)")
    p.add_argument("--png", metavar="PATH", help="also draw the measured Gantt with late jobs framed (.png, .svg or .pdf)")
    p.add_argument("--strict", action="store_true", help="exit with status 1 unless the verdict is OK")
    g = p.add_argument_group("what-if straggler analysis (every input; --meta: op traces .parquet / .csv only)")
    g.add_argument("--meta", metavar="META", help="YAML or JSON with dp_size, pp_size, tp_size, vpp_size, world_size "
                                                  "(and time_unit: s|ms|us|ns); what it lacks is inferred (the unit from the median forward: "
                                                  "below 1 seconds, below 10^4 ms, ...); default: META beside the trace")
    g.add_argument("--steps", metavar="STEPS", help="steps to analyse: 5, 1,3,5, A:B (A..B-1) or A: (default: all; worker logs: the "
                                                    "what-if section's steps)")
    g.add_argument("--slowdown-threshold", type=number_type(0, 1, hi_open=True), default=0.05, metavar="FRACTION",
                   help="report a worker, stage or op type when it alone slows the step by this share "
                        "(default: %(default)s)")
    g.add_argument("--layers", type=positive_int, default=None,
                   help="the model's decoder layers, for the rebalancing partition command (default: --model's, "
                        "else the layers pipeloom's logs record; without any, no command is given)")
    g.add_argument("--model", default=None, metavar="PRESET|CONFIG",
                   help="the run's model (a preset, a shipped config or a Hugging Face config.json): its layer "
                        "count for the rebalancing partition command")
    g.add_argument("--out", metavar="DIR", help="where the heatmap, Perfetto timeline and layer costs go "
                                                "(default: TRACE.whatif/ or LOGDIR.whatif/ beside the input)")
    g.add_argument("--no-pictures", action="store_true", help="skip the heatmap and the timeline")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..trace.formats import detect

    fmt = detect(args.logdir)
    layers = _layers(args)
    if fmt.level == "ops":
        if args.png or args.late_tolerance is not None:
            raise ValueError(f"--{'png' if args.png else 'late-tolerance'} applies to worker logs and torch profiler "
                             f"traces (pipeline jobs); for an op trace the pictures go to --out DIR")
        return run_optrace(args, fmt, layers)
    if args.meta is not None:
        raise ValueError(f"--meta applies to op traces (.parquet / .csv), not to {args.logdir} (the sizes of a run "
                         f"come from its logs)")
    from ..trace.check import check_run
    from ..trace.timelines import measured_timeline
    from ..trace.ops.opcheck import parse_steps
    from .common import print_json

    if args.png:
        check_out_path("--png", args.png, (".png", ".svg", ".pdf"))
    parse_steps(args.steps)  # a bad --steps is an error before any work
    _outputs_apart(args, fmt)
    run_log = fmt.read(args.logdir)
    rep = check_run(run_log, straggler_threshold=args.straggler_threshold,
                    late_tolerance=None if args.late_tolerance is None else args.late_tolerance / 1e3,
                    bubble_tolerance=args.bubble_tolerance)
    if args.png:
        from ..viz import write_outputs
        write_outputs([args.png], timeline=measured_timeline(run_log, late=rep.late_by_job))
    wi, wi_error = _run_whatif(run_log, args, layers)
    if args.json:
        d = rep.to_dict()
        if args.png:
            d["png"] = args.png
        d["format"] = fmt.name
        d.update(whatif_keys(wi, wi_error, d))
        print_json(d)
    else:
        _print(rep, run_log, args)
        _print_run_whatif(wi, wi_error, args)
    return 1 if args.strict and not rep.ok else 0


def _layers(args) -> int | None:
    """The model's layer count for the rebalancing advice: --layers, else --model's config (None: neither)."""
    if args.model is None:
        return args.layers
    from .common import model_from_args

    m = model_from_args(args)
    if args.layers is not None and args.layers != m.layers:
        raise ValueError(f"--layers {args.layers} contradicts --model {args.model} ({m.layers} layers); give one")
    return m.layers


OUTPUT_NAMES = ("heatmap.png", "timeline.perfetto.json", "layer-costs.json")
"""what the what-if analysis writes into its --out folder"""


def _outputs_apart(args, fmt) -> None:
    """Refuse, before any work, outputs that would replace an input or land among the inputs (a later check of
    the same folder would read them as part of the run)."""
    import os

    from ..trace.ops.opcheck import default_out_dir

    inputs = {os.path.realpath(p) for p in fmt.files(args.logdir)}
    if args.meta:
        inputs.add(os.path.realpath(args.meta))
    out_dir = args.out or default_out_dir(args.logdir)
    outs = [("--png", args.png)] if getattr(args, "png", None) else []
    if not args.no_pictures:
        outs += [("--out", os.path.join(out_dir, n)) for n in OUTPUT_NAMES]
    for opt, p in outs:
        if os.path.realpath(p) in inputs:
            raise ValueError(f"{opt} {p} is an input of this check; write the outputs elsewhere")
    if args.out and os.path.isdir(args.logdir):
        root, out = os.path.realpath(args.logdir), os.path.realpath(args.out)
        if out == root or out.startswith(root + os.sep):
            raise ValueError(f"--out {args.out} is inside the input directory {args.logdir}: the pictures would be "
                             f"read as part of the run next time; give a folder outside it")


#: what-if keys copied to the top level of a run log's ``--json`` (the whole analysis is under ``whatif``;
#: its ``stragglers``, workers, would clash with the bubble check's ranks: they are ``whatif_stragglers`` there)
WHATIF_TOP_KEYS = ("slowdown", "mw", "ms", "by_worker", "by_stage", "by_optype", "imbalanced_stages", "verdicts",
                   "replay_error")


def _run_whatif(run_log, args, layers: int | None) -> tuple[dict | None, str | None]:
    """The what-if analysis of a run log (trace/runops.py), or None and why it could not run."""
    from ..trace.runops import check_run_whatif
    from ..trace.ops.whatif import WhatIfError

    kw = dict(steps=args.steps, threshold=args.slowdown_threshold, layers=layers, out_dir=args.out)
    try:
        with _progress() as progress:
            try:
                return check_run_whatif(run_log, pictures=not args.no_pictures, progress=progress, **kw), None
            except OSError as e:  # the pictures' folder: the analysis stands without them
                d = check_run_whatif(run_log, pictures=False, **kw)
                d["warnings"].append(f"no pictures: cannot write to {getattr(e, 'filename', None) or args.out}: "
                                     f"{e.strerror or e} (give --out DIR or --no-pictures)")
                d["pictures"] = {}
                return d, None
    except WhatIfError as e:
        if args.steps is not None:  # the steps asked for are not there: the user's to fix
            raise
        return None, str(e)
    except OSError as e:  # layer-costs.json of a heavy stage could not be written either
        return None, (f"cannot write to {getattr(e, 'filename', None) or args.out}: {e.strerror or e} "
                      f"(give --out DIR)")


def whatif_keys(wi: dict | None, error: str | None, existing: dict) -> dict:
    """The keys a run log's ``--json`` gains: the item-5 keys at the top (never replacing a key of the bubble
    check), ``whatif_stragglers`` (workers with their ranks), the whole analysis under ``whatif``."""
    if wi is None:
        return {"whatif": None, "whatif_error": error}
    out = {k: wi[k] for k in WHATIF_TOP_KEYS if k not in existing}
    ranks = {(r["dp_rank"], r["stage"]): r["rank"] for r in wi["by_rank"]}
    out["whatif_stragglers"] = [dict(s, rank=ranks.get((s["dp_rank"], s["stage"]))) for s in wi["stragglers"]]
    out["whatif"] = wi
    return out


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
        c = Table(title="closed form vs measured, ms of idle: before the first job (lead), "
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


# ------------------------------------------------------------------------------------------ op traces
def run_optrace(args, fmt, layers: int | None) -> int:
    """check TRACE (an op-level format, e.g. .parquet|.csv): what-if straggler analysis (trace/runops.py)."""
    import sys

    from rich.console import Console

    from ..trace.ops.opcheck import check_ops, default_out_dir, parse_steps
    from ..trace.ops.optrace import find_meta
    from .common import print_json

    parse_steps(args.steps)
    _outputs_apart(args, fmt)
    meta = args.meta
    if meta is None and os.path.isfile(args.logdir):  # the sizes published beside the trace (meta-X.yaml)
        meta = find_meta(args.logdir)
    with _progress() as progress:
        progress(what="reading trace")
        tr = fmt.read(args.logdir, meta=meta)
        d = check_ops(tr, steps=args.steps, threshold=args.slowdown_threshold, layers=layers,
                      out_dir=args.out or default_out_dir(args.logdir), pictures=not args.no_pictures,
                      progress=progress)
        d["format"] = fmt.name
        d["meta_file"] = meta
    if args.json:
        print_json(d)
    else:
        _print_optrace(d, Console(file=sys.stdout), args.top)
    return 1 if args.strict and d["verdicts"] else 0


@contextlib.contextmanager
def _progress():
    """A rich progress bar on stderr (only on a terminal); yields ``progress(total=, advance=, what=)``."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task("reading", total=None)

        def progress(total=None, advance=0, what=None):
            if total is not None:
                bar.update(task, total=total, completed=0)
            if what:
                bar.update(task, description=what)
            if advance:
                bar.advance(task, advance)

        yield progress


def _print_run_whatif(wi: dict | None, error: str | None, args) -> None:
    import sys

    from rich.console import Console

    con = Console(file=sys.stdout)
    con.width = max(con.width, 100)
    con.rule("what-if straggler analysis (Lin et al., OSDI 2025): the jobs as ops, see docs/diagnose.md")
    if wi is None:
        con.print(f"[yellow]what-if analysis not possible:[/yellow] {error}")
        return
    _print_whatif(wi, con, args.top, verdict="what-if verdict")


def _print_optrace(d: dict, con, top: int) -> None:
    con.width = max(con.width, 100)
    sz = d["sizes"]
    con.print(f"[bold]{d['trace']}[/bold]  dp={sz['dp_size']} pp={sz['pp_size']} tp={sz['tp_size']} "
              + (f"cp={sz['cp_size']} " if sz.get("cp_size", 1) != 1 else "")
              + f"vpp={sz['vpp_size']} world={sz['world_size']}"
              + (f" (from {os.path.basename(d['meta_file'])})" if d.get("meta_file") else "")
              + (f" (inferred: {', '.join(d['inferred_sizes'])})" if d["inferred_sizes"] else "")
              + f"  {len(d['steps'])} steps, {d['ops']} ops" + (f", {d['malformed_rows']} malformed rows skipped"
                                                              if d["malformed_rows"] else ""))
    _print_whatif(d, con, top)


def _print_whatif(d: dict, con, top: int, verdict: str = "verdict") -> None:
    from rich import box
    from rich.table import Table

    u = d["time_unit"]
    con.print(f"step time: measured {d['step_time_measured']:.4g} {u}, replayed {d['step_time_replayed']:.4g} {u} "
              f"(replay error {100 * d['replay_error']:.2f}%), without launch gaps {d['step_time_no_launch_gaps']:.4g}"
              f" {u} ({100 * d['replay']['error']:.2f}% off: the replay accuracy), what-if ideal "
              f"{d['step_time_ideal']:.4g} {u}")
    con.print(f"slowdown S = [bold]{d['slowdown']:.3f}x[/bold]   M_W (top workers fixed) = {100 * d['mw']:.0f}%   "
              f"M_S (last stage fixed) = {100 * d['ms']:.0f}%")
    t = Table(title="what alone slows the step (S_x = ideal with x as measured / ideal)", box=box.SIMPLE_HEAD,
              pad_edge=False)
    for c in ("op type", "S_t", "stage", "S_stage", "worker", "S_w", "score", "compute x"):
        t.add_column(c, justify="right", no_wrap=True)
    ops = d["by_optype"][:top]
    stages = sorted(d["by_stage"], key=lambda r: -r["slowdown"])[:top]
    workers = sorted(d["by_worker"], key=lambda r: -r["slowdown"])[:top]
    for i in range(max(len(ops), len(stages), len(workers))):
        o = ops[i] if i < len(ops) else None
        s = stages[i] if i < len(stages) else None
        w = workers[i] if i < len(workers) else None
        t.add_row(o["optype"] if o else "", f"{o['slowdown']:.3f}" if o else "",
                  str(s["stage"]) if s else "", f"{s['slowdown']:.3f}" if s else "",
                  f"dp {w['dp_rank']} / pp {w['stage']}" if w else "",
                  (f"{w['slowdown']:.3f}" + ("" if w["exact"] else "*")) if w else "",
                  f"{w['score']:.2f}" if w else "",
                  f"{w['compute_ratio']:.2f}" if w and w["compute_ratio"] is not None else "")
    con.print(t)
    con.print("[dim]* = bound min(S_dp, S_stage); score = share of the slowdown the worker alone explains; "
              "compute x = its compute time / typical[/dim]")
    for w in d["warnings"]:
        con.print(f"[yellow]warning:[/yellow] {w}")
    if d["verdicts"]:
        from rich.markup import escape

        # a replay that does not reproduce the measured step makes every what-if figure a guess: say so on
        # each verdict instead of stating it as a finding
        shaky = d.get("whatif_reliable") is False
        for v in d["verdicts"]:
            label = f"[yellow]{verdict} (unreliable replay, a guess):[/yellow]" if shaky else \
                f"[bold red]{verdict}:[/bold red]"
            con.print(f"{label} {escape(v)}")  # "[score 0.82]" is no markup
    else:
        con.print(f"[bold green]{verdict}: OK[/bold green] (no worker, stage or op type slows the step by "
                  f">= {100 * d['threshold']:.0f}%)")
    for k, p in d["pictures"].items():
        con.print(f"{k.replace('_', ' ')}: {p}")
