"""pipeloom compare: every schedule side by side for one shape."""
from __future__ import annotations

from ..api import compare
from .common import add_plan_options, fmt, print_json, spec_from_args


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="plan and simulate every schedule for one shape, sorted by makespan",
                       description="Plan and simulate every registered schedule that accepts the given vpp "
                                   "and memory limit; print them sorted by makespan (then peak memory).")
    add_plan_options(p, schedule=False)
    p.add_argument("--schedules", default=None,
                   help="comma-separated subset of schedules (default: all heuristics; the exact solver "
                        "'optimal' only when named here or with --with-optimal)")
    p.add_argument("--with-optimal", action="store_true",
                   help="also run the exact CP-SAT solver (small shapes only; up to its time limit)")
    p.add_argument("--json", action="store_true", help="print one JSON object {'rows': [...]}")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..schedule import registry

    names = [s.strip() for s in args.schedules.split(",")] if args.schedules else \
        [n for n in registry.names() if n != "optimal" or args.with_optimal]
    rows = []
    given_vpp = args.vpp
    for vpp in ([given_vpp] if given_vpp else [1, 2]):
        args.vpp = vpp
        # without --vpp, each schedule runs at its natural vpp; drop the "takes vpp ..." mismatches
        rows += [r for r in compare(spec_from_args(args), names)
                 if given_vpp or "takes vpp" not in r.get("error", "")]
    args.vpp = given_vpp
    rows.sort(key=lambda r: ("error" in r, r.get("makespan") or 0, max(r.get("peak_memory") or [0])))
    if args.json:
        print_json({"pp": args.pp, "microbatches": args.microbatches, "rows": rows})
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"pp={args.pp} m={args.microbatches} mem-limit={args.mem_limit} costs={args.costs}")
    for c in ("schedule", "vpp", "makespan", "bubble", "stage bubble", "peak memory (max)", "valid"):
        t.add_column(c, justify="left" if c == "schedule" else "right")
    for r in rows:
        if "error" in r:
            t.add_row(r["schedule"], "-", "-", "-", "-", "-", f"[dim]{r['error'][:60]}[/dim]")
        else:
            t.add_row(r["schedule"], str(r["vpp"]), fmt(r["makespan"]), fmt(r["bubble"]), fmt(r["stage_bubble"]),
                      fmt(max(r["peak_memory"]), 3), "yes" if r["valid"] else "[red]no[/red]")
    Console().print(t)
    return 0
