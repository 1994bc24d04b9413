"""`make demo`: the main job on a built-in example, end to end.

1. compare every schedule for pp=4, m=8 at the 1F1B memory limit (table);
2. plan ZB-V at the 1F1B memory limit and draw it (Gantt PNG/SVG/HTML, Chrome/Perfetto trace);
3. estimate per-device memory of Llama-2 7B under that plan, and of a published MoE architecture
   (Qwen3-30B-A3B) from its Hugging Face config.json shipped with pipeloom;
4. run the built-in tiny Llama for real on 4 CPU ranks (gloo), verify against a single process, and turn
   the per-rank logs into a measured trace, Gantt and bubble check.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from rich.console import Console

from . import cli
from .core.costs import Costs
from .core.files import write_text
from .schedule import io as schedule_io
from .schedule.planning import make_spec, plan
from .sim.simulate import simulate
from .viz import render_plan

console = Console()

PP, M = 4, 8
STAGE_COSTS = "F=2,B=2,W=2,comm=0.1"  # per full-stage pass (compare splits it over each schedule's chunks)
COSTS = "F=1,B=1,W=1,comm=0.1"  # the same network per chunk pass at vpp=2


def _step(title: str) -> None:
    console.rule(f"[bold]{title}")


def compare_step() -> None:
    _step(f"1. every schedule at pp={PP}, m={M}, memory limit 1p (1F1B's peak)")
    cli.main(["compare", "--pp", str(PP), "--microbatches", str(M), "--costs", STAGE_COSTS, "--mem-limit", "1p"])


def plan_step(out: Path) -> list[str]:
    _step("2. plan ZB-V (vpp=2) at the 1F1B memory limit and draw it")
    spec = make_spec(pp=PP, microbatches=M, vpp=2, costs=COSTS, mem_limit="1p")
    sched = plan("zbv", spec)
    schedule_io.save(sched, str(out / "zbv_plan.csv"))
    res = simulate(sched, Costs.parse(COSTS), spec.mem)
    console.print(f"zbv: makespan {res.makespan:g}, bubble {res.bubble:.3f}, stage bubble {res.stage_bubble:.3f}, "
                  f"peak memory {[round(x, 2) for x in res.peak_memory]} (limit {spec.mem_limit:g})")
    paths = [str(out / "zbv_plan.csv")] + list(render_plan(res, str(out / "plan")))
    return paths


def memory_step() -> None:
    _step("3. per-device memory of Llama-2 7B under ZB-V, pp=4, on 80 GiB GPUs")
    cli.main(["memory", "--model", "llama2-7b", "--pp", str(PP), "--vpp", "2", "--microbatches", str(M),
          "--schedule", "zbv", "--gpu-memory", "80GiB"])
    from .models.hf_config import CONFIG_DIR

    config = CONFIG_DIR / "Qwen3-30B-A3B.json"
    console.print(f"\n[bold]Your own model:[/bold] --model takes a Hugging Face config.json; here {config.name} "
                  f"(shipped with pipeloom, {config.stat().st_size} bytes, no weights): 128 experts, top-8, "
                  f"ZeRO-1 over dp=8, 4096-token sequences, 141 GB GPUs")
    cli.main(["memory", "--model", str(config), "--pp", str(PP), "--vpp", "2", "--microbatches", str(M),
              "--schedule", "zbv", "--seq", "4096", "--dp", "8", "--zero", "1", "--gpu-memory", "141GB"])


def run_step(out: Path) -> list[str]:
    _step("4. run the tiny Llama on 4 CPU ranks (gloo) with ZB-V, verify against one process, check bubbles")
    logs = out / "logs"
    rc = cli.main(["run", "--example", "llama-tiny", "--schedule", "zbv", "--pp", str(PP), "--microbatches", str(M),
               "--steps", "4", "--profile-steps", "1:4", "--verify", "--log-dir", str(logs),
               # wide enough that compute, not process scheduling, dominates each job on a CPU
               "--dim", "256", "--seq-len", "64", "--microbatch-size", "2"])
    if rc:
        raise SystemExit(rc)
    trace = out / "measured_trace.json"
    png = out / "measured_gantt.png"
    cli.main(["trace", str(logs), "--out", str(trace), "--png", str(png)])
    cli.main(["check", str(logs)])
    return [str(trace), str(png), str(logs)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeloom.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="demo_out", help="output folder (default: %(default)s)")
    ap.add_argument("--skip-run", action="store_true", help="skip step 4 (the real multi-process run)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    written: list[str] = []
    compare_step()
    written += plan_step(out)
    memory_step()
    if not args.skip_run:
        written += run_step(out)
    _step(f"done in {time.perf_counter() - t0:.1f} s; outputs")
    for p in written:
        console.print(f"  {os.path.abspath(p)}")
    console.print("Open the .html files in a browser; load the trace .json files in https://ui.perfetto.dev "
                  "or chrome://tracing.")
    write_text(out / "outputs.json", json.dumps(written, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
