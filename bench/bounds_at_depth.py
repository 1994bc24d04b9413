"""Is the gap at depth the plan's or the bound's? Stronger searches and exact optima against the proven bound.

Two parts, both with the Zero Bubble paper's costs per chunk pass (F=1, B=2, W=1, comm 0.5) unless said:

  * **depth**: pp 16 and 32, m 2pp and 4pp; ``zbv`` and ``vhalf`` at 0.5p and ``vmin`` at its own limit
    (V-Min's (p+4)//3 units), each planned in a fresh process with the default options, with
    ``-O effort=high`` and with larger greedy budgets (``-O budget=1000000`` and ``4000000`` placements);
    makespan, plan CPU and :func:`pipeloom.schedule.search.bounds.lower_bound` at the plan's limit.
  * **small** (``--small``): shapes of the low-memory grid (bench/optimality_gap.py --low-memory) where the
    bound is far below the best plan, solved by the exact CP-SAT model (``optimal``, one worker, from the
    default ``zbv`` plan, ``--time-limit`` seconds each): a proven optimum above the bound says the gap is the
    bound's there.

    python bench/bounds_at_depth.py --markdown docs/bench/schedules_at_scale.md     # 75-250 s
    python bench/bounds_at_depth.py --small --time-limit 150                         # about 20 minutes
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from _harness import plan_in_child, write_section

ZB = "F=1,B=2,W=1,comm=0.5"
OPTIONS = ({}, {"effort": "high"}, {"budget": 1_000_000}, {"budget": 4_000_000})
HEAD = "## Stronger searches at depth against the bound"

INTRO = """Command (CPU, each plan in a fresh process; the same machine and load as the table below):

```
python bench/bounds_at_depth.py --markdown docs/bench/schedules_at_scale.md      # 75-250 s
```

The Zero Bubble costs at pp 16 and 32, m 2pp and 4pp: `zbv` and `vhalf` at 0.5p and `vmin` at its own limit,
planned with the default options, with `-O effort=high` and with larger greedy budgets (`-O budget=1000000`,
`-O budget=4000000` placements), against the proven bound (`lower_bound`, with the steady-state term) at the
plan's limit. "best gap" is the best of the four plans against the bound.
"""

#: (pp, m, limit units, costs) of the low-memory grid at 0.5p with the widest gaps between plan and bound
SMALL = ((2, 6, 1.0, "F=1,B=1,W=1,comm=0"), (2, 6, 1.0, "F=1,B=2,W=1,comm=0"), (2, 6, 1.0, ZB),
         (3, 6, 1.5, "F=1,B=2,W=1,comm=0"), (3, 9, 1.5, "F=1,B=2,W=1,comm=0"), (3, 9, 1.5, ZB),
         (4, 8, 2.0, "F=1,B=2,W=1,comm=0"), (4, 8, 2.0, ZB), (4, 12, 2.0, ZB))


def plan(name: str, pp: int, m: int, limit, opts: dict, timeout: float = 300) -> dict | None:
    return plan_in_child(name, pp, 2, m, ZB, limit, opts, timeout)


def depth_rows() -> list[dict]:
    rows = []
    for pp in (16, 32):
        for m in (2 * pp, 4 * pp):
            for name, limit in (("zbv", "0.5p"), ("vhalf", "0.5p"), ("vmin", None)):
                row = {"pp": pp, "m": m, "plan": name, "limit": limit or "own", "runs": []}
                for opts in OPTIONS:
                    r = plan(name, pp, m, limit, opts)
                    row["runs"].append(r)
                    if r is not None:
                        row["units"], row["bound"], row["term"] = r["limit"], r["bound"], r["term"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def depth_table(rows: list[dict]) -> str:
    lines = ["| pp | m | plan | limit (units) | default | effort=high | budget=1e6 | budget=4e6 | bound | bound term "
             "| best gap | CPU s (default / high / 1e6 / 4e6) |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---|"]
    met = 0
    for r in rows:
        ms = [x["makespan"] if x else None for x in r["runs"]]
        best = min(x for x in ms if x is not None)
        met += best <= r["bound"] + 1e-9
        cells = [f"{x:g}" if x is not None else "> 300 s" for x in ms]
        cpu = " / ".join(f"{x['cpu_s']:.2f}" if x else "-" for x in r["runs"])
        lines.append(f"| {r['pp']} | {r['m']} | {r['plan']} | {r['units']:g} | " + " | ".join(cells)
                     + f" | {r['bound']:g} | {r['term']} | {best / r['bound'] - 1:.2%} | {cpu} |")
    return "\n".join(lines) + f"\n\n- {met} of {len(rows)} shapes have a plan that meets the bound.\n"


def small_rows(time_limit: float) -> list[dict]:
    from pipeloom.core.ir import Placement
    from pipeloom.schedule import registry
    from pipeloom.schedule.planning import make_spec
    from pipeloom.schedule.search.bounds import lower_bound
    from pipeloom.sim.simulate import simulate

    rows = []
    for pp, m, units, costs in SMALL:
        spec = make_spec(pp=pp, microbatches=m, vpp=2, costs=costs, mem_limit=units)
        start = registry.build("zbv", spec)
        opt = make_spec(pp=pp, microbatches=m, vpp=2, costs=costs, mem_limit=units,
                        options={"time_limit": time_limit, "workers": 1, "placement": "v", "backward": "split",
                                 "hints": False, "start_from": [start], "allow_large": True})
        t0 = time.perf_counter()
        s = registry.build("optimal", opt)
        row = {"pp": pp, "m": m, "units": units, "costs": costs,
               "zbv": simulate(start, spec.costs, spec.mem).makespan, "status": s.meta["status"],
               "best": s.meta["makespan"], "cp_bound": s.meta["best_bound"],
               "bound": lower_bound(spec, Placement.V).value, "wall_s": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def small_table(rows: list[dict]) -> str:
    lines = ["| pp | m | limit (units) | costs | default zbv | CP-SAT best | proven | CP-SAT bound | lower_bound | "
             "optimum / lower_bound - 1 |", "|---:|---:|---:|---|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        proven = r["status"] == "OPTIMAL"
        lines.append(f"| {r['pp']} | {r['m']} | {r['units']:g} | {r['costs']} | {r['zbv']:g} | {r['best']:g} | "
                     f"{'yes' if proven else 'no'} | {r['cp_bound']:g} | {r['bound']:g} | "
                     + (f"{r['best'] / r['bound'] - 1:.1%}" if proven else "-") + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="the exact CP-SAT optima of small shapes instead")
    ap.add_argument("--time-limit", type=float, default=150.0, help="CP-SAT seconds per small shape")
    ap.add_argument("--markdown", metavar="FILE.md", help="put the depth table into this page (its own section)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.small:
        print(small_table(small_rows(args.time_limit)))
    else:
        text = depth_table(depth_rows())
        print(text)
        if args.markdown:
            write_section(args.markdown, HEAD, f"{HEAD}\n\n{INTRO}\n{text}", before="## Table")
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
