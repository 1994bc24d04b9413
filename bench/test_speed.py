"""`make test-fast` of this tree against another checkout, whole processes alternating (issue 29's proof item:
"make test-fast takes less time than today on the 2-core machine, measured before/after in one run").

Each round runs the fast suite once in each tree (this one first, then the other), each in a fresh process:
the Makefile's line, ``pytest -q -n 2 -m "not slow and not dist"``, in the tree's folder with its ``src`` first
on the path (its C extension built there), under this interpreter (one venv for both). Bytecode caching is on
for both, as this Makefile sets it; an older Makefile left it to the environment, so where the environment turns
it off the older tree is slower than measured here. Per run: wall seconds, the CPU seconds of the finished
process tree (user + system, from ``resource.getrusage(RUSAGE_CHILDREN)``), and the tests passed (pytest's
summary line; a run that fails stops the bench). One warm-up round is not counted. Medians, and the ratio
this / before taken within each round.

    .venv/bin/python bench/test_speed.py --before ../before --runs 3 --markdown docs/bench/test_speed.md
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

from _harness import median, ratio_summary, round_orders, write_section

HERE = Path(__file__).resolve().parents[1]
FAST = ["-m", "pytest", "-q", "-n", "2", "-m", "not slow and not dist"]
HEAD = "## Measured table (bench/test_speed.py)"


def one_run(tree: Path) -> dict:
    """The fast suite once in ``tree``: wall s, CPU s of the process tree, tests passed."""
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), PYTHONDONTWRITEBYTECODE="")
    env.pop("CI", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, *FAST], cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    tail = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr.strip()[-300:]
    if p.returncode != 0:
        raise SystemExit(f"test_speed: the fast suite failed in {tree} (exit {p.returncode}): {tail}")
    passed = re.search(r"(\d+) passed", tail)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, "tests": int(passed.group(1)) if passed else 0}


def commit_of(tree: Path) -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    return r.stdout.strip() or "?"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, type=Path, help="the other checkout (its C extension built)")
    ap.add_argument("--runs", type=int, default=3, help="counted rounds (one warm-up round more)")
    ap.add_argument("--markdown", type=Path, help="write the table into this page (section '%s')" % HEAD)
    a = ap.parse_args(argv)
    trees = {"this": HERE, "before": a.before.resolve()}
    for name, tree in trees.items():
        if not (tree / "src" / "pipeloom").is_dir():
            ap.error(f"--before {tree}: no src/pipeloom there" if name == "before" else "run from a checkout")
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for i, order in enumerate(round_orders(list(trees), a.runs + 1)):  # this, before; this, before; ...
        for name in order:
            r = one_run(trees[name])
            print(f"round {i}{' (warm-up)' if i == 0 else ''} {name}: {r['wall']:.1f} s wall, {r['cpu']:.1f} s CPU, "
                  f"{r['tests']} tests", file=sys.stderr)
            if i:
                runs[name].append(r)
    rows = ["| `make test-fast` | tests | wall s (median) | CPU s (median) |", "|---|---:|---:|---:|"]
    for name, tree in trees.items():
        rs = runs[name]
        rows.append(f"| {name} ({commit_of(tree)}) | {rs[0]['tests']:,} | {median(r['wall'] for r in rs):.1f} | "
                    f"{median(r['cpu'] for r in rs):.1f} |")
    ratio = {}
    for key in ("wall", "cpu"):
        q = ratio_summary([r[key] for r in runs["this"]], [r[key] for r in runs["before"]])
        ratio[key] = f"**{q['median']:.3f}** ({q['q1']:.3f}-{q['q3']:.3f})"
    rows.append(f"| this / before (median of the {a.runs} within-round ratios; quartiles) | | {ratio['wall']} | "
                f"{ratio['cpu']} |")
    load = os.getloadavg()[0]
    table = "\n".join(rows) + f"\n\nLoad average (1 min) after the runs: {load:.2f}.\n"
    print(table)
    if a.markdown:
        write_section(a.markdown, HEAD, f"{HEAD}\n\n{table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
