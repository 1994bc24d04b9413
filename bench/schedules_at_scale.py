"""Default V-shape plans at the depths real jobs use: makespan vs 1F1B and vs the proven bound, plan CPU and RSS.

For pp 16-128 and m 2pp-8pp (pp 128: 2pp and 4pp, to keep the run near 10 minutes), two cost sets per
chunk pass (equal: F=B=W=1, comm 0; the Zero Bubble paper's profiled ratios: F=1, B=2, W=1, comm 0.5), it
plans with the default options (no ``-O``), as a user would:

  * ``zbv`` at 1p (1F1B's peak), 0.75p and 0.5p,
  * ``vmin`` at its own limit (V-Min's (p+4)//3 units, about 1/3 of 1F1B),

each in a fresh process (its CPU time for the plan and its peak RSS are the plan's own), and compares the
makespan with 1F1B on the same model (vpp 1, a stage = two chunks: per-stage costs twice the chunk costs;
1F1B's memory is 1p) and with the proven lower bound at the same memory limit
(:func:`pipeloom.schedule.search.bounds.lower_bound`; gap = makespan / bound - 1).

    python bench/schedules_at_scale.py                       # the table (about 10 minutes on 2 cores)
    python bench/schedules_at_scale.py --quick               # pp 16 and 32, m 2pp and 4pp
    python bench/schedules_at_scale.py --markdown docs/bench/schedules_at_scale.md
    python bench/schedules_at_scale.py --bounds-only --markdown docs/bench/schedules_at_scale.md  # bounds only
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from _harness import plan_in_child, write_json, write_section

COSTS = {"equal": "F=1,B=1,W=1,comm=0", "zb": "F=1,B=2,W=1,comm=0.5"}
#: 1F1B's stage is two chunks of the V: twice the chunk costs, the same comm
STAGE_COSTS = {"equal": "F=2,B=2,W=2,comm=0", "zb": "F=2,B=4,W=2,comm=0.5"}
#: (schedule, --mem-limit) per row; None: the builder's own limit
PLANS = (("zbv", "1p"), ("zbv", "0.75p"), ("zbv", "0.5p"), ("vmin", None))

def plan(name: str, pp: int, vpp: int, m: int, costs: str, limit: str | None) -> dict:
    return plan_in_child(name, pp, vpp, m, costs, limit)


def shapes(quick: bool) -> list[tuple[int, int]]:
    if quick:
        return [(pp, k * pp) for pp in (16, 32) for k in (2, 4)]
    return [(pp, k * pp) for pp in (16, 32, 64, 128) for k in (2, 4, 8) if not (pp == 128 and k == 8)]


def run(quick: bool) -> list[dict]:
    rows = []
    for pp, m in shapes(quick):
        for cname in COSTS:
            ref = plan("1f1b", pp, 1, m, STAGE_COSTS[cname], None)
            for name, limit in PLANS:
                r = plan(name, pp, 2, m, COSTS[cname], limit)
                row = {"pp": pp, "m": m, "costs": cname, "schedule": name, "mem_limit": limit or "own",
                       "limit_units": r["limit"], "makespan": r["makespan"], "peak": r["peak"],
                       "onef1b": ref["makespan"], "vs_1f1b": r["makespan"] / ref["makespan"],
                       "bound": r["bound"], "gap": r["makespan"] / r["bound"] - 1 if r["bound"] else None,
                       "cpu_s": r["cpu_s"], "rss_mb": r["rss_mb"]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| pp | m | costs | plan | limit (units) | makespan | 1F1B (1p) | vs 1F1B | proven bound | gap | "
             "plan CPU s | peak RSS MB |",
             "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        plan_name = f"{r['schedule']} {r['mem_limit']}" if r["mem_limit"] != "own" else f"{r['schedule']} (own)"
        gap = "-" if r["gap"] is None else f"{r['gap']:.2%}"
        lines.append(f"| {r['pp']} | {r['m']} | {r['costs']} | {plan_name} | {r['limit_units']:g} | "
                     f"{r['makespan']:g} | {r['onef1b']:g} | {r['vs_1f1b']:.3f} | {r['bound']:g} | {gap} | "
                     f"{r['cpu_s']:.2f} | {r['rss_mb']:.0f} |")
    return "\n".join(lines) + "\n"


def summary(rows: list[dict]) -> str:
    at_1p = [r for r in rows if r["mem_limit"] == "1p"]
    worse = [r for r in at_1p if r["vs_1f1b"] > 1 + 1e-9]
    out = [f"- {len(rows)} plans; at 1p (1F1B's memory) {len(worse)} of {len(at_1p)} slower than 1F1B "
           f"(worst ratio {max(r['vs_1f1b'] for r in at_1p):.3f})."]
    for cname in COSTS:
        for name, limit in PLANS:
            sel = [r for r in rows if r["costs"] == cname and r["schedule"] == name
                   and r["mem_limit"] == (limit or "own") and r["gap"] is not None]
            if sel:
                within = sum(r["gap"] <= 0.01 + 1e-12 for r in sel)
                out.append(f"- {cname} costs, {name} {limit or '(own limit)'}: gap to the proven bound mean "
                           f"{sum(r['gap'] for r in sel) / len(sel):.2%}, max {max(r['gap'] for r in sel):.2%}, "
                           f"{within} of {len(sel)} within 1%.")
    out.append(f"- plan CPU at most {max(r['cpu_s'] for r in rows):.2f} s, peak RSS at most "
               f"{max(r['rss_mb'] for r in rows):.0f} MB.")
    return "\n".join(out) + "\n"


def bounds_only(page: str) -> list[dict]:
    """The rows of the table committed in ``page`` with the bound and gap columns recomputed by today's
    :func:`~pipeloom.schedule.search.bounds.lower_bound` (no planning: makespans, CPU and RSS stay as measured)."""
    from pipeloom.schedule.planning import make_spec
    from pipeloom.schedule.search.bounds import lower_bound

    text = open(page, encoding="utf-8").read()
    rows = []
    for line in text[text.index("## Table"):].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 12 or not cells[0].isdigit():
            continue
        pp, m, cname, plan_name, units, ms, ref, _vs, _b, _g, cpu, rss = cells
        name, label = plan_name.split(" ", 1)
        label = "own" if label == "(own)" else label
        spec = make_spec(pp=int(pp), vpp=2, microbatches=int(m), costs=COSTS[cname], mem_limit=float(units))
        bound = lower_bound(spec, "v").value
        rows.append({"pp": int(pp), "m": int(m), "costs": cname, "schedule": name, "mem_limit": label,
                     "limit_units": float(units), "makespan": float(ms), "onef1b": float(ref),
                     "vs_1f1b": float(ms) / float(ref), "bound": bound, "gap": float(ms) / bound - 1,
                     "cpu_s": float(cpu), "rss_mb": float(rss)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="pp 16 and 32, m 2pp and 4pp")
    ap.add_argument("--markdown", metavar="FILE.md", help="write the table section into this page")
    ap.add_argument("--json", metavar="FILE.json", help="write the rows as JSON")
    ap.add_argument("--bounds-only", action="store_true",
                    help="re-read the table of --markdown and recompute only its bound and gap columns (no planning)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.bounds_only and not args.markdown:
        ap.error("--bounds-only needs --markdown FILE.md (the page whose table it re-reads)")
    rows = bounds_only(args.markdown) if args.bounds_only else run(args.quick)
    text = table(rows) + "\n" + summary(rows)
    print(text)
    print(f"({time.perf_counter() - t0:.0f} s)")
    if args.json:
        write_json(args.json, rows)
    if args.markdown:
        head = "## Table"
        write_section(args.markdown, head, f"{head}\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
