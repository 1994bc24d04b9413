"""Scale of the what-if straggler analysis: `pipeloom check` on a ~10^6-op op trace, wall time and peak memory.

Writes (once, cached in --dir) a synthetic trace of 128 ranks (dp 16 x pp 8 x tp 1, vpp 2, 16 microbatches,
40 steps, one slow worker planted), the same run with every TP rank of dp 4 x pp 8 x tp 4 recorded, and a
trace of 128 ranks in the real trainer format (dp 16 x pp 4 x cp 2, 16 microbatches, blocking P2P pairs, no-op
records, an overlapped reduce-scatter, clocks of 4 ms spread); then runs `python -m pipeloom check TRACE --json`
in a fresh process --runs times and reports
the median wall time and CPU time (user + system) of that process, its peak RSS, and the load average
of the machine when it started (wall times on a shared machine are only comparable at similar load; the
analysis is single-threaded, so on an idle machine wall ~ CPU time).

    python bench/whatif_scale.py --runs 3 [--out docs/bench/whatif.md]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from _harness import median, write_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
CASES = {
    "128 workers (dp16 pp8 vpp2), 1 rank each": ["--dp", "16", "--pp", "8", "--vpp", "2", "-m", "16"],
    "32 workers (dp4 pp8 tp4 vpp2), all 128 ranks": ["--dp", "4", "--pp", "8", "--tp", "4", "--vpp", "2", "-m", "16",
                                                     "--all-tp-ranks"],
    "128 ranks in the real format (dp16 pp4 cp2), skewed clocks": ["--real", "--dp", "16", "--pp", "4", "--cp", "2",
                                                                    "-m", "16", "--skew", "2"],
}


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return env


def make(path: str, extra: list[str]) -> dict:
    if not os.path.exists(path):
        cmd = [sys.executable, "-m", "pipeloom.trace.ops.synth_cli", path, "--steps", "40", "--cause", "slow_worker",
               "--where", "1,3", "--factor", "1.5", *extra]
        out = subprocess.run(cmd, env=_env(), check=True, capture_output=True, text=True).stdout
        write_text(path + ".info.json", out)
    return json.load(open(path + ".info.json"))


def run_once(path: str) -> tuple[float, float, float, dict]:
    args = ["check", path, "--meta", path.rsplit(".", 1)[0] + ".meta.yaml", "--json", "--out", path + ".whatif"]
    code = ("import resource, sys; from pipeloom.cli import main; rc = main(%r); "
            "u = resource.getrusage(resource.RUSAGE_SELF); "
            "print('maxrss', u.ru_maxrss, u.ru_utime + u.ru_stime, file=sys.stderr); sys.exit(rc)" % args)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(p.stderr)
    _, peak, cpu = p.stderr.strip().splitlines()[-1].split()  # KiB on Linux; CPU seconds (user + system)
    return wall, int(peak) / 1024.0, float(cpu), json.loads(p.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/pipeloom-whatif-bench")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", choices=list(CASES), default=None)
    ap.add_argument("--out", default=None, help="write the markdown table here (else print it)")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    rows = []
    for i, (name, extra) in enumerate(CASES.items()):
        if a.only and name != a.only:
            continue
        path = os.path.join(a.dir, f"case{i}.parquet")
        info = make(path, extra)
        walls, peaks, cpus, loads, d = [], [], [], [], None
        for _ in range(a.runs):
            loads.append(os.getloadavg()[0])
            w, pk, cpu, d = run_once(path)
            walls.append(w)
            peaks.append(pk)
            cpus.append(cpu)
        sw = d["by_worker"]
        top = max(sw, key=lambda x: x["slowdown"])
        rows.append((name, info["ops"], d["ops"], len(d["steps"]), median(walls), median(cpus), max(peaks), median(loads),
                     d["replay"]["error"], info["planted_slowdown"], d["slowdown"],
                     f"dp {top['dp_rank']} / pp {top['stage']}",
                     d["model"]["scenarios"]))
    lines = ["| trace | rows | ops after TP merge | steps | wall s | CPU s | peak RSS MiB | load avg | "
             "replay error (no launch gaps) | "
             "planted | S found | straggler named | replays |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r[0]} | {r[1]:,} | {r[2]:,} | {r[3]} | {r[4]:.1f} | {r[5]:.1f} | {r[6]:.0f} | {r[7]:.1f} | "
                     f"{100 * r[8]:.3f}% | {r[9]:.3f} | {r[10]:.3f} | {r[11]} | {r[12]} |")
    table = "\n".join(lines)
    if a.out:
        with open(a.out) as fh:
            text = fh.read()
        start, end = "<!-- table -->", "<!-- /table -->"
        i, j = text.index(start) + len(start), text.index(end)
        write_text(a.out, text[:i] + "\n" + table + "\n" + text[j:])
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
