"""pipeloom simulate: plan a schedule (or read a schedule file) and report makespan, bubbles and peak memory."""
from __future__ import annotations

import argparse

from ..schedule.planning import evaluate, make_spec
from .common import (PARTITION_KEYS, add_builder_options, add_costs_option, add_mem_limit_option, add_mem_option,
                     add_partition_options, add_schedule_option, add_shape_options, fmt, mem_model_from_args,
                     plan_named, print_json, spec_from_args)


def add_parser(sub) -> None:
    p = sub.add_parser("simulate", help="plan a schedule (or read a schedule file) and simulate it under a cost model",
                       description="Plan a schedule, validate it and simulate it: makespan, bubble rate, "
                                   "stage bubble and per-device peak memory. With --plan FILE the schedule is read "
                                   "from a file instead (pipeloom JSON/CSV or torch CSV; pp, vpp and microbatches "
                                   "come from the file; --costs, --mem, --runtime and --mem-limit apply).",
                       epilog="examples:\n  pipeloom simulate -s zbvpp --pp 4 -m 8 --json\n"
                              "  pipeloom plan -s zbvpp --pp 4 -m 8 -o plan.json && "
                              "pipeloom simulate --plan plan.json --runtime torch --mem-limit 1p",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group()
    add_schedule_option(which, required=False,
                        help="schedule builder (required unless --plan is given); one of: " + _names())
    which.add_argument("--plan", metavar="FILE",
                       help="simulate this schedule file (.json or .csv written by 'pipeloom plan', torch's CSV, or "
                            "hand-written) instead of planning one; its pp, vpp and microbatches are used")
    add_shape_options(p, required=False, pp_help="pipeline degree (number of devices; required with --schedule)",
                      m_help="microbatches per step (required with --schedule)")
    add_mem_limit_option(p)
    add_costs_option(p)
    add_mem_option(p)
    add_builder_options(p)
    add_partition_options(p)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object (public contract)")
    p.set_defaults(func=run)


def _names() -> str:
    from ..schedule import registry

    return ", ".join(registry.names())


def run(args) -> int:
    if args.plan is not None:
        sched, spec = _from_file(args)
    else:
        missing = [f for f, v in (("--schedule", args.schedule), ("--pp", args.pp), ("--microbatches", args.microbatches))
                   if v is None]
        if missing:
            raise ValueError(f"simulate needs {', '.join(missing)} (or --plan FILE to simulate a schedule file)")
        spec = spec_from_args(args, args.schedule)
        sched = plan_named(args.schedule, spec, check=False)
    res = evaluate(sched, spec)
    if args.json:
        print_json(res)
    else:
        print_result(res)
    return 0 if res["valid"] else 1


def _from_file(args):
    """The schedule of --plan and the spec that times it (the shape from the file, costs and memory from the options)."""
    from ..schedule import io as schedule_io

    given = [flag for flag, v in (("--pp", args.pp), ("--microbatches", args.microbatches), ("--vpp", args.vpp))
             if v is not None]
    given += ["-O"] if args.option else []
    given += [f"--{k.replace('_', '-')}" for k in PARTITION_KEYS + ("vocab", "hidden", "seq")
              if getattr(args, k, None) is not None]
    if given:
        raise ValueError(f"--plan takes pp, vpp and microbatches from the file and plans nothing: drop "
                         f"{', '.join(given)} (--costs, --mem, --runtime and --mem-limit apply)")
    sched = schedule_io.load(args.plan)
    spec = make_spec(pp=sched.pp, vpp=sched.vpp, microbatches=sched.microbatches, costs=args.costs,
                     mem=mem_model_from_args(args), mem_limit=args.mem_limit)
    nc = sched.pp * sched.vpp
    try:
        spec.costs.per_chunk(nc)
        spec.mem.per_chunk(nc, sched.vpp)
    except ValueError as e:
        raise ValueError(f"{args.plan}: {e} (pp={sched.pp} x vpp={sched.vpp} in the file)") from None
    return sched, spec


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
