"""Generation speed of `pipeloom plan` end to end (issue 4: zbv pp 64, m 512, 1p under 0.5 s).

Runs the CLI command as a user would (a fresh process each time, output discarded or written to a
file), several times per variant, interleaved so that machine load hits every variant alike, and
prints the minimum and the median wall time. Variants:

  * the target command, default build (C greedy pass + the validator's witness check),
  * the same with PIPELOOM_PURE_PYTHON=1 (the pure-Python greedy pass, for the ratio),
  * the same writing the schedule to a .json file (-o),
  * a trivial plan (1f1b, pp 2, m 2): interpreter start-up + imports + argument parsing.

Then an in-process breakdown of the target case (build, validate, text, JSON), best of 3.

With ``--before SRC`` (the ``src`` folder of another checkout, its C extension built) it instead compares
the default plans of :data:`SCALE_CASES` (every default V plan at pp 128, m 512, both cost sets of
``bench/schedules_at_scale.py``, and smaller shapes of other builders) between the two trees: each plan in a
fresh process per tree, alternating this / before (mirrored every other round), ``--runs`` rounds; per case
the median plan CPU time (``time.process_time`` around the build), the peak RSS, the median of the pairwise
ratios of whole-process wall time, and whether both trees planned the same job lists.

    python bench/plan_speed.py                 # table
    python bench/plan_speed.py --runs 9 --json
    python bench/plan_speed.py --before ../before/src --runs 3 --markdown docs/bench/plan_speed.md
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

from _harness import alternate, median, ratio_summary, write_section
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


EQUAL, ZB = "F=1,B=1,W=1,comm=0", "F=1,B=2,W=1,comm=0.5"
#: the heading of the section ``--before --markdown`` writes
COMPARE_HEAD = "### Measured table (bench/plan_speed.py --before)"
#: (schedule, pp, m, costs, --mem-limit or None for the builder's own, pure Python); vpp 2 (V shapes), zbvpp looped
SCALE_CASES = tuple(("zbv", 128, 512, c, lim, False) for c in (EQUAL, ZB) for lim in ("1p", "0.75p", "0.5p")) + tuple(
    ("vmin", 128, 512, c, None, False) for c in (EQUAL, ZB)) + (
    ("zbv", 64, 512, EQUAL, "1p", False), ("zbv", 64, 512, EQUAL, "1p", True), ("vhalf", 32, 128, ZB, None, False),
    ("zbvpp", 16, 64, ZB, None, False), ("zbvpp", 16, 64, ZB, None, True), ("zbv", 8, 24, ZB, "0.75p", False))

_CHILD = r"""
import hashlib, json, resource, sys, time
from pipeloom.schedule import registry
from pipeloom.schedule.planning import make_spec
name, pp, m, costs, limit, _pure = json.loads(sys.argv[1])
spec = make_spec(pp=pp, vpp=2, microbatches=m, costs=costs, mem_limit=limit)
t0 = time.process_time()
s = registry.build(name, spec)
cpu = time.process_time() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
digest = hashlib.sha1(repr([list(x) for x in s.devices]).encode()).hexdigest()
print(json.dumps({"cpu_s": cpu, "rss_mb": rss, "jobs": digest}))
"""


def _child(src: Path, case, out: list):
    """One whole process planning ``case`` with ``src`` on the path; what it printed is appended to ``out``."""
    env = dict(os.environ, PYTHONPATH=str(src))
    env.pop("PIPELOOM_PURE_PYTHON", None)
    if case[5]:
        env["PIPELOOM_PURE_PYTHON"] = "1"

    def run():
        r = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(list(case))], env=env, check=True,
                           capture_output=True, text=True)
        out.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return run


def compare(before: Path, runs: int) -> list[dict]:
    """Every case of :data:`SCALE_CASES`, this tree against ``before`` (see the module docstring)."""
    here = Path(__file__).resolve().parents[1] / "src"
    rows = []
    for case in SCALE_CASES:
        got: dict[str, list] = {"this": [], "before": []}
        wall = alternate({k: _child(p, case, got[k]) for k, p in (("this", here), ("before", before))}, runs,
                         mirror=True)
        rows.append({"case": case, "runs": runs,
                     "cpu_this_s": median(x["cpu_s"] for x in got["this"]),
                     "cpu_before_s": median(x["cpu_s"] for x in got["before"]),
                     "rss_this_mb": max(x["rss_mb"] for x in got["this"]),
                     "rss_before_mb": max(x["rss_mb"] for x in got["before"]),
                     "wall_ratio": ratio_summary(wall["this"], wall["before"])["median"],
                     "same_jobs": len({x["jobs"] for x in got["this"] + got["before"]}) == 1})
    return rows


def _case_text(case) -> str:
    name, pp, m, costs, limit, pure = case
    cost = "equal" if costs == EQUAL else "zb"
    return f"{name} pp {pp} m {m} {cost} {limit or '(own limit)'}{' (pure Python)' if pure else ''}"


def compare_table(rows: list[dict]) -> str:
    lines = ["| plan (vpp 2, default options) | runs | plan CPU s, this | before | this / before wall "
             "(median of pairs) | peak RSS MB, this | before | same job lists |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {_case_text(r['case'])} | {r['runs']} | {r['cpu_this_s']:.2f} | {r['cpu_before_s']:.2f} | "
                     f"{r['wall_ratio']:.3f} | {r['rss_this_mb']:.0f} | {r['rss_before_mb']:.0f} | "
                     f"{'yes' if r['same_jobs'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7, help="measured runs per variant (default 7)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--before", type=Path, help="the src folder of another checkout: compare the plans of "
                    "SCALE_CASES between the two trees instead")
    ap.add_argument("--markdown", help="with --before: write the table into this page (its own section)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    if args.before is not None:
        rows = compare(args.before, args.runs)
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        if args.json:
            print(json.dumps({"compare": rows, "load_average_1min": load}, indent=1))
            return 0
        table = compare_table(rows)
        print(f"load average (1 min) after the runs: {load:.2f}")
        print(table)
        if args.markdown:
            write_section(args.markdown, COMPARE_HEAD, COMPARE_HEAD + "\n\n" + table)
        return 0
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
