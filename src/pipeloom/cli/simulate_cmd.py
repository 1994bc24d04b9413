"""pipeloom simulate: plan a schedule (or read a schedule file) and report makespan, bubbles and peak memory."""
from __future__ import annotations

import argparse

from ..schedule.planning import evaluate, make_spec
from .common import (PARTITION_KEYS, add_builder_options, add_costs_option, add_mem_limit_option, add_mem_option,
                     add_partition_options, add_schedule_option, add_shape_options, fmt, mem_model_from_args,
                     plan_named, print_json, spec_from_args, print_table)
from .dp_options import add_dp_options, dp_result, dp_wanted
from .tp_options import add_tp_options, tp_result, tp_wanted


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
    add_mem_limit_option(p, default=None, purpose="peak activation memory per device (default: none; with --plan the "
                                                  "limit the file was planned for, when it says)")
    add_costs_option(p)
    p.add_argument("--costs-per", choices=["chunk", "stage"], default="chunk",
                   help="'chunk' (default): --costs F/B/W are per chunk pass, so a schedule with vpp 2 does twice "
                        "the passes of vpp 1; 'stage': per full-stage pass, split over the vpp chunks, as "
                        "'pipeloom compare' does by default (then the makespans agree with its table)")
    p.add_argument("--pair-fb", action="store_true",
                   help="add F&B overlapped pairs (one microbatch's forward with another's backward, Megatron's "
                        "combined 1F1B) where the simulated step does not get longer; a pair hides the a2a= "
                        "all-to-all of --costs (docs/moe.md)")
    add_mem_option(p)
    add_builder_options(p)
    add_partition_options(p)
    add_dp_options(p, gantt=True)
    add_tp_options(p)
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
        spec = _spec(args)
        sched = plan_named(args.schedule, spec, check=False)
    if getattr(args, "pair_fb", False):
        from ..schedule.pairing import pair_forward_backward

        sched = pair_forward_backward(sched, spec.costs)
    tp = None
    if tp_wanted(args):
        sched, tp = tp_result(args, sched, spec)
    res = evaluate(sched, spec)
    if tp is not None:
        res.update(tp)
    from .plan_cmd import _bound
    res.update(_bound(sched, spec, res, spec.mem_limit if args.plan is not None else None))
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
            # stdout holds the JSON object with --json; else the line is part of the command's output
            print(f"wrote {draw_gantt(tl, args.dp_gantt)}", file=__import__("sys").stderr if args.json else None,
                  flush=True)
    elif getattr(args, "dp_gantt", None):
        raise ValueError("--dp-gantt draws the dp reduction: give --dp N with --model or --param-bytes")
    if args.json:
        print_json(res)
    else:
        print_result(res, costs=costs_text(spec.costs, args.costs, args.costs_per, sched.vpp),
                     limit_note=" (the plan's)" if getattr(args, "limit_from_plan", False) else "")
    return 0 if res["valid"] else 1


def _spec(args):
    """The PlanSpec of the options; with --costs-per stage the F/B/W of --costs are divided over the vpp chunks."""
    if args.costs_per == "chunk":
        return spec_from_args(args, args.schedule)
    from .common import partition_given, plan_inputs
    from .compare_cmd import _stage_costs
    from ..schedule import registry

    if partition_given(args):
        raise ValueError("--costs-per stage splits --costs over the vpp chunks; with the layer partition options "
                         "every chunk is costed from its layers: drop --costs-per stage")
    vpp = args.vpp or (registry.default_vpp(args.schedule) if not args.schedule.startswith("torch:") else None)
    if vpp is None:
        raise ValueError("--costs-per stage with a torch: schedule needs --vpp")
    return plan_inputs(args, args.schedule, vpp=vpp, costs=_stage_costs(args, vpp))[0]


def costs_text(costs, given: str | None, per: str, vpp: int) -> tuple[str, str, str | None]:
    """(row label, value, note under the table): the costs the makespan is measured in, and in which convention."""
    c = costs.to_dict()
    exact = f"F={c['F']:g},B={c['B']:g},W={c['W']:g},comm={c['comm']:g}" if costs.is_uniform() else given
    if per == "stage" and vpp > 1:
        return ("costs per full-stage pass", given or "F=1,B=1,W=1,comm=0",
                f"costs per full-stage pass split over the {vpp} chunks ({exact} per chunk pass), as 'pipeloom "
                f"compare' costs them by default")
    note = None if vpp == 1 else (f"costs per chunk pass: each of the {vpp} chunks of a device costs the full F/B/W; "
                                  f"'pipeloom compare' costs a full stage (split over the chunks): --costs-per stage "
                                  f"gives its numbers")
    return "costs per chunk pass", exact or "per-chunk F/B/W lists", note


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
    costs = args.costs
    if args.costs_per == "stage":
        from .compare_cmd import _stage_costs
        costs = _stage_costs(args, sched.vpp)
    limit = args.mem_limit
    if limit is None and sched.meta.get("mem_limit") is not None:  # the limit the plan was made for
        limit = float(sched.meta["mem_limit"])
        args.limit_from_plan = True
    spec = make_spec(pp=sched.pp, vpp=sched.vpp, microbatches=sched.microbatches, costs=costs,
                     mem=mem_model_from_args(args), mem_limit=limit)
    nc = sched.pp * sched.vpp
    try:
        spec.costs.per_chunk(nc)
        spec.mem.per_chunk(nc, sched.vpp)
    except ValueError as e:
        raise ValueError(f"{args.plan}: {e} (pp={sched.pp} x vpp={sched.vpp} in the file)") from None
    return sched, spec


def print_result(res: dict, costs: tuple[str, str, str | None] | None = None, limit_note: str = "") -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{res['schedule']}  pp={res['pp']} vpp={res['vpp']} m={res['microbatches']}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    if costs:
        t.add_row(costs[0], costs[1])
    t.add_row("makespan", fmt(res["makespan"]))
    t.add_row("bubble (idle / pp*makespan)", fmt(res["bubble"]))
    t.add_row("stage bubble (max over devices)", fmt(res["stage_bubble"]))
    if res.get("lower_bound") is not None:
        t.add_row(f"proven lower bound (at memory {fmt(res['bound_limit'], 3)})", fmt(res["lower_bound"]))
        t.add_row("gap (makespan / bound - 1)", "-" if res["gap"] is None else f"{res['gap']:.2%}")
    if res["peak_memory"] is not None:
        t.add_row("peak memory per device", " ".join(fmt(x, 3) for x in res["peak_memory"]))
    if "step_time" in res:
        t.add_row(f"step time with dp={res['dp']} reduction", fmt(res["step_time"]))
        t.add_row("dp exposed (un-hidden tail)", fmt(res["dp_exposed"]))
        t.add_row("dp hidden share", "-" if res["dp_hidden_share"] is None else f"{res['dp_hidden_share']:.1%}")
    if "tp" in res:
        tp = res["tp"]
        t.add_row(f"makespan with TP collectives ({tp['overlap']})", fmt(tp["makespan"]))
        t.add_row("makespan with TP collectives (off)", fmt(tp["makespan_off"]))
        t.add_row("TP collective exposed (all jobs)", fmt(tp["exposed"]))
        if "fuse" in tp:
            t.add_row("B fused with W (--tp-fuse)", f"{len(tp['fuse']['fused'])} of {tp['fuse']['tried']} tried")
    t.add_row("memory limit", (fmt(res["memory_limit"]) + limit_note) if res["memory_limit"] is not None else "none")
    t.add_row("valid", "yes" if res["valid"] else "[red]NO[/red]")
    con = Console()
    print_table(con, t)
    if costs and costs[2]:
        con.print(f"[dim]{costs[2]}[/dim]")
    for v in res["violations"]:
        con.print(f"[red]violation:[/red] {v}")
