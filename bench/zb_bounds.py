#!/usr/bin/env python
"""Makespan lower bounds for the official zero-bubble reference cases (bench/data/zb_bounds.json).

For every case of ../shared/reference/official_zb.json (except 1f1b, a fixed schedule) this
computes pipeloom's analytic lower bound (:func:`pipeloom.schedule.search.bounds.lower_bound`: critical
path, device load and the two memory terms) and, where that bound is below the best makespan
known (ours and the official one), runs the exact CP-SAT model of ``optimal`` on the full problem
from the best known schedule (one worker, fixed seed, deterministic time limit ``--det-time``),
which raises the bound (to the optimum when it proves it) and may find a shorter schedule.
``bench/zb_vs_official.py`` reads the file for its bound column and its verdicts.

    python bench/zb_bounds.py                      # all cases, writes bench/data/zb_bounds.json
    python bench/zb_bounds.py --det-time 60 --only zbv-pp4-m8-E-1p
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _harness import write_json
from pipeloom.schedule.planning import make_spec, plan
from pipeloom.schedule.io.official import BUILDER_OF, case_costs, load_reference, official_schedule
from pipeloom.schedule.search.bounds import graph_bound
from pipeloom.core.ir import Placement
from pipeloom.schedule.search.cpsat import hint_starts, job_graph, relabel_hint, solve_graph
from pipeloom.sim.simulate import simulate

OUT = Path(__file__).resolve().parent / "data" / "zb_bounds.json"


def bound_case(case: dict, det_time: float) -> dict:
    costs = case_costs(case)
    pp, vpp, m = case["pp"], case["vpp"], case["microbatches"]
    lim = case["limit_units"]
    placement = Placement.V if vpp >= 2 else Placement.INTERLEAVED
    spec = make_spec(pp=pp, microbatches=m, vpp=vpp, costs=costs, mem_limit=lim)
    g = job_graph(spec, placement)
    assert not g.rounded
    lb, term, dev = graph_bound(g)
    ours = plan(BUILDER_OF[case["generator"]], spec)
    off = official_schedule(case)
    known = []
    for s in (ours, off):
        r = simulate(s, g.int_costs())
        known.append((int(round(r.makespan)), s, r))
    best_ms, best_s, best_r = min(known, key=lambda x: x[0])
    row = {"id": case["id"], "analytic": lb / g.tscale, "analytic_term": term, "bound": lb / g.tscale,
           "how": "analytic", "best_known": best_ms / g.tscale, "best_known_from": "pipeloom"
           if best_s is ours else "official"}
    if lb >= best_ms or det_time <= 0:
        return row
    hint = relabel_hint(hint_starts(best_r), m, g.nc)
    t0 = time.perf_counter()
    res = solve_graph(g, "interval", hint, best_ms, det_time=det_time, workers=1, seed=0, extra_lb=lb)
    row["cp_sat_wall_s"] = round(time.perf_counter() - t0, 1)
    row["cp_sat_det_time"] = det_time
    if res is not None:
        status, _, obj, bnd = res
        if obj < best_ms:
            row["best_known"], row["best_known_from"] = obj / g.tscale, f"cp-sat (det {det_time:g} s)"
        if max(bnd, lb) > lb:
            row["bound"], row["how"] = min(max(bnd, lb), obj) / g.tscale, f"cp-sat (det {det_time:g} s)"
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", default=None)
    ap.add_argument("--det-time", type=float, default=20.0,
                    help="CP-SAT deterministic time per case whose analytic bound is open (0: analytic only)")
    ap.add_argument("--only", default=None, help="comma-separated case ids")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    ref = load_reference(args.reference)
    if ref is None:
        print("reference file not found; nothing to do", file=sys.stderr)
        return 0
    only = set(args.only.split(",")) if args.only else None
    out_path = Path(args.out)
    old = json.loads(out_path.read_text())["cases"] if out_path.is_file() else {}
    rows = dict(old)
    for case in ref["cases"]:
        if case["generator"] == "1f1b" or (only and case["id"] not in only):
            continue
        row = bound_case(case, args.det_time)
        rows[case["id"]] = row
        print(f"{row['id']:22s} bound {row['bound']:g} ({row['how']}), best known {row['best_known']:g} "
              f"({row['best_known_from']})", flush=True)
    write_json(out_path, {"cases": rows}, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
