#!/usr/bin/env python
"""pipeloom's default V plans against the official generators at pp 24-48 (never worse, the issue's proof).

Reads ``bench/data/official_at_scale.json``: makespans and peak memory of the schedules the official
zero-bubble generators return (ZB-V at no limit, 1p and 2p; V-Half and V-Min of the controllable-memory
paper) for pp 24, 32 and 48, m 2pp and 4pp, with equal costs (F=B=W=1, comm 0) and the Zero Bubble paper's
profiled ratios (F=1, B=2, W=1, comm 0.5), per chunk pass. The file names its source (repository, commit,
entry points) and how it was made; the official code itself is not part of pipeloom.

For every case pipeloom plans the same builder with its default options (``zbv`` at the same limit,
``vhalf`` / ``vmin`` at their own budgets, which are the official schedules' peaks), simulates it and
compares: makespan (ours / official), peak memory, plan CPU time.

    python bench/official_at_scale.py               # table + summary
    python bench/official_at_scale.py --markdown    # the table of docs/bench/official_at_scale.md
    python bench/official_at_scale.py --pp 24       # one depth
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pipeloom.schedule import registry
from pipeloom.schedule.planning import make_spec
from pipeloom.sim.simulate import simulate

DATA = Path(__file__).resolve().parent / "data" / "official_at_scale.json"
EPS = 1e-9


def load(path: Path = DATA) -> dict:
    with open(path) as f:
        return json.load(f)


def costs_text(c: dict) -> str:
    k = c["costs"]
    return f"F={k['F']},B={k['B']},W={k['W']},comm={k['comm']}"


def case_id(c: dict) -> str:
    return f"{c['generator']}-{c['mem_limit']}-pp{c['pp']}-m{c['microbatches']}-{c['cost_set']}"


def ours(c: dict) -> dict:
    """pipeloom's default plan for an official case: the same builder at the same limit, simulated."""
    limit = c["mem_limit"] if c["generator"] == "zbv" else None
    spec = make_spec(pp=c["pp"], vpp=2, microbatches=c["microbatches"], costs=costs_text(c),
                     mem_limit=None if limit in (None, "none") else limit)
    t0 = time.process_time()
    sched = registry.build(c["generator"], spec)
    cpu = time.process_time() - t0
    r = simulate(sched, spec.costs, spec.mem)
    return {"makespan": r.makespan, "peak": max(r.peak_memory), "cpu_s": cpu,
            "builder": (sched.meta.get("policy") or {}).get("builder", "greedy")}


def run(cases: list[dict]) -> list[dict]:
    rows = []
    for c in cases:
        o = ours(c)
        rows.append({"id": case_id(c), "official": c["makespan"], "official_peak": c["peak_default"], **o,
                     "ratio": o["makespan"] / c["makespan"]})
    return rows


def summary(rows: list[dict]) -> dict:
    worse = [r for r in rows if r["makespan"] > r["official"] + EPS]
    better = [r for r in rows if r["makespan"] < r["official"] - EPS]
    return {"cases": len(rows), "worse": len(worse), "better": len(better),
            "equal": len(rows) - len(worse) - len(better),
            "best_ratio": min(r["ratio"] for r in rows), "worst_ratio": max(r["ratio"] for r in rows),
            "max_cpu_s": max(r["cpu_s"] for r in rows)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pp", type=int, default=None, help="only this depth")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    ap.add_argument("--json", action="store_true", help="print JSON {rows, summary}")
    args = ap.parse_args(argv)
    data = load()
    cases = [c for c in data["cases"] if "makespan" in c and (args.pp is None or c["pp"] == args.pp)]
    rows = run(cases)
    summ = summary(rows)
    if args.json:
        json.dump({"rows": rows, "summary": summ}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    header = ["case", "official", "pipeloom", "ours / official", "official peak", "our peak", "plan CPU s", "from"]
    body = [[r["id"], f"{r['official']:g}", f"{r['makespan']:g}", f"{r['ratio']:.3f}", f"{r['official_peak']:g}",
             f"{r['peak']:g}", f"{r['cpu_s']:.2f}", r["builder"]] for r in rows]
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|---|" + "---:|" * (len(header) - 2) + "---|")
        for row in body:
            print("| " + " | ".join(row) + " |")
    else:
        w = [max(len(x[i]) for x in [header] + body) for i in range(len(header))]
        for row in [header] + body:
            print("  ".join(x.rjust(w[i]) if i else x.ljust(w[i]) for i, x in enumerate(row)))
    print(f"\n- {summ['cases']} cases: pipeloom better in {summ['better']}, equal in {summ['equal']}, worse in "
          f"{summ['worse']}; ours / official from {summ['best_ratio']:.3f} to {summ['worst_ratio']:.3f}; "
          f"plan CPU at most {summ['max_cpu_s']:.2f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
