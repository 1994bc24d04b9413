"""pipeloom compare: every schedule side by side for one shape."""
from __future__ import annotations

from ..schedule.planning import compare, evaluate
from .common import (TORCH_PREFIX, add_planning_options, fmt, partition_given, plan_inputs, plan_named, print_json,
                     print_table)
from .dp_options import add_dp_options, dp_result, dp_wanted


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="plan and simulate every schedule for one shape, sorted by makespan",
                       description="Plan and simulate every registered schedule for one shape (vpp 1 and 2, or "
                                   "the given --vpp) under one memory limit; print them sorted by makespan (then "
                                   "peak memory), and say why the others do not apply.")
    add_planning_options(p, schedule=False)
    p.add_argument("--schedules", default=None,
                   help="comma-separated subset of schedules (default: all heuristics; the exact solver "
                        "'optimal' only when named here or with --with-optimal)")
    p.add_argument("--with-optimal", action="store_true",
                   help="also run the exact CP-SAT solver (small shapes only; up to its time limit)")
    p.add_argument("--with-torch", action="store_true",
                   help="also list torch.distributed.pipelining's own schedules (torch:GPipe, torch:1F1B, "
                        "torch:Interleaved1F1B, ...; the order torch generates) under the same costs and memory model "
                        "(needs torch); use --runtime torch for the memory torch's runtime holds")
    p.add_argument("--costs-per", choices=["stage", "chunk"], default="stage",
                   help="'stage' (default): --costs F/B/W are for a device's whole stage and are split over its "
                        "vpp chunks, so schedules with different vpp model the same network; 'chunk': per chunk "
                        "pass as in simulate (needs --vpp)")
    add_dp_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object {'rows': [...]}")
    p.set_defaults(func=run)


def _stage_costs(args, vpp: int):
    """--costs per full-stage pass -> per chunk pass for a schedule with ``vpp`` chunks per device."""
    from dataclasses import replace

    from ..core.costs import Costs

    c = Costs.parse(args.costs)
    if not c.is_uniform() or not all(isinstance(x, (int, float)) for x in (c.a2a_F, c.a2a_B)):
        raise ValueError("per-chunk cost lists need --costs-per chunk and an explicit --vpp")
    return replace(c, F=c.F / vpp, B=c.B / vpp, W=c.W / vpp, a2a_F=c.a2a_F / vpp, a2a_B=c.a2a_B / vpp)


def _torch_rows(spec, vpp: int, *, explicit_vpp: bool) -> list[dict]:
    """Rows for torch's own schedules that take ``vpp`` stages per rank (evaluated like pipeloom's)."""
    from dataclasses import replace

    try:
        from ..integrations.torch import BUILTINS
    except ImportError:
        raise ValueError("--with-torch needs torch (pip install 'pipeloom[torch]')") from None
    rows = []
    plain = replace(spec, options={})
    for name in BUILTINS:
        single = name in ("GPipe", "1F1B")
        if (vpp == 1) != single:
            if explicit_vpp:
                rows.append({"schedule": TORCH_PREFIX + name, "vpp": vpp,
                             "error": f"torch's {name} takes {'1 stage' if single else '2 or more stages'} per rank"})
            continue
        try:
            rows.append(evaluate(plan_named(TORCH_PREFIX + name, plain), plain))
        except ValueError as e:
            rows.append({"schedule": TORCH_PREFIX + name, "vpp": vpp, "error": str(e)})
    return rows


def _add_dp(args, spec, rows: list[dict]) -> None:
    """step_time, dp_exposed, dp_hidden_share of every simulated row (the dp reduction of sim.dp)."""
    from dataclasses import replace

    from ..sim.simulate import simulate

    for r in rows:
        if "error" in r or r.get("makespan") is None:
            continue
        s = spec if not r["schedule"].startswith(TORCH_PREFIX) else replace(spec, options={})
        sched = plan_named(r["schedule"], s, check=False)
        r.update(dp_result(args, sched, simulate(sched, s.costs, s.mem)).to_dict())


def _check_option_values(options: dict, names: list[str]) -> None:
    """A bad ``-O`` value (not a number, above its cap) is bad input, exit 2: every builder that reads the option
    checks it here, before any row is made (a schedule the option does not apply to stays a row)."""
    from ..schedule import registry

    for key, value in options.items():
        for name in names:
            try:
                info = registry.get(name)
            except (KeyError, ValueError):
                continue  # an unknown name is compare's own error
            if key in info.option_names:
                try:
                    info.option(key).check(value, info.name)
                except ValueError as e:
                    raise ValueError(f"-O {key}={value}: {e}") from None


def run(args) -> int:
    from ..schedule import registry

    names = list(dict.fromkeys(s.strip() for s in args.schedules.split(",") if s.strip())) if args.schedules else \
        [n for n in registry.names() if n != "optimal" or args.with_optimal]  # a name given twice is one row
    rows = []
    if args.costs_per == "chunk" and not args.vpp:
        raise ValueError("--costs-per chunk compares one vpp only: give --vpp")
    for vpp in ([args.vpp] if args.vpp else [1, 2]):
        costs = _stage_costs(args, vpp) if args.costs_per == "stage" and not partition_given(args) else None
        # without --vpp, each schedule runs at its natural vpp; drop the "takes vpp ..." mismatches
        spec = plan_inputs(args, vpp=vpp, costs=costs)[0]
        _check_option_values(spec.options, names)
        rows += [r for r in compare(spec, names) if args.vpp or "takes vpp" not in r.get("error", "")]
        if args.with_torch:
            rows += _torch_rows(spec, vpp, explicit_vpp=bool(args.vpp))
        if dp_wanted(args):
            _add_dp(args, spec, [r for r in rows if r.get("vpp") == vpp])
    dp = dp_wanted(args)
    rows.sort(key=lambda r: ("error" in r, (r.get("step_time") if dp else None) or r.get("makespan") or 0,
                             max(r.get("peak_memory") or [0])))
    if args.json:
        print_json({"pp": args.pp, "microbatches": args.microbatches, "costs": args.costs,
                    "costs_per": args.costs_per, "mem_limit": str(args.mem_limit), "rows": rows})
        return 0
    from rich.console import Console
    from rich.table import Table

    con = Console()
    per = "full-stage pass (split over vpp chunks)" if args.costs_per == "stage" else "chunk pass"
    t = Table(title=f"pp={args.pp}  m={args.microbatches}  memory limit {args.mem_limit}\n"
                    f"costs {args.costs} per {per}", title_justify="left")
    for c in ("schedule", "vpp", "makespan", "vs best", "bubble", "stage bubble", "peak mem") + \
            ((f"step (dp={args.dp})", "dp hidden") if dp else ()):
        t.add_column(c, justify="left" if c == "schedule" else "right", no_wrap=True)
    ok = [r for r in rows if "error" not in r]
    key = "step_time" if dp else "makespan"
    best = min((r[key] for r in ok if r.get(key) is not None), default=None)
    for r in ok:
        extra = (fmt(r["step_time"]), "-" if r.get("dp_hidden_share") is None else f"{r['dp_hidden_share']:.1%}") \
            if dp and "step_time" in r else (("-", "-") if dp else ())
        t.add_row(r["schedule"], str(r["vpp"]), fmt(r["makespan"]), f"{r[key] / best:.3f}" if best and r.get(key) else "-",
                  f"{r['bubble']:.1%}", f"{r['stage_bubble']:.1%}", fmt(max(r["peak_memory"]), 3)
                  + ("" if r["valid"] else " [red]invalid[/red]"), *extra)
    print_table(con, t)
    skipped = [r for r in rows if "error" in r]
    if skipped:
        con.print("[bold]not applicable here:[/bold]")
        for r in skipped:
            con.print(f"  {r['schedule']} (vpp {r['vpp']}): {r['error']}", overflow="ellipsis", no_wrap=True, soft_wrap=False,
                      width=max(60, con.width))
    con.print("[dim]peak mem in full-stage microbatch activations (1p = pp); bubble = idle / (pp x makespan)[/dim]")
    if args.costs_per == "stage" and not partition_given(args):
        con.print("[dim]makespan in --costs units per full-stage pass: 'pipeloom simulate' costs each chunk pass "
                  "(vpp 2 doubles it there); 'pipeloom simulate --costs-per stage' gives these numbers[/dim]")
    return 0
