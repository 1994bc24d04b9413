"""Generation speed of `pipeloom plan` end to end (issue 4: zbv pp 64, m 512, 1p under 0.5 s).

Runs the CLI command as a user would (a fresh process each time, output discarded or written to a
file), several times per variant, interleaved so that machine load hits every variant alike, and
prints the minimum and the median wall time. Variants:

  * the target command, default build (C greedy pass + the validator's witness check),
  * the same with PIPELOOM_PURE_PYTHON=1 (the pure-Python greedy pass, for the ratio),
  * the same writing the schedule to a .json file (-o),
  * a trivial plan (1f1b, pp 2, m 2): interpreter start-up + imports + argument parsing.

Then an in-process breakdown of the target case (build, validate, text, JSON), best of 3.

    python bench/plan_speed.py                 # table
    python bench/plan_speed.py --runs 9 --json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import alternate, median
from pipeloom.schedule import io as schedule_io

TARGET = ["plan", "--schedule", "zbv", "--pp", "64", "--microbatches", "512", "--mem-limit", "1p"]
TRIVIAL = ["plan", "--schedule", "1f1b", "--pp", "2", "--microbatches", "2"]


def _cli() -> list[str]:
    exe = Path(sys.executable).with_name("pipeloom")
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-c", "import sys; from pipeloom.cli import main; sys.exit(main())"]


def _process(argv: list[str], env: dict):
    """One whole process (the harness times the call)."""
    return lambda: subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)


def end_to_end(runs: int) -> list[dict]:
    base = dict(os.environ)
    base.pop("PIPELOOM_PURE_PYTHON", None)
    pure = dict(base, PIPELOOM_PURE_PYTHON="1")
    out_file = os.path.join(tempfile.mkdtemp(prefix="pipeloom-speed-"), "plan.json")
    cli = _cli()
    variants = [
        ("pipeloom plan zbv pp64 m512 1p (printed)", cli + TARGET, base),
        ("same, pure-Python greedy pass", cli + TARGET, pure),
        ("same, written with -o plan.json", cli + TARGET + ["-o", out_file], base),
        ("trivial plan (start-up: 1f1b pp2 m2)", cli + TRIVIAL, base),
    ]
    # one warm-up round (page cache, .pyc files), then the variants in turn, ``runs`` rounds
    times = alternate({name: _process(argv, env) for name, argv, env in variants}, runs, warmup=1)
    return [{"variant": name, "runs": runs, "min_s": min(ts), "median_s": median(ts)} for name, ts in times.items()]


def breakdown() -> dict:
    from pipeloom.schedule.planning import make_spec
    from pipeloom.schedule.search import greedy as _greedy
    from pipeloom.schedule import registry
    from pipeloom.schedule.validate import validate

    spec = make_spec(pp=64, microbatches=512, vpp=2, mem_limit="1p")
    best: dict[str, float] = {}
    for _ in range(3):
        t0 = time.perf_counter()
        s = registry.build("zbv", spec)
        t1 = time.perf_counter()
        v = validate(s, mem=spec.mem, mem_limit=spec.mem_limit)
        t2 = time.perf_counter()
        s.to_text()
        t3 = time.perf_counter()
        schedule_io.to_json(s)
        t4 = time.perf_counter()
        assert v == [], v
        for k, dt in (("build_s", t1 - t0), ("validate_s", t2 - t1), ("to_text_s", t3 - t2), ("to_json_s", t4 - t3)):
            best[k] = min(best.get(k, dt), dt)
    best["jobs"] = s.num_jobs
    best["c_pass"] = _greedy.accelerated()
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7, help="measured runs per variant (default 7)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    rows = end_to_end(args.runs)
    parts = breakdown()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    if args.json:
        print(json.dumps({"end_to_end": rows, "in_process": parts, "load_average_1min": load}, indent=1))
        return 0
    target = rows[0]["median_s"]
    print(f"load average (1 min) after the runs: {load:.2f}")
    print("| command | runs | min s | median s | median / target command |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['variant']} | {r['runs']} | {r['min_s']:.3f} | {r['median_s']:.3f} | "
              f"{r['median_s'] / target:.2f} |")
    print()
    print(f"in-process, best of 3, {parts['jobs']} jobs, C pass: {parts['c_pass']}")
    print("| step | s |")
    print("|---|---:|")
    for k in ("build_s", "validate_s", "to_text_s", "to_json_s"):
        print(f"| {k[:-2]} | {parts[k]:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
