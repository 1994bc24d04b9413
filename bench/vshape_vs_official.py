#!/usr/bin/env python
"""pipeloom's V schedules against the official V-Half / V-Min generator at equal memory.

Reads ../shared/reference/official_vshape.json (or --reference; schema in that folder's README):
64 official V-Half / V-Min schedules (controllable-memory paper) with their makespans and peak memory
in two memory models. For every case and both models (``default``: pipeloom's default, B frees half;
``b0``: ``--mem a=0.5,b=0``, B frees nothing) pipeloom's ``zbv`` is planned with the official peak as
the memory limit, simulated, and compared: better / equal / worse makespan at equal or lower peak.
The official job lists are re-timed by pipeloom's simulator too (a check that the reference makespan
is reproduced). ``bound`` is pipeloom's proven lower bound of the makespan under that limit
(:func:`pipeloom.schedule.search.bounds.lower_bound`, or the planner's own where it reports one).

    python bench/vshape_vs_official.py              # rich table + summary
    python bench/vshape_vs_official.py --markdown   # the table of docs/bench/vshape_vs_official.md
    python bench/vshape_vs_official.py --json
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

from pipeloom.core.costs import Costs, MemModel
from pipeloom.core.ir import Job, Placement, make_schedule
from pipeloom.schedule.planning import make_spec, plan
from pipeloom.schedule.search.bounds import lower_bound
from pipeloom.sim.simulate import simulate

EPS = 1e-9
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REF = ROOT.parent / "shared" / "reference" / "official_vshape.json"
SHIPPED_REF = ROOT / "tests" / "data" / "official_vshape.json.gz"  # the same file, gzip -9 (tests/data/README.md)
MODELS = {"default": ("peak_default", MemModel()), "b0": ("peak_b0", MemModel(a=0.5, b=0.0))}


def case_id(c: dict) -> str:
    co = c["costs"]
    return f"{c['generator']}-pp{c['pp']}-m{c['microbatches']}-F{co['F']}B{co['B']}W{co['W']}c{co['comm']}"


def run_case(c: dict, model: str, effort: str = "fast") -> dict:
    key, mem = MODELS[model]
    costs = Costs(**c["costs"])
    pp, m = c["pp"], c["microbatches"]
    off = make_schedule("official", pp, 2, m, Placement.V, [[Job.parse(j) for j in d] for d in c["jobs"]])
    offr = simulate(off, costs, mem)
    lim = float(c[key])
    spec = make_spec(pp=pp, microbatches=m, vpp=2, costs=costs, mem=mem, mem_limit=lim, options={"effort": effort})
    t0 = time.perf_counter()
    ours = plan("zbv", spec)
    dt = time.perf_counter() - t0
    r = simulate(ours, costs, mem)
    lb = ours.meta.get("lower_bound")
    if lb is None:
        lb = lower_bound(spec, Placement.V).value
    ms = r.makespan
    verdict = "better" if ms < c["makespan"] - EPS else "equal" if ms <= c["makespan"] + EPS else "worse"
    return {"id": case_id(c), "model": model, "generator": c["generator"], "pp": pp, "microbatches": m,
            "costs": c["costs"], "limit": lim, "official_makespan": c["makespan"],
            "official_retimed": offr.makespan, "retime_ok": abs(offr.makespan - c["makespan"]) < 1e-6,
            "official_peak": max(offr.peak_memory), "ours_makespan": ms, "ours_peak": max(r.peak_memory),
            "within_limit": max(r.peak_memory) <= lim + EPS, "lower_bound": lb,
            "proven_optimal": ms <= lb + EPS, "gap_to_bound": ms / lb - 1 if lb else None,
            "builder": (ours.meta.get("policy") or {}).get("builder", "greedy"),
            "plan_s": dt, "verdict": verdict}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", default=os.environ.get("PIPELOOM_VSHAPE_REFERENCE"),
                    help="path of official_vshape.json (default: $PIPELOOM_VSHAPE_REFERENCE, else "
                         "../shared/reference/official_vshape.json, else tests/data/official_vshape.json.gz)")
    ap.add_argument("--models", default="default,b0", help="memory models to compare: default, b0")
    ap.add_argument("--effort", choices=("fast", "high"), default="fast",
                    help="zbv's planning effort (-O effort=...; default fast)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--markdown", action="store_true", help="print the markdown table (docs/bench)")
    args = ap.parse_args(argv)
    path = Path(args.reference) if args.reference else next(
        (p for p in (DEFAULT_REF, SHIPPED_REF) if p.is_file()), DEFAULT_REF)
    if not path.is_file():
        print(f"reference file not found ({path}); nothing to compare, skipping", file=sys.stderr)
        return 0
    models = [x.strip() for x in args.models.split(",") if x.strip()]
    bad = [x for x in models if x not in MODELS]
    if bad:
        ap.error(f"unknown memory model(s) {', '.join(bad)}; allowed: {', '.join(MODELS)}")
    with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
        cases = json.load(f)["cases"]
    work = [(c, mdl) for c in cases for mdl in models]
    from rich.progress import track
    rows = [run_case(c, mdl, args.effort) for c, mdl in track(work, description="planning", transient=True,
                                                  disable=args.json or not sys.stderr.isatty())]
    summary = {"cases": len(rows), **{v: sum(r["verdict"] == v for r in rows) for v in ("better", "equal", "worse")},
               "worse_ids": [f"{r['id']}/{r['model']}" for r in rows if r["verdict"] == "worse"],
               "proven_optimal": sum(r["proven_optimal"] for r in rows),
               "over_limit": [r["id"] for r in rows if not r["within_limit"]],
               "retime_mismatches": [r["id"] for r in rows if not r["retime_ok"]],
               "mean_ratio": sum(r["ours_makespan"] / r["official_makespan"] for r in rows) / max(len(rows), 1),
               "max_plan_s": max((r["plan_s"] for r in rows), default=0.0)}
    if args.json:
        print(json.dumps({"summary": summary, "rows": rows}, indent=1))
        return 0
    line = (f"{summary['cases']} comparisons: {summary['better']} better, {summary['equal']} equal, "
            f"{summary['worse']} worse {summary['worse_ids'] or ''}; proven optimal {summary['proven_optimal']}; "
            f"mean makespan ratio ours/official {summary['mean_ratio']:.4f}; over the limit: "
            f"{summary['over_limit'] or 'none'}; official re-timed: "
            f"{summary['cases'] - len(summary['retime_mismatches'])}/{summary['cases']} match")
    if args.markdown:
        print("| case | memory model | limit | official | ours | bound | ours/bound - 1 | our peak | candidate "
              "| plan s | verdict |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|")
        for r in rows:
            print(f"| {r['id']} | {r['model']} | {r['limit']:g} | {r['official_makespan']:g} | {r['ours_makespan']:g} "
                  f"| {r['lower_bound']:g} | {r['gap_to_bound']:.3f} | {r['ours_peak']:g} | {r['builder']} "
                  f"| {r['plan_s']:.2f} | {r['verdict']} |")
        print()
        print(line)
        return 0
    from rich.console import Console
    from rich.table import Table
    t = Table(title="official V-Half / V-Min vs pipeloom zbv at the official peak")
    for col in ("case", "model", "limit", "official", "ours", "bound", "peak", "candidate", "plan s", "verdict"):
        t.add_column(col, justify="left" if col in ("case", "model", "candidate") else "right")
    colour = {"better": "green", "equal": "white", "worse": "red"}
    for r in rows:
        t.add_row(r["id"], r["model"], f"{r['limit']:g}", f"{r['official_makespan']:g}", f"{r['ours_makespan']:g}",
                  f"{r['lower_bound']:g}", f"{r['ours_peak']:g}", r["builder"], f"{r['plan_s']:.2f}",
                  f"[{colour[r['verdict']]}]{r['verdict']}[/]")
    con = Console(width=None if sys.stdout.isatty() else 160)
    con.print(t)
    con.print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
