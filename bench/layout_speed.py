"""Planning, simulating and validating a 200k-job schedule in one process (the layout move's speed check).

    python bench/layout_speed.py plan   # build + validate zbv pp 64, m 512, vpp 2 at 1p (196 608 jobs)
    python bench/layout_speed.py sim    # the same plan, then the event simulation and the job-by-job validator

The comparison with another checkout runs the same script under two PYTHONPATHs, alternating, with
farm-bench (see docs/bench/plan_speed.md). Uses only the names every version exports at the package top
(make_spec, plan, simulate, validate, Schedule), so it runs against older trees unchanged.
"""
import sys
import time

import pipeloom as pl


def main(what: str) -> None:
    spec = pl.make_spec(pp=64, microbatches=512, vpp=2, mem_limit="1p")
    t = time.perf_counter()
    s = pl.plan("zbv", spec)
    print(f"plan {time.perf_counter() - t:.3f} s")
    if what == "sim":
        t = time.perf_counter()
        r = pl.simulate(s, spec.costs, spec.mem)
        print(f"simulate {time.perf_counter() - t:.3f} s (makespan {r.makespan:g}, {s.num_jobs} jobs)")
        plain = pl.Schedule(s.name, s.pp, s.vpp, s.microbatches, s.placement, s.devices)  # no witness: job by job
        t = time.perf_counter()
        v = pl.validate(plain, mem=spec.mem, mem_limit=spec.mem_limit)
        print(f"validate {time.perf_counter() - t:.3f} s ({len(v)} violations)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sim")
