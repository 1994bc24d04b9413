"""Sensitivity of the bubble check: how small a slowdown it finds, how often it cries wolf (no torch).

``python -m pipeloom.trace.sweep`` writes synthetic logs (:mod:`pipeloom.trace.synth`) for several
schedules, seeds and injected slowdowns of one rank, runs :func:`pipeloom.trace.check.check_run`
and prints, per slowdown, the share of runs whose straggler list is exactly the slow rank
(slowdown > 1) or empty (slowdown = 1, the false-alarm check), with the default thresholds.
"""
from __future__ import annotations

import argparse
import tempfile
import time

from ..schedule.planning import make_spec, plan
from ..schedule import registry
from .check import check_run
from .reader import read_logs
from .synth import SynthConfig, write_logs

SCHEDULES = (("1f1b", 1), ("interleaved", 2), ("zbv", 2))


def sweep(factors=(1.0, 1.05, 1.1, 1.2, 1.5), *, pp: int = 4, m: int = 8, seeds: int = 5, jitter: float = 0.02,
          schedules=SCHEDULES) -> list[dict]:
    rows = []
    for f in factors:
        hits = runs = 0
        t = time.perf_counter()
        for name, vpp in schedules:
            if name not in registry.names():
                continue
            spec = make_spec(pp=pp, microbatches=m, vpp=vpp, costs="F=1,B=1,W=1,comm=0.1")
            sched = plan(name, spec)
            for seed in range(seeds):
                slow_rank = seed % pp
                with tempfile.TemporaryDirectory() as d:
                    cfg = SynthConfig(costs=spec.costs, jitter=jitter, seed=seed,
                                      slow={slow_rank: f} if f != 1.0 else {})
                    write_logs(d, sched, cfg)
                    rep = check_run(read_logs(d))
                want = [slow_rank] if f != 1.0 else []
                hits += rep.stragglers == want
                runs += 1
        rows.append({"slowdown": f, "runs": runs, "correct": hits, "rate": hits / runs if runs else 0.0,
                     "seconds": time.perf_counter() - t})
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--jitter", type=float, default=0.02)
    p.add_argument("--pp", type=int, default=4)
    p.add_argument("-m", type=int, default=8)
    a = p.parse_args(argv)
    rows = sweep(pp=a.pp, m=a.m, seeds=a.seeds, jitter=a.jitter)
    print(f"pp={a.pp} m={a.m}, job-time jitter {100 * a.jitter:g}% (1 sigma), schedules "
          f"{', '.join(n for n, _ in SCHEDULES)}, {a.seeds} seeds each")
    print("| slow rank's job time | runs | straggler list correct | rate |")
    print("|---|---|---|---|")
    for r in rows:
        what = "1.00x (clean run: expect none)" if r["slowdown"] == 1.0 else f"{r['slowdown']:.2f}x"
        print(f"| {what} | {r['runs']} | {r['correct']} | {100 * r['rate']:.0f}% |")


if __name__ == "__main__":
    main()
