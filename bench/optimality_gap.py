"""Optimality gap of every heuristic schedule against the exact CP-SAT optimum (``optimal``).

For each small case (pp, m, vpp, memory limit, cost set) the exact solver finds the minimum
makespan of the heuristic's own class of schedules — same placement (V or interleaved) and
same backward kind (split B/W, or fused BW) — under the same memory limit, and each heuristic's
makespan is compared with it:

    gap = makespan / optimum - 1

When the solver stops at its time limit without a proof (status FEASIBLE) the true optimum
lies in [bound, best found]; the table then shows the gap against the best schedule found
(a lower estimate of the gap) and counts the case as unproven. A heuristic whose peak memory
exceeds the limit is shown as "over" and left out of its average (it solved an easier problem).

Cost sets are the official reference's (../shared/reference/README.md), taken per chunk pass:
A (F=B=W=1, comm=1), B (F=B=W=1, comm=0), D (F=1, B=2, W=1, comm=0), E (F=4, B=6, W=3, comm=1).

    python bench/optimality_gap.py            # full set (< 5 min on 2 cores)
    python bench/optimality_gap.py --quick    # a subset (about 1 min)
    python bench/optimality_gap.py --json     # machine-readable rows and summary
    python bench/optimality_gap.py --low-memory --markdown   # the low-memory V grid (see low_memory_cases)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

from pipeloom.schedule.planning import evaluate, make_spec
from pipeloom.schedule import registry
from pipeloom.core.ir import Kind
from pipeloom.core.errors import ScheduleError

COST_SETS = {
    "A": "F=1,B=1,W=1,comm=1",
    "B": "F=1,B=1,W=1,comm=0",
    "D": "F=1,B=2,W=1,comm=0",
    "E": "F=4,B=6,W=3,comm=1",
}
LIMITS = ("none", "1p", "2p")


def cases(quick: bool) -> list[tuple[int, int, int, str, str]]:
    """(pp, m, vpp, limit, cost set) for every case of the run."""
    out = []
    shapes = [(2, 2), (2, 4), (3, 3), (3, 6), (4, 4), (4, 8)]
    if quick:
        shapes = [(2, 4), (4, 4)]
    for pp, m in shapes:
        for vpp in (1, 2):
            for limit in LIMITS:
                for cs in (("A", "D") if quick else tuple(COST_SETS)):
                    out.append((pp, m, vpp, limit, cs))
    return out


#: cost sets of the low-memory grid: equal costs, B = 2F, and the Zero Bubble paper's profiled ratios with comm
LOW_COST_SETS = {"B": "F=1,B=1,W=1,comm=0", "D": "F=1,B=2,W=1,comm=0", "Z": "F=1,B=2,W=1,comm=0.5"}
#: the V builders whose best plan at a limit is compared with the optimum under that limit
LOW_NAMES = ("zbv", "vhalf", "vmin")


def low_memory_cases(quick: bool = False) -> list[tuple[int, int, float, str, str]]:
    """(pp, m, limit units, limit label, cost set) of the low-memory grid: V placement, vpp 2, pp 2-6, m pp, 2pp
    and 3pp, limits 1p, 0.75p, 0.5p and V-Min's own (p+4)//3, each raised to the smallest feasible limit
    (1 unit) and taken once per shape where two coincide."""
    out = []
    for pp in ((2, 4) if quick else range(2, 7)):
        for m in (pp, 2 * pp, 3 * pp):
            seen = set()
            for label, units in (("1p", pp), ("0.75p", 0.75 * pp), ("0.5p", 0.5 * pp), ("vmin", (pp + 4) // 3)):
                units = max(1.0, float(units))
                if units in seen:
                    continue
                seen.add(units)
                for cs in LOW_COST_SETS:
                    out.append((pp, m, units, label, cs))
    return out


def run_low_case(pp, m, units, label, cs, time_limit, workers, effort=None, optima=None) -> dict:
    """Best of :data:`LOW_NAMES` planned at ``units`` against the CP-SAT optimum (V, split backward) at that limit.
    ``optima``: earlier rows by case id; their optimum is reused (no solve) when present."""
    costs = LOW_COST_SETS[cs]
    spec = make_spec(pp=pp, microbatches=m, vpp=2, costs=costs, mem_limit=units)
    row = {"id": f"pp{pp} m{m} {label} {cs}", "pp": pp, "microbatches": m, "limit_units": units, "limit": label,
           "cost_set": cs, "costs": costs, "heuristics": {}}
    built = []
    for name in LOW_NAMES:
        own = spec if effort is None else replace(spec, options={"effort": effort})
        t0 = time.process_time()
        sched = registry.build(name, own)
        cpu = time.process_time() - t0
        ev = evaluate(sched, spec)
        if ev["valid"]:
            built.append(sched)
            row["heuristics"][name] = {"makespan": ev["makespan"], "peak": max(ev["peak_memory"]), "cpu_s": cpu}
    best = min(row["heuristics"].items(), key=lambda kv: kv[1]["makespan"])
    row["best"], row["makespan"] = best[0], best[1]["makespan"]
    old = (optima or {}).get(row["id"])
    if old is not None:
        row["optimum"] = old["optimum"]
    else:
        opt_spec = make_spec(pp=pp, microbatches=m, vpp=2, costs=costs, mem_limit=units,
                             options={"time_limit": time_limit, "workers": workers, "placement": "v",
                                      "backward": "split", "hints": False, "start_from": built, "allow_large": True})
        t0 = time.perf_counter()
        s = registry.build("optimal", opt_spec)
        row["optimum"] = {"status": s.meta["status"], "makespan": s.meta["makespan"], "bound": s.meta["best_bound"],
                          "wall_s": round(time.perf_counter() - t0, 2)}
    opt = row["optimum"]
    row["gap"] = row["makespan"] / opt["makespan"] - 1.0
    row["proven"] = opt["status"] == "OPTIMAL"
    from pipeloom.core.ir import Placement
    from pipeloom.schedule.search.bounds import lower_bound

    row["bound"] = lower_bound(spec, Placement.V).value  # pipeloom's analytic bound: how loose is it here?
    row["bound_gap"] = opt["makespan"] / row["bound"] - 1.0 if row["bound"] > 0 else None
    return row


def low_summary(rows) -> dict:
    """Mean and max gap over all cases and over the proven ones, cases within 1%."""
    proven = [r for r in rows if r["proven"]]
    out = {"cases": len(rows), "proven_cases": len(proven)}
    for key, rs in (("all", rows), ("proven", proven)):
        if rs:
            gaps = [r["gap"] for r in rs]
            out[key] = {"mean_gap": sum(gaps) / len(gaps), "max_gap": max(gaps),
                        "within_1pct": sum(1 for g in gaps if g <= 0.01 + 1e-12),
                        "worst": max(rs, key=lambda r: r["gap"])["id"]}
    loose = [r["bound_gap"] for r in proven if r.get("bound_gap") is not None]
    if loose:
        out["bound_vs_optimum"] = {"mean": sum(loose) / len(loose), "max": max(loose),
                                   "exact": sum(1 for g in loose if g <= 1e-9)}
    out["max_cpu_s"] = max(h["cpu_s"] for r in rows for h in r["heuristics"].values())
    return out


def low_main(args) -> int:
    """``--low-memory``: the low-memory grid (:func:`low_memory_cases`), as JSON or a markdown table."""
    optima = None
    if args.optima:
        with open(args.optima) as f:
            optima = {r["id"]: r for r in json.load(f)["rows"]}
    t0 = time.perf_counter()
    rows = [run_low_case(*c, args.time_limit, args.workers, args.effort, optima) for c in low_memory_cases(args.quick)]
    summ = low_summary(rows)
    if args.json:
        json.dump({"rows": rows, "summary": summ, "wall_s": time.perf_counter() - t0, "time_limit": args.time_limit,
                   "workers": args.workers, "effort": args.effort or "fast"}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    print(f"### low-memory V grid: best of {', '.join(LOW_NAMES)} vs the CP-SAT optimum ({summ['cases']} cases, "
          f"{summ['proven_cases']} proven; effort {args.effort or 'fast'})\n")
    for key in ("proven", "all"):
        if key in summ:
            v = summ[key]
            print(f"- {key} cases: mean gap {v['mean_gap'] * 100:.2f}%, max {v['max_gap'] * 100:.1f}% ({v['worst']}), "
                  f"{v['within_1pct']} within 1%")
    if "bound_vs_optimum" in summ:
        b = summ["bound_vs_optimum"]
        print(f"- the analytic lower bound against the proven optima: the optimum is {b['mean'] * 100:.2f}% above it on "
              f"average, {b['max'] * 100:.1f}% at most, equal in {b['exact']} cases")
    print(f"- plan CPU at most {summ['max_cpu_s']:.2f} s\n")
    header = ["case", "limit (units)", "costs", "best", "makespan", "optimum", "gap", "bound"]
    body = [[r["id"], f"{r['limit_units']:g}", r["costs"], r["best"], f"{r['makespan']:g}",
             f"{r['optimum']['makespan']:g}" + ("" if r["proven"] else f"* [{r['optimum']['bound']:g}]"),
             f"{r['gap'] * 100:.1f}%", f"{r['bound']:g}"] for r in rows]
    _md(header, body)
    return 0


def schedule_class(sched) -> tuple[str, str]:
    """(placement, backward) of a schedule: backward 'bw' if every backward is fused, else 'split'."""
    kinds = {j.kind for _, _, j in sched.jobs()}
    backward = "bw" if Kind.B not in kinds else "split"
    placement = sched.placement.value if sched.vpp > 1 else "interleaved"
    return placement, backward


def run_case(pp, m, vpp, limit, cs, names, time_limit, workers, own_peak=(), effort=None):
    costs = COST_SETS[cs]
    spec = make_spec(pp=pp, microbatches=m, vpp=vpp, costs=costs, mem_limit=limit)
    row = {"pp": pp, "microbatches": m, "vpp": vpp, "mem_limit": limit, "cost_set": cs, "costs": costs,
           "heuristics": {}, "optimum": {}}
    classes = {}
    built = []
    for name in names:
        info = registry.get(name)
        try:
            registry.check_vpp(info, vpp)
        except ScheduleError:
            continue
        try:
            own = spec if effort is None or "effort" not in info.option_names else replace(
                spec, options={"effort": effort})
            sched = registry.build(name, own)
        except (ScheduleError, ValueError) as e:
            row["heuristics"][name] = {"error": str(e).splitlines()[0]}
            continue
        ev = evaluate(sched, spec)
        if not ev["valid"] and not any("exceeds the limit" in v for v in ev["violations"]):
            row["heuristics"][name] = {"error": "invalid: " + ev["violations"][0]}
            continue
        cls = schedule_class(sched)
        over = not ev["valid"]
        if not over:
            built.append(sched)
        row["heuristics"][name] = {"makespan": ev["makespan"], "peak": max(ev["peak_memory"]), "class": list(cls),
                                   "over_limit": over}
        if not over:
            classes.setdefault(cls, []).append(name)
    for (placement, backward) in classes:
        opt_spec = make_spec(pp=pp, microbatches=m, vpp=vpp, costs=costs, mem_limit=limit,
                             options={"time_limit": time_limit, "workers": workers, "placement": placement,
                                      "backward": backward, "hints": False, "start_from": built})
        t0 = time.perf_counter()
        s = registry.build("optimal", opt_spec)
        row["optimum"][f"{placement}/{backward}"] = {
            "status": s.meta["status"], "makespan": s.meta["makespan"], "bound": s.meta["best_bound"],
            "wall_s": round(time.perf_counter() - t0, 2)}
    for name, h in row["heuristics"].items():
        if "makespan" not in h or h["over_limit"]:
            continue
        opt = row["optimum"][f"{h['class'][0]}/{h['class'][1]}"]
        h["gap"] = h["makespan"] / opt["makespan"] - 1.0
        h["gap_vs_bound"] = h["makespan"] / opt["bound"] - 1.0
        h["proven"] = opt["status"] == "OPTIMAL"
    for name in own_peak:
        h = row["heuristics"].get(name)
        if not h or "makespan" not in h or h["over_limit"]:
            continue
        placement, backward = h["class"]
        opt_spec = make_spec(pp=pp, microbatches=m, vpp=vpp, costs=costs, mem_limit=float(h["peak"]),
                             options={"time_limit": time_limit, "workers": workers, "placement": placement,
                                      "backward": backward, "hints": False, "start_from": built})
        s = registry.build("optimal", opt_spec)
        h["own_peak"] = {"status": s.meta["status"], "makespan": s.meta["makespan"], "bound": s.meta["best_bound"],
                         "gap": h["makespan"] / s.meta["makespan"] - 1.0}
    return row


def summarize(rows, names):
    summ = {}
    for name in names:
        gaps = [r["heuristics"][name] for r in rows if "gap" in r["heuristics"].get(name, {})]
        if not gaps:
            continue
        proven = [g for g in gaps if g["proven"]]
        summ[name] = {
            "cases": len(gaps),
            "proven_cases": len(proven),
            "avg_gap": sum(g["gap"] for g in gaps) / len(gaps),
            "avg_gap_proven": (sum(g["gap"] for g in proven) / len(proven)) if proven else None,
            "max_gap": max(g["gap"] for g in gaps),
            "at_optimum": sum(1 for g in gaps if g["gap"] <= 1e-9),
            "over_limit": sum(1 for r in rows if r["heuristics"].get(name, {}).get("over_limit")),
        }
        own = [r["heuristics"][name]["own_peak"] for r in rows if "own_peak" in r["heuristics"].get(name, {})]
        if own:
            summ[name]["avg_gap_own_peak"] = sum(o["gap"] for o in own) / len(own)
            summ[name]["own_peak_proven"] = sum(1 for o in own if o["status"] == "OPTIMAL")
    return dict(sorted(summ.items(), key=lambda kv: kv[1]["avg_gap"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Gap = heuristic makespan / exact optimum of its class - 1.")
    ap.add_argument("--quick", action="store_true", help="a subset: pp 2 m 4 and pp 4 m 4, cost sets A and D")
    ap.add_argument("--time-limit", type=float, default=8.0, help="CP-SAT seconds per solve (default 8)")
    ap.add_argument("--workers", type=int, default=2, help="CP-SAT workers (default 2)")
    ap.add_argument("--schedules", default=None, help="comma-separated heuristics (default: all registered)")
    ap.add_argument("--json", action="store_true", help="print JSON {rows, summary} instead of tables")
    ap.add_argument("--markdown", action="store_true", help="print the tables as markdown (for docs/bench)")
    ap.add_argument("--summary-only", action="store_true", help="print only the per-heuristic summary table")
    ap.add_argument("--own-peak", default="", metavar="NAMES",
                    help="comma-separated heuristics also compared with the optimum under their own peak memory "
                         "as the limit (fair for memory-saving schedules such as vhalf, vmin; one extra solve each)")
    ap.add_argument("--effort", choices=["fast", "high"], default=None,
                    help="planning effort of the builders that read it (zbv, vhalf, vmin, zbvpp; default: their "
                         "default, fast)")
    ap.add_argument("--render", metavar="FILE.json", default=None,
                    help="do not solve: print the tables of an earlier --json run")
    ap.add_argument("--low-memory", action="store_true",
                    help="the low-memory V grid instead: pp 2-6, m pp..3pp, limits 1p/0.75p/0.5p/V-Min's, "
                         "best of zbv/vhalf/vmin vs the optimum at that limit")
    ap.add_argument("--optima", metavar="FILE.json", default=None,
                    help="with --low-memory: reuse the optima of an earlier --json run (no CP-SAT solves)")
    args = ap.parse_args(argv)
    if args.low_memory:
        return low_main(args)
    names = [n for n in registry.names() if n != "optimal"]
    if args.schedules:
        want = [s.strip() for s in args.schedules.split(",") if s.strip()]
        bad = [s for s in want if s not in names]
        if bad:
            ap.error(f"unknown schedule(s) {', '.join(bad)}; choose from {', '.join(names)}")
        names = want
    own_peak = [x.strip() for x in args.own_peak.split(",") if x.strip()]
    todo = [] if args.render else cases(args.quick)
    rows = []
    t0 = time.perf_counter()
    if args.render:
        with open(args.render) as f:
            saved = json.load(f)
        rows = saved["rows"]
        names = [n for n in names if any(n in r["heuristics"] for r in rows)]
        args.time_limit, args.workers = saved["time_limit"], saved["workers"]
    elif args.json or args.markdown:
        for c in todo:
            rows.append(run_case(*c, names, args.time_limit, args.workers, own_peak, args.effort))
    else:
        from rich.progress import Progress

        with Progress(transient=True) as prog:
            task = prog.add_task("solving", total=len(todo))
            for c in todo:
                prog.update(task, description=f"pp{c[0]} m{c[1]} vpp{c[2]} {c[3]} {c[4]}")
                rows.append(run_case(*c, names, args.time_limit, args.workers, own_peak, args.effort))
                prog.advance(task)
    wall = saved["wall_s"] if args.render else time.perf_counter() - t0
    summ = summarize(rows, names)
    if args.json:
        json.dump({"rows": rows, "summary": summ, "wall_s": wall, "time_limit": args.time_limit,
                   "workers": args.workers}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    used = [n for n in names if any(n in r["heuristics"] for r in rows)]
    header = ["case", "optimum V/split", "optimum il/split", "optimum BW"] + used
    body = [[_case_id(r), _opt_cell(r, ["v/split"]), _opt_cell(r, ["interleaved/split"]),
             _opt_cell(r, ["interleaved/bw", "v/bw"])] + [_gap_cell(r["heuristics"].get(n)) for n in used]
            for r in rows if r["heuristics"]]
    sheader = ["schedule", "cases", "proven", "avg gap", "avg gap (proven)", "max gap", "at optimum", "over limit"]
    with_own = any("avg_gap_own_peak" in v for v in summ.values())
    if with_own:
        sheader.append("avg gap at own peak (proven)")
    sbody = [[n, str(v["cases"]), str(v["proven_cases"]), f"{v['avg_gap'] * 100:.2f}%",
              "-" if v["avg_gap_proven"] is None else f"{v['avg_gap_proven'] * 100:.2f}%",
              f"{v['max_gap'] * 100:.1f}%", str(v["at_optimum"]), str(v["over_limit"])]
             + ([f"{v['avg_gap_own_peak'] * 100:.2f}% ({v['own_peak_proven']})" if "avg_gap_own_peak" in v else "-"]
                if with_own else []) for n, v in summ.items()]
    stitle = (f"average optimality gap per heuristic ({len(rows)} cases, {wall:.0f} s, "
              f"time limit {args.time_limit:g} s x {args.workers} workers)")
    if args.markdown:
        print(f"### {stitle}\n")
        _md(sheader, sbody)
        print("\n### per case: makespan and gap (* = optimum not proven; [bound])\n")
        _md(header, body)
        return 0
    from rich.console import Console
    from rich.table import Table

    con = Console(width=max(160, Console().width))
    if not args.summary_only:
        t = Table(title="makespan (+gap vs the exact optimum of the schedule's class; * = not proven, [bound])")
        for col in header:
            t.add_column(col, justify="left" if col == "case" else "right")
        for row in body:
            t.add_row(*row)
        con.print(t)
    s = Table(title=stitle)
    for col in sheader:
        s.add_column(col, justify="left" if col == "schedule" else "right")
    for row in sbody:
        s.add_row(*row)
    con.print(s)
    return 0


def _case_id(r) -> str:
    return f"pp{r['pp']} m{r['microbatches']} vpp{r['vpp']} {r['mem_limit']} {r['cost_set']}"


def _opt_cell(r, keys) -> str:
    for k in keys:
        o = r["optimum"].get(k)
        if o:
            return f"{o['makespan']:g}" + ("" if o["status"] == "OPTIMAL" else f"* [{o['bound']:g}]")
    return "-"


def _gap_cell(h) -> str:
    if h is None:
        return ""
    if "error" in h:
        return "n/a"
    if h["over_limit"]:
        return f"{h['makespan']:g} over"
    return f"{h['makespan']:g} +{h['gap'] * 100:.1f}%" + ("" if h["proven"] else "*")


def _md(header, body) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
    for row in body:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    sys.exit(main())
