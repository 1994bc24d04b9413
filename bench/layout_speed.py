"""Planning, simulating and validating a 200k-job schedule: this checkout against another one, same run.

    python bench/layout_speed.py --before ../before/src [--runs 11]

``--before`` is the ``src`` folder of another checkout (e.g. ``git worktree add ../before 9e2e697`` and
``python setup.py build_ext --inplace`` there). Both trees run the same two measurements as whole processes,
alternating A B A B ..., ``--runs`` times:

* ``plan``: ``pipeloom plan -s zbv --pp 64 -m 512 --mem-limit 1p`` (196 608 jobs, start-up included);
* ``sim``: that plan, then the event simulation and the job-by-job validator, in one process.

The table gives each tree's median wall time and the median of the pairwise ratios (this / before).
Only names every version exports at the package top are used, so older trees run it unchanged.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from _harness import alternate, median, ratio_summary

HERE = Path(__file__).resolve().parents[1] / "src"
PLAN = ["-m", "pipeloom", "plan", "--schedule", "zbv", "--pp", "64", "--microbatches", "512", "--mem-limit", "1p"]
SIM = ["-c", "import pipeloom as pl\n"
       "spec = pl.make_spec(pp=64, microbatches=512, vpp=2, mem_limit='1p')\n"
       "s = pl.plan('zbv', spec)\n"
       "pl.simulate(s, spec.costs, spec.mem)\n"
       "pl.validate(pl.Schedule(s.name, s.pp, s.vpp, s.microbatches, s.placement, s.devices), mem=spec.mem,"
       " mem_limit=spec.mem_limit)\n"]


def process(src: Path, args: list[str]):
    """One whole process of ``python ARGS`` with ``src`` on the path (the bench times the call)."""
    env = dict(os.environ, PYTHONPATH=str(src))
    return lambda: subprocess.run([sys.executable, *args], env=env, check=True, stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, type=Path, help="the src folder of the checkout to compare with")
    ap.add_argument("--runs", type=int, default=11)
    args = ap.parse_args()
    print("| measurement | this tree (median wall) | before | this / before (median of pairs) |")
    print("|---|---:|---:|---:|")
    for name, cmd in (("`pipeloom plan -s zbv --pp 64 -m 512 --mem-limit 1p` (whole process)", PLAN),
                      ("plan + 196 608-job simulation + job-by-job validation (one process)", SIM)):
        # one warm-up round (file caches), then A B A B ...
        t = alternate({"this": process(HERE, cmd), "before": process(args.before, cmd)}, args.runs, warmup=1)
        ratio = ratio_summary(t["this"], t["before"])["median"]
        print(f"| {name} | {median(t['this']):.3f} s | {median(t['before']):.3f} s | {ratio:.3f} |")


if __name__ == "__main__":
    main()
