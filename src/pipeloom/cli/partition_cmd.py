"""pipeloom partition: map layers onto devices x chunks and show the simulated effect."""
from __future__ import annotations

import argparse

from ..schedule.planning import evaluate, make_spec, plan
from ..schedule import registry
from .common import (add_costs_option, add_mem_limit_option, add_partition_options, add_schedule_option,
                     add_shape_options, fmt, partition_from_args, positive_int, print_json, print_table)

_EPILOG = """\
where the layers go:
  uniform            per-chunk counts differ by at most one; the L % (pp*vpp) extra layers go to the
                     first global chunks (seg_layer_num[j % num_chunks] += 1)
  --layers-per-device each device's count is dealt round-robin over its chunks (device s's i-th layer
                     -> its local chunk i % vpp; interleaved: global chunk (i % vpp)*pp + s); layer
                     indices stay contiguous in global chunk order
  --balance          bottleneck: exact DP minimising the largest chunk time (F+B+W), polished for
                     device load when vpp > 1; makespan: local search on the simulated makespan of
                     --schedule, starting from the DP and the uniform split
  embedding runs with global chunk 0, the head (norm + vocabulary projection + loss) with the last.

layer-cost file (--layer-costs), JSON:
  {"layers": [{"F": 1, "B": 1, "W": 1, "mem": 1}, ...], "embedding": {"F": 0.1}, "head": {"F": 2.6, "mem": 4}}
  or "layers": {"count": 32, "F": 1, ...}; B and W default to F, mem to 1 (embedding/head 0).
  CSV: header name,F,B,W,mem[,mem_b], one row per layer; rows named embedding / head are those parts.
  Without a file, layers are identical and the average chunk costs --costs F/B/W.

examples:
  pipeloom partition --layers 8 --pp 2 --vpp 2 --layers-per-device 5,3
  pipeloom partition --layers 32 --pp 4 --vocab 128000 --hidden 4096 --balance
  pipeloom partition --layer-costs layers.json --pp 4 --vpp 2 --balance --schedule interleaved --json
"""


def add_parser(sub) -> None:
    p = sub.add_parser("partition", help="map layers onto devices x chunks; balance by cost; show the effect",
                       description="Split a model's layers over pp devices x vpp chunks (uniform, user counts per "
                                   "device, or cost-balanced), print device -> chunks -> layers with per-chunk "
                                   "costs, and simulate the chosen schedule with those heterogeneous chunks "
                                   "against the uniform split.",
                       epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_options(p, microbatches=False, vpp_help="chunks per device (default: the schedule's natural vpp, else 1)")
    add_schedule_option(p, required=False,
                        help="schedule to simulate (and to balance for); default 1f1b for vpp 1, interleaved "
                             "otherwise; one of: " + ", ".join(registry.names()))
    p.add_argument("--microbatches", "-m", type=positive_int, default=None,
                   help="microbatches for the simulation (default: 2*pp)")
    add_costs_option(p, help="F/B/W of the average chunk (per-layer costs scale from it unless --layer-costs) and "
                             "the cross-device latency comm (default: %(default)s)")
    add_mem_limit_option(p, purpose="per-device activation budget for --balance and the simulation")
    p.add_argument("--max-evals", type=positive_int, default=400,
                   help="most schedules the makespan search may simulate (default: %(default)s)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object; 'devices' = per device, per local chunk, the layer indices")
    add_partition_options(p)
    p.add_argument("--megatron-layout", default=None, metavar="LAYOUT",
                   help="read the split from a Megatron-Core --pipeline-model-parallel-layout string, e.g. "
                        "'Et*3|(t*3|)*2,t*3L' (E embedding, t layer, L loss, | between virtual stages in Megatron's "
                        "order; vpp = stages / pp). The output always gives the split as such a string "
                        "(megatron_layout)")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.schedule is not None:
        registry.get(args.schedule)
    if args.megatron_layout is not None:
        return _run_layout(args)
    vpp = args.vpp or (registry.default_vpp(args.schedule) if args.schedule else 1)
    schedule = args.schedule or ("1f1b" if vpp == 1 else "interleaved")
    registry.check_vpp(registry.get(schedule), vpp)
    m = args.microbatches or 2 * args.pp
    spec = make_spec(pp=args.pp, microbatches=m, vpp=vpp, costs=args.costs, mem_limit=args.mem_limit)
    objective = "makespan" if args.balance == "auto" else args.balance
    from ..core import progress as _progress

    progress = None  # shown by the CLI (a status line on a terminal, lines with pipeloom --progress), not on stdout
    if objective == "makespan":
        progress = lambda n: _progress.report(f"balancing: {n} schedules simulated (at most {args.max_evals})")  # noqa
    pplan = partition_from_args(args, spec, schedule, progress=progress, objective=objective)
    return _report(args, spec, schedule, m, pplan)


def _run_layout(args) -> int:
    """--megatron-layout: the split comes from the string; costs from the other partition options."""
    from ..partition.megatron import layout_to_partition
    from ..partition import default_layer_costs, load_layer_costs
    from ..partition.wiring import PartitionPlan

    for flag, v in (("--layers-per-device", args.layers_per_device), ("--layers-per-chunk", args.layers_per_chunk),
                    ("--balance", args.balance)):
        if v is not None:
            raise ValueError(f"--megatron-layout gives the split itself; drop {flag}")
    part = layout_to_partition(args.megatron_layout, args.pp)
    if args.vpp is not None and args.vpp != part.vpp:
        raise ValueError(f"--megatron-layout has {part.num_chunks} stages = pp {args.pp} x vpp {part.vpp}, but "
                         f"--vpp is {args.vpp}; drop --vpp or fix the layout")
    if args.layers is not None and args.layers != part.num_layers:
        raise ValueError(f"--megatron-layout holds {part.num_layers} decoder layers but --layers is {args.layers}")
    schedule = args.schedule or ("1f1b" if part.vpp == 1 else "interleaved")
    info = registry.get(schedule)
    registry.check_vpp(info, part.vpp)
    if info.placement_at(part.vpp) is not part.placement:
        raise ValueError(f"schedule {schedule!r} places chunks {info.placement_at(part.vpp).value}-wise; Megatron "
                         f"layouts are interleaved: choose an interleaved-placement schedule")
    m = args.microbatches or 2 * args.pp
    spec = make_spec(pp=args.pp, microbatches=m, vpp=part.vpp, costs=args.costs, mem_limit=args.mem_limit)
    if args.layer_costs is not None:
        lc = load_layer_costs(args.layer_costs)
        if lc.num_layers != part.num_layers:
            raise ValueError(f"--layer-costs lists {lc.num_layers} layers but the layout holds {part.num_layers}")
    else:
        lc = default_layer_costs(part.num_layers, part.num_chunks, spec.costs, vocab=args.vocab, hidden=args.hidden,
                                 seq=args.seq)
    return _report(args, spec, schedule, m, PartitionPlan(part, lc, "megatron layout"))


def _report(args, spec, schedule, m, pplan) -> int:
    from ..partition.megatron import LayoutError, partition_to_layout

    part, lc = pplan.partition, pplan.layer_costs
    out = part.to_dict()
    try:
        out["megatron_layout"] = partition_to_layout(part)
    except LayoutError:
        out["megatron_layout"] = None
    cc = lc.chunk_costs(part)
    out.update(how=pplan.how, schedule=schedule, microbatches=m, cost_model=lc.source, memory_limit=spec.mem_limit,
               chunk_costs={k: cc[k] for k in ("F", "B", "W", "total")},
               chunk_memory=list(lc.mem_model(part).per_chunk(part.num_chunks, part.vpp)[0]),
               device_load=_device_load(part, cc["total"]))
    out["simulated"] = _simulate(schedule, pplan.apply(spec))
    if pplan.how != "uniform":
        from ..partition import uniform
        from ..partition.wiring import PartitionPlan

        uni = PartitionPlan(uniform(part.num_layers, part.pp, part.vpp, part.placement, embedding=part.embedding,
                                    head=part.head), lc, "uniform")
        out["uniform"] = {"seg_layer_num": uni.partition.seg_layer_num,
                          "device_load": _device_load(uni.partition, lc.chunk_costs(uni.partition)["total"]),
                          "simulated": _simulate(schedule, uni.apply(spec))}
        a, b = out["simulated"]["makespan"], out["uniform"]["simulated"]["makespan"]
        out["makespan_gain"] = (b - a) / b if a is not None and b else None
    if pplan.balance is not None:
        out["balance"] = {"objective": pplan.balance.objective, "evals": pplan.balance.evals,
                          "moves": pplan.balance.moves,
                          "dp_seg_layer_num": pplan.balance.dp.partition.seg_layer_num}
    if args.json:
        print_json(out)
    else:
        _print(out, part, cc)
    return 0 if out["simulated"]["valid"] else 1


def _device_load(part, totals) -> list[float]:
    return [sum(totals[c] for c in part.chunks_of(d)) for d in range(part.pp)]


def _simulate(schedule: str, spec) -> dict:
    try:
        sched = plan(schedule, spec, check=False)
    except ValueError as e:
        return {"makespan": None, "bubble": None, "peak_memory": None, "valid": False, "violations": [str(e)]}
    r = evaluate(sched, spec)
    return {k: r[k] for k in ("makespan", "bubble", "stage_bubble", "peak_memory", "valid", "violations")}


def _print(out: dict, part, cc) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=f"{out['how']} partition: {out['layers']} layers on pp={part.pp} x vpp={part.vpp} "
                    f"({part.placement.value})",
              caption=f"seg_layer_num (layers per global chunk): {out['seg_layer_num']}")
    for c in ("device", "local", "chunk", "layers", "F", "B", "W", "mem a", "load"):
        t.add_column(c, justify="left" if c == "layers" else "right", no_wrap=c == "layers")
    a = out["chunk_memory"]
    for d in range(part.pp):
        for i, c in enumerate(part.chunks_of(d)):
            s, e = part.bounds()[c]
            layers = f"{s}" if e - s == 1 else f"{s}-{e - 1}"
            if c == 0 and part.embedding:
                layers += " +emb"
            if c == part.num_chunks - 1 and part.head:
                layers += " +head"
            t.add_row(str(d) if i == 0 else "", str(i), str(c), layers, fmt(cc["F"][c], 3), fmt(cc["B"][c], 3),
                      fmt(cc["W"][c], 3), fmt(a[c], 3), fmt(out["device_load"][d], 3) if i == 0 else "",
                      end_section=i == part.vpp - 1)
    print_table(con, t)
    if out.get("megatron_layout"):
        con.print(f"Megatron-Core: --pipeline-model-parallel-layout '{out['megatron_layout']}'")
    s = Table(title=f"simulated: {out['schedule']} m={out['microbatches']} (cost model: {out['cost_model']})")
    s.add_column("metric")
    s.add_column(out["how"], justify="right")
    uni = out.get("uniform")
    if uni:
        s.add_column("uniform", justify="right")
    rows = [("makespan", "makespan"), ("bubble", "bubble"), ("stage bubble", "stage_bubble")]
    for label, key in rows:
        s.add_row(label, fmt(out["simulated"][key]), *( [fmt(uni["simulated"][key])] if uni else []))
    pk = out["simulated"]["peak_memory"]
    s.add_row("peak memory (max device)", fmt(max(pk), 3) if pk else "-",
              *([fmt(max(uni["simulated"]["peak_memory"]), 3) if uni["simulated"]["peak_memory"] else "-"]
                if uni else []))
    if out["memory_limit"] is not None:
        s.add_row("memory limit (units)", fmt(out["memory_limit"], 3), *([fmt(out["memory_limit"], 3)] if uni else []))
    s.add_row("max device load", fmt(max(out["device_load"])), *([fmt(max(uni["device_load"]))] if uni else []))
    s.add_row("valid", "yes" if out["simulated"]["valid"] else "[red]NO[/red]",
              *(["yes" if uni["simulated"]["valid"] else "[red]NO[/red]"] if uni else []))
    con.print(s)
    if uni and out.get("makespan_gain") is not None:
        g = out["makespan_gain"]
        con.print(f"makespan vs uniform: {'-' if g >= 0 else '+'}{abs(g) * 100:.1f}%"
                  + (" (faster)" if g > 0 else " (slower)" if g < 0 else ""))
    for v in out["simulated"]["violations"][:5]:
        con.print(f"[red]violation:[/red] {v}")
