#!/usr/bin/env python
"""pipeloom's zero-bubble schedules against the official zero-bubble generators.

Reads ../shared/reference/official_zb.json (or $PIPELOOM_REFERENCE; see its README for units)
and prints, per case, the official schedule and pipeloom's side by side: makespan,
stage_bubble, global bubble and peak memory (normalised units, 1p = pp). Every official job
list is also re-timed with pipeloom's simulator, which must reproduce the reference makespan
(a check of our simulator against theirs). Where pipeloom's peak memory is above the official
one, the "ours @ off. peak" column re-plans pipeloom under the official peak as the limit, so
the comparison is also made at equal memory. The "bound" column is a proven lower bound of the
makespan (pipeloom's analytic bound, raised by the stored CP-SAT results of bench/zb_bounds.py in
bench/data/zb_bounds.json); a verdict says "(optimal)" when our makespan meets it, "(open)" when
a shorter schedule might exist.

    python bench/zb_vs_official.py                  # rich table + summary
    python bench/zb_vs_official.py --json           # one JSON object
    python bench/zb_vs_official.py --generators zbv --limits 1p,1.5p
    python bench/zb_vs_official.py --speed          # generation speed of zbv/zbh1/zbh2
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pipeloom.schedule.planning import make_spec, plan
from pipeloom.schedule import registry
from pipeloom.schedule.io.official import BUILDER_OF, case_costs, load_reference, official_schedule
from pipeloom.schedule.search.bounds import lower_bound
from pipeloom.core.ir import Placement
from pipeloom.sim.simulate import simulate

EPS = 1e-9
BOUNDS = Path(__file__).resolve().parent / "data" / "zb_bounds.json"


def load_bounds(path: Path = BOUNDS) -> dict:
    """Stored bounds of bench/zb_bounds.py by case id ({} when the file is absent)."""
    return json.loads(path.read_text())["cases"] if path.is_file() else {}


def _effort(name: str, effort: str) -> dict:
    """``{'effort': effort}`` for the builders that read the option, else {}."""
    return {"effort": effort} if any(o.name == "effort" for o in registry.get(name).options) else {}


def run_case(case: dict, bounds: dict | None = None, effort: str = "fast") -> dict:
    costs = case_costs(case)
    off = simulate(official_schedule(case), costs)
    lim = case["limit_units"]
    name = BUILDER_OF[case["generator"]]
    spec = make_spec(pp=case["pp"], microbatches=case["microbatches"], vpp=case["vpp"], costs=costs,
                     mem_limit=lim, options=_effort(name, effort))
    t0 = time.perf_counter()
    ours_s = plan(name, spec)
    dt = time.perf_counter() - t0
    ours = simulate(ours_s, costs)
    off_peak = max(off.peak_memory)
    row = {
        "id": case["id"], "generator": case["generator"], "pp": case["pp"], "vpp": case["vpp"],
        "microbatches": case["microbatches"], "cost_set": case["cost_set"], "mem_limit": case["mem_limit"],
        "limit_units": lim,
        "official_makespan": case["makespan"], "official_retimed": off.makespan,
        "retime_ok": abs(off.makespan - case["makespan"]) < 1e-6,
        "ours_makespan": ours.makespan,
        "official_stage_bubble": off.stage_bubble, "ours_stage_bubble": ours.stage_bubble,
        "official_bubble": off.bubble, "ours_bubble": ours.bubble,
        "official_peak": off_peak, "ours_peak": max(ours.peak_memory),
        "within_limit": lim is None or max(ours.peak_memory) <= lim + EPS,
        "plan_time_s": dt,
    }
    row["ours_at_official_peak"] = None
    tight = None
    if row["ours_peak"] > off_peak + EPS and case["generator"] != "1f1b":
        tight = make_spec(pp=case["pp"], microbatches=case["microbatches"], vpp=case["vpp"], costs=costs,
                          mem_limit=off_peak, options=_effort(name, effort))
        row["ours_at_official_peak"] = simulate(plan(name, tight), costs).makespan
    eq_mem = row["ours_makespan"] if row["ours_at_official_peak"] is None else row["ours_at_official_peak"]
    row["ours_equal_memory_makespan"] = eq_mem
    row["lower_bound"] = row["bound_source"] = None
    if case["generator"] != "1f1b":  # 1f1b: the same fixed schedule on both sides, nothing to bound
        placement = Placement.V if case["vpp"] >= 2 else Placement.INTERLEAVED
        # bound at the limit the equal-memory makespan was planned under (a bound at the case's own,
        # looser limit stays valid there too)
        lb = lower_bound(tight if row["ours_at_official_peak"] is not None else spec, placement).value
        stored = (bounds or {}).get(case["id"])
        src = "analytic"
        if stored and stored["bound"] > lb + EPS:
            lb, src = stored["bound"], stored["how"]
        row["lower_bound"], row["bound_source"] = lb, src
    row["proven_optimal"] = row["lower_bound"] is not None and eq_mem <= row["lower_bound"] + EPS
    verdict = ("better" if eq_mem < case["makespan"] - EPS else
               "equal" if eq_mem <= case["makespan"] + EPS else "worse")
    if row["lower_bound"] is not None and verdict != "worse":
        verdict += " (optimal)" if row["proven_optimal"] else " (open)"
    row["verdict"] = verdict
    return row


def speed(shapes) -> list[dict]:
    out = []
    for name, pp, m, vpp, lim in shapes:
        spec = make_spec(pp=pp, microbatches=m, vpp=vpp, mem_limit=lim)
        t0 = time.perf_counter()
        s = registry.build(name, spec)
        dt = time.perf_counter() - t0
        t0 = time.perf_counter()
        simulate(s, spec.costs, spec.mem)  # a yardstick measured under the same machine load
        ds = time.perf_counter() - t0
        out.append({"schedule": name, "pp": pp, "microbatches": m, "vpp": vpp, "mem_limit": lim,
                    "jobs": s.num_jobs, "build_s": dt, "simulate_s": ds, "build_over_simulate": dt / ds})
    return out


SPEED_SHAPES = [("zbh1", 8, 32, 1, "1p"), ("zbh2", 8, 32, 1, "2p"), ("zbv", 8, 16, 2, "1p"),
                ("zbv", 16, 64, 2, "1p"), ("zbv", 32, 128, 2, "1p"), ("zbv", 64, 512, 2, "1p"),
                ("zbv", 8, 32, 4, "1p")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", default=None, help="path of official_zb.json (default: $PIPELOOM_REFERENCE "
                                                      "or ../shared/reference/official_zb.json)")
    ap.add_argument("--generators", default="zbv,zbh1,zbh2,1f1b", help="comma-separated subset (default: all)")
    ap.add_argument("--limits", default=None, help="comma-separated memory limits to keep, e.g. 1p,1.5p")
    ap.add_argument("--effort", choices=("fast", "high"), default="fast",
                    help="planning effort of the builders that read it (zbv: -O effort=...; default fast)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table (for docs/bench)")
    ap.add_argument("--speed", action="store_true", help="measure generation speed instead")
    args = ap.parse_args(argv)

    if args.speed:
        rows = speed(SPEED_SHAPES)
        if args.json:
            print(json.dumps({"speed": rows}, indent=1))
            return 0
        from rich.console import Console
        from rich.table import Table
        t = Table(title="builder time (registry.build, no validation) and, as a yardstick, one simulate()")
        for c in ("schedule", "pp", "m", "vpp", "limit", "jobs", "build s", "simulate s", "build / simulate"):
            t.add_column(c, justify="right")
        for r in rows:
            t.add_row(r["schedule"], str(r["pp"]), str(r["microbatches"]), str(r["vpp"]), r["mem_limit"],
                      str(r["jobs"]), f"{r['build_s']:.3f}", f"{r['simulate_s']:.3f}",
                      f"{r['build_over_simulate']:.2f}")
        Console(width=None if sys.stdout.isatty() else 160).print(t)
        return 0

    ref = load_reference(args.reference)
    if ref is None:
        where = args.reference or "$PIPELOOM_REFERENCE and ../shared/reference/official_zb.json"
        print(f"reference file not found (looked at {where}); nothing to compare, skipping", file=sys.stderr)
        return 0
    gens = {g.strip() for g in args.generators.split(",")}
    limits = {x.strip() for x in args.limits.split(",")} if args.limits else None
    cases = [c for c in ref["cases"] if c["generator"] in gens and (limits is None or c["mem_limit"] in limits)]
    rows = []
    try:
        from rich.progress import track
        it = track(cases, description="planning", transient=True, disable=args.json or not sys.stderr.isatty())
    except ImportError:  # pragma: no cover
        it = cases
    bounds = load_bounds()
    for c in it:
        rows.append(run_case(c, bounds, args.effort))
    summary = {
        "cases": len(rows),
        "retime_mismatches": [r["id"] for r in rows if not r["retime_ok"]],
        "better": sum(r["verdict"].startswith("better") for r in rows),
        "equal": sum(r["verdict"].startswith("equal") for r in rows),
        "equal_optimal": sum(r["verdict"] == "equal (optimal)" for r in rows),
        "equal_open": [r["id"] for r in rows if r["verdict"] == "equal (open)"],
        "proven_optimal": sum(r["proven_optimal"] for r in rows),
        "worse": [r["id"] for r in rows if r["verdict"] == "worse"],
        "over_limit": [r["id"] for r in rows if not r["within_limit"]],
        "mean_makespan_ratio": (sum(r["ours_equal_memory_makespan"] / r["official_makespan"] for r in rows)
                                / max(len(rows), 1)),
    }
    if args.json:
        print(json.dumps({"summary": summary, "rows": rows}, indent=1))
        return 0
    if args.markdown:
        print(_groups_table(rows))
        print()
        print("| case | makespan off. | ours | ours @ off. peak | bound | stage bubble off. | ours | bubble off. "
              "| ours | peak off. | ours | verdict |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for r in rows:
            at = "-" if r["ours_at_official_peak"] is None else f"{r['ours_at_official_peak']:g}"
            lb = "-" if r["lower_bound"] is None else f"{r['lower_bound']:g}"
            print(f"| {r['id']} | {r['official_makespan']:g} | {r['ours_makespan']:g} | {at} | {lb} "
                  f"| {r['official_stage_bubble']:.4f} | {r['ours_stage_bubble']:.4f} | {r['official_bubble']:.4f} "
                  f"| {r['ours_bubble']:.4f} | {r['official_peak']:g} | {r['ours_peak']:g} | {r['verdict']} |")
        print()
        print(_summary_line(summary))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title="official zero-bubble generators vs pipeloom (same costs; memory in units, 1p = pp)")
    for col in ("case", "makespan off.", "ours", "ours @ off. peak", "bound", "stage bubble off.", "ours",
                "bubble off.", "ours", "peak off.", "ours", "verdict"):
        t.add_column(col, justify="left" if col == "case" else "right")
    colour = {"better": "green", "equal": "white", "worse": "red"}
    for r in rows:
        t.add_row(r["id"], f"{r['official_makespan']:g}", f"{r['ours_makespan']:g}",
                  "-" if r["ours_at_official_peak"] is None else f"{r['ours_at_official_peak']:g}",
                  "-" if r["lower_bound"] is None else f"{r['lower_bound']:g}",
                  f"{r['official_stage_bubble']:.4f}", f"{r['ours_stage_bubble']:.4f}",
                  f"{r['official_bubble']:.4f}", f"{r['ours_bubble']:.4f}",
                  f"{r['official_peak']:g}", f"{r['ours_peak']:g}",
                  f"[{colour[r['verdict'].split()[0]]}]{r['verdict']}[/]")
    con = Console(width=None if sys.stdout.isatty() else 160)
    con.print(t)
    con.print(_summary_line(summary))
    return 0


def _groups_table(rows: list[dict]) -> str:
    """Markdown summary per (generator, limit): table 1 of docs/bench/zb_vs_official.md."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["generator"], r["mem_limit"]), []).append(r)
    out = ["| generator | limit | cases | better | equal (optimal) | equal (open) | worse | ours proven optimal "
           "| mean makespan ratio ours/official (equal memory) |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (gen, lim), rs in sorted(groups.items()):
        n = len(rs)
        cnt = {v: sum(r["verdict"].startswith(v) for r in rs) for v in ("better", "equal (optimal)",
                                                                           "equal (open)", "worse")}
        eq_plain = sum(r["verdict"] == "equal" for r in rs)  # 1f1b: no bound
        ratio = sum(r["ours_equal_memory_makespan"] / r["official_makespan"] for r in rs) / n
        opt = sum(r["proven_optimal"] for r in rs)
        out.append(f"| {gen} | {lim} | {n} | {cnt['better']} | {cnt['equal (optimal)'] if not eq_plain else '-'} "
                   f"| {cnt['equal (open)'] if not eq_plain else f'{eq_plain} (no bound)'} | {cnt['worse']} "
                   f"| {opt if not eq_plain else '-'} | {ratio:.4f} |")
    return "\n".join(out)


def _summary_line(summary: dict) -> str:
    return (f"{summary['cases']} cases: {summary['better']} better, {summary['equal']} equal "
            f"({summary['equal_optimal']} proven optimal, open: {summary['equal_open'] or 'none'}), "
            f"{len(summary['worse'])} worse {summary['worse']}; ours proven optimal on {summary['proven_optimal']}; "
            f"mean makespan ratio ours/official at equal "
            f"memory {summary['mean_makespan_ratio']:.4f}; official re-timed by pipeloom's simulator: "
            f"{summary['cases'] - len(summary['retime_mismatches'])}/{summary['cases']} match; "
            f"over the limit: {summary['over_limit'] or 'none'}")


if __name__ == "__main__":
    sys.exit(main())
