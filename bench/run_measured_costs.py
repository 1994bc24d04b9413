"""Step time of ``pipeloom run`` planned with unit costs vs with measured costs (CPU, gloo, llama-tiny).

For every case: plan the schedule once with unit costs and once with measured costs (one
calibration run: a warm-up and ``--calibrate-steps`` logged steps of the unit plan, per-chunk
F/B/W and comm fitted by :func:`pipeloom.trace.check.fit_chunk_costs`, planned again), then time
both plans ALTERNATING, ``--repeats`` runs each of ``--steps`` steps (each run reports the median
step time of its slowest rank, first step left out), and report the median over the repeats.
Both plans run the same model, weights and data; only the job order differs.

    python bench/run_measured_costs.py [--repeats 3] [--steps 6] [--out docs/bench/run_measured_costs.md]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time

from _harness import median, round_orders, write_text
from pipeloom.runtime.driver import RunConfig, calibrate, prepare, run

# (label, schedule, pp, microbatches, decoder layers): 6 layers on 4 chunks split 2,2,1,1, so the
# chunks differ even before the embedding (chunk 0) and the head (last chunk)
CASES = [("zbv, 8 layers (even split)", "zbv", 2, 8, 8),
         ("zbv, 6 layers (2,2,1,1)", "zbv", 2, 8, 6),
         ("zbv, 8 layers, m=4", "zbv", 2, 4, 8)]


def _fmt_costs(c) -> str:
    f = lambda v: ":".join(f"{x:.2f}" for x in v) if isinstance(v, (list, tuple)) else f"{v:.2f}"  # noqa: E731
    return f"F={f(c.F)} B={f(c.B)} W={f(c.W)} comm={c.comm:.2f}"


def bench_case(label, schedule, pp, m, layers, *, repeats: int, steps: int, calibrate_steps: int) -> dict:
    base = RunConfig(schedule=schedule, pp=pp, microbatches=m, steps=steps, n_layers=layers,
                     calibrate_steps=calibrate_steps)
    unit = prepare(base)
    t0 = time.perf_counter()
    measured = calibrate(prepare(dataclasses.replace(base, measure_costs=True)))
    calib_s = time.perf_counter() - t0
    same = unit.schedule.devices == measured.schedule.devices
    cfgs = {"unit": unit, "measured": measured}
    times = {name: [] for name in cfgs}
    for order in round_orders(list(cfgs), repeats):  # alternating; a run reports its own step time
        for name in order:
            times[name].append(run(cfgs[name])["step_time_s"])
    med = {k: median(v) for k, v in times.items()}
    return {"case": label, "pp": pp, "m": m, "layers": layers, "unit_s": med["unit"], "measured_s": med["measured"],
            "speedup": med["unit"] / med["measured"], "same_order": same, "costs": _fmt_costs(measured.planned_costs),
            "calibrate_s": calib_s, "runs": times}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--calibrate-steps", type=int, default=3)
    ap.add_argument("--out", default="docs/bench/run_measured_costs.md")
    a = ap.parse_args(argv)
    rows = []
    for case in CASES:
        r = bench_case(*case, repeats=a.repeats, steps=a.steps, calibrate_steps=a.calibrate_steps)
        print(f"{r['case']}: unit {r['unit_s'] * 1e3:.1f} ms, measured {r['measured_s'] * 1e3:.1f} ms "
              f"(x{r['speedup']:.3f}), same order: {r['same_order']}, costs {r['costs']}", file=sys.stderr)
        rows.append(r)
    cmd = "python bench/run_measured_costs.py " + " ".join(argv if argv is not None else sys.argv[1:])
    table = ["| case | pp | m | unit costs: step (ms) | measured costs: step (ms) | unit / measured | same job order | "
             "measured costs (ms per chunk) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['case']} | {r['pp']} | {r['m']} | {r['unit_s'] * 1e3:.1f} | {r['measured_s'] * 1e3:.1f} | "
                     f"{r['speedup']:.3f} | {'yes' if r['same_order'] else 'no'} | {r['costs']} |")
    body = "\n".join(table)
    write_text(a.out, TEMPLATE.format(cmd=cmd.strip(), table=body, cpus=os.cpu_count(), py=platform.python_version(),
                                      date=time.strftime("%Y-%m-%d", time.gmtime()), repeats=a.repeats,
                                      steps=a.steps))
    print(body)
    return 0


TEMPLATE = """# `pipeloom run --costs measured`: step time with unit vs measured costs

Produced by

    {cmd}

on {date} ({cpus} CPU cores shared with other work, Python {py}, CPU + gloo on 127.0.0.1, the
`llama-tiny` example: dim 64, vocabulary 256, sequence 16, 2 sequences per microbatch). Each plan ran
{repeats} times alternately, {steps} steps per run; a run's step time is the median over its steps
(first step left out) of the slowest rank; the table gives the median over the runs.

{table}

"same job order": whether planning with the measured costs gave the very same schedule as unit
costs (then any time difference is noise).

## When measured costs pay

- **Cost-aware builders only.** `zbv`, `vhalf`, `vmin`, `zbh1`, `zbh2` and `optimal` place jobs by
  their durations; `1f1b`, `interleaved`, `fthenb`, `eager1f1b` and `dualpipev` have fixed orders,
  for them `--costs measured` only costs a calibration run.
- **Heterogeneous chunks.** Unit costs assume every chunk's F, B and W are equal. Real chunks are
  not: the first carries the embedding, the last the head (norm, vocabulary projection, loss),
  whose cost grows with vocabulary / hidden size (for a 128k vocabulary and hidden 4096 the head
  costs several layers), and uneven layer counts (layers not divisible by pp x vpp) make some
  chunks a layer longer. B/W ratios differ from 1:1 too (W is cheap in this small model, see the
  measured costs). The greedy planners then fill a device's idle time with the jobs that really
  fit, and the memory-limited ones (zbh1, vhalf, vmin) choose where to hold activations by the
  true lengths.
- **Comm latency.** A measured comm > 0 makes the V-shape planners keep more forwards in flight
  between devices; unit costs plan as if transfers were free.
- **When it does not pay.** Tiny models on CPU, as here: step times are a few ms per job and the
  noise between runs (shared cores) is of the same order as the difference between two good
  orders, so the two plans often tie. With the same order (column above) the calibration is pure
  overhead (one extra short run). Measured costs also describe one machine and one batch shape:
  re-measure after changing the sequence length, microbatch size or hardware.
"""

if __name__ == "__main__":
    sys.exit(main())
