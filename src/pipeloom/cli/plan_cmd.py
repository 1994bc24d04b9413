"""pipeloom plan: build a schedule and save it as CSV or JSON."""
from __future__ import annotations

import dataclasses
import time

from ..schedule.planning import evaluate
from .common import add_planning_options, check_out_path, fmt, plan_inputs, plan_named, print_json
from .config_opts import PLAN_FLAGS, add_config_option
from ..schedule import io as schedule_io


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="build a schedule and write it to a .csv or .json file",
                       description="Build a schedule, validate it and write it out (CSV rows device,step,job "
                                   "or JSON). Without --out the job lists are printed.")
    add_planning_options(p)
    for a in p._actions:  # required unless a --config file gives them (checked in run)
        if a.dest in ("schedule", "pp", "microbatches"):
            a.required = False
    add_config_option(p)
    p.add_argument("--out", "-o", default=None, metavar="FILE.csv|FILE.json", help="where to write the schedule (missing directories are created)")
    p.add_argument("--format", choices=schedule_io.FORMATS, default="pipeloom",
                   help="file format of --out: pipeloom (CSV or JSON by the name) or torch (torch.distributed."
                        "pipelining's compute-only CSV, for _PipelineScheduleRuntime._load_csv and torchtitan's "
                        "--parallelism.pipeline_parallel_schedule_csv; plans with --runtime torch unless told otherwise)")
    p.add_argument("--torchtitan", action="store_true",
                   help="with --format torch and a layer split (--layers or --model): also write torchtitan 0.3's "
                        "config module pipeloom_torchtitan.py and torchtitan_args.txt beside the CSV, so torchtitan "
                        "builds the plan's stages, layer split and placement (docs/torch.md)")
    p.add_argument("--json", action="store_true", help="print the simulate-style JSON summary")
    from .tp_options import add_tp_options
    add_tp_options(p)  # --tp-fuse: the written plan fuses B+W where the split buys nothing under TP costs
    p.set_defaults(func=run, _config_flags=PLAN_FLAGS)


def run(args) -> int:
    import os

    missing = [f for f, v in (("--schedule", args.schedule), ("--pp", args.pp), ("--microbatches", args.microbatches))
               if v is None]
    if missing:
        raise ValueError(f"plan needs {', '.join(missing)} (or a --config FILE whose [schedule] section sets "
                         f"{', '.join(m.lstrip('-').replace('schedule', 'name') for m in missing)})")

    if args.out is not None:  # before planning: the exact solver may take minutes
        check_out_path("--out", args.out, (".csv",) if args.format == "torch" else (".csv", ".json"),
                       " (a torch schedule is a CSV file)" if args.format == "torch" else "")
    elif args.format == "torch":
        raise ValueError("--format torch writes a file: give --out FILE.csv")
    if args.torchtitan and (args.format != "torch" or args.out is None):
        raise ValueError("--torchtitan writes torchtitan's files beside a torch CSV: give --format torch --out FILE.csv")
    spec, pplan = plan_inputs(args, args.schedule)
    if args.torchtitan and pplan is None:
        raise ValueError("--torchtitan needs the plan's layer split: give --layers L (or --model)")
    t0 = time.perf_counter()
    sched = plan_named(args.schedule, spec)
    dt = time.perf_counter() - t0
    # the file remembers what the plan was made for ('simulate --plan' checks it against that limit)
    sched = dataclasses.replace(sched, meta={"builder": args.schedule, "mem_limit": spec.mem_limit, **sched.meta})
    tp = None
    from .tp_options import tp_result, tp_wanted
    if tp_wanted(args):
        sched, tp = tp_result(args, sched, spec)
    titan = job = None
    if args.torchtitan:  # before writing anything: can torchtitan place this plan's stages?
        from ..integrations import torchtitan as tt

        job = tt.TitanJob.from_schedule(sched, pplan.partition.seg_layer_num)
        try:
            tt.settings(job, args.out)
        except tt.TorchtitanUnsupported as e:
            raise ValueError(f"torchtitan cannot run this plan as planned: {e}") from None
    written = []
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        written = schedule_io.save(sched, args.out, args.format)
    if job is not None:
        files, titan = tt.write_files(job, os.path.dirname(os.path.abspath(args.out)), os.path.basename(args.out))
    if args.json:
        res = evaluate(sched, spec)
        res["plan_time_s"] = dt
        res["out"] = args.out
        res["meta"] = sched.meta
        res.update(_bound(sched, spec, res))
        res.update(tp or {})
        if titan is not None:
            res["torchtitan"] = titan
        if pplan is not None:  # which layers each stage holds: the plan's costs are this split's
            res["partition"] = {"how": pplan.how, **pplan.partition.to_dict()}
        print_json(res)
    elif args.out:
        # on stdout, the command's result (stdout and stderr reach a log or a notebook in their own order)
        print(f"wrote {args.out}: {sched.name} pp={sched.pp} vpp={sched.vpp} m={sched.microbatches}, "
              f"{sched.num_jobs} jobs, planned in {fmt(dt, 3)} s"
              + "".join(f" (+ {w}: the name and memory limit torch's CSV has no room for)" for w in written[1:]),
              flush=True)
        if titan is not None:
            for f in files:
                print(f"wrote {f}", flush=True)
            print(f"torchtitan: {titan['command']}", flush=True)
            for n in titan["notes"]:
                print(f"torchtitan note: {n}", flush=True)
        if "status" in sched.meta:  # the exact solver says whether it proved optimality
            print(f"solver: {sched.meta['status']}, makespan {fmt(sched.meta.get('objective'))}, "
                  f"proven lower bound {fmt(sched.meta.get('best_bound'))}", flush=True)
    else:
        print(sched.to_text())
    if pplan is not None and not args.json:  # the plan is for this split of the layers: build the stages so
        print(f"layers per global chunk ({pplan.how}): {pplan.partition.seg_layer_num}", flush=True)
    return 0


def _bound(sched, spec, res: dict, limit: float | None = None) -> dict:
    """``lower_bound``, ``gap`` and ``bound_limit`` of the plan (:func:`pipeloom.schedule.search.bounds.plan_bound`;
    ``limit``: the memory limit to bound under, else the one the plan was made for, else its peak)."""
    from ..schedule.search.bounds import plan_bound

    peak = max(res["peak_memory"]) if res.get("peak_memory") else None
    return plan_bound(sched, spec, res.get("makespan"), peak, limit)
