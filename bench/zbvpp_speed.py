"""Planning time of ``zbvpp`` with its default budgets: pp 2-16, m pp..64, vpp 2 and 4, both memory models.

    python bench/zbvpp_speed.py

Prints the median and largest CPU time (``time.process_time``: the planning process's own work, which a
shared machine inflates far less than the wall clock) and wall time over all shapes, and the slowest six.
Imports (ortools included) are done before the timing.
"""
from __future__ import annotations

import importlib
import time

from _harness import median

from pipeloom.core.costs import Costs, MemModel, runtime_mem_model
from pipeloom.schedule.planning import make_spec, plan


def main() -> None:
    for mod in ("pipeloom.schedule.search.bounds", "pipeloom.schedule.search.polish"):
        importlib.import_module(mod)  # loaded (ortools too) before the timing

    plan("zbvpp", make_spec(pp=2, microbatches=2, vpp=2, costs=Costs(F=1, B=1.5, W=0.7, comm=0.2)))
    rows = []
    for pp in (2, 4, 8, 16):
        for m in sorted({pp, 2 * pp, 4 * pp, 64}):
            for vpp in (2, 4):
                for cs in ("F=1,B=1,W=1", "F=1,B=1.5,W=0.7,comm=0.2"):
                    for mname, mem in (("pipeloom", MemModel()), ("torch", runtime_mem_model("torch"))):
                        spec = make_spec(pp=pp, microbatches=m, vpp=vpp, costs=Costs.parse(cs), mem=mem)
                        t, c = time.perf_counter(), time.process_time()
                        plan("zbvpp", spec)
                        rows.append((time.process_time() - c, time.perf_counter() - t, pp, m, vpp, cs, mname))
    cpu = sorted(r[0] for r in rows)
    wall = sorted(r[1] for r in rows)
    print(f"{len(rows)} shapes: CPU s median {median(cpu):.2f}, max {cpu[-1]:.2f}; "
          f"wall s median {median(wall):.2f}, max {wall[-1]:.2f}")
    for r in sorted(rows)[-6:]:
        print(f"  cpu {r[0]:.2f} wall {r[1]:.2f}  pp {r[2]} m {r[3]} vpp {r[4]} costs {r[5]} memory {r[6]}")


if __name__ == "__main__":
    main()
