"""pipeloom convert: a schedule file from one format into another (pipeloom CSV/JSON <-> torch's CSV)."""
from __future__ import annotations


from ..schedule import io as schedule_io
from ..schedule.validate import summary, validate
from .common import check_out_path


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help="convert a schedule file between pipeloom's and torch's formats",
                       description="Read a schedule in any format pipeloom knows (pipeloom JSON or CSV, torch's "
                                   "compute-only or compute+comms CSV; told apart by content), check it, and write it "
                                   "in the format --to names. To torch, microbatches are renumbered so that the last "
                                   "stage forwards 0, 1, 2, ... (torch looks the losses up by that order).")
    p.add_argument("input", metavar="IN", help="schedule file (.json or .csv, pipeloom's or torch's)")
    p.add_argument("output", metavar="OUT", help="file to write (.csv for torch; .csv or .json for pipeloom)")
    p.add_argument("--to", choices=schedule_io.FORMATS, required=True,
                   help="format of OUT: torch (torch.distributed.pipelining's compute-only CSV) or pipeloom")
    p.set_defaults(func=run)


def run(args) -> int:
    check_out_path("OUT", args.output, (".csv",) if args.to == "torch" else (".csv", ".json"),
                   " (a torch schedule is a CSV file)" if args.to == "torch" else "")
    sched = schedule_io.load(args.input)
    problems = validate(sched)
    if problems:
        raise ValueError(f"{args.input}: the schedule is invalid, not converted: {summary(problems)}")
    written = schedule_io.save(sched, args.output, args.to)
    lim = sched.meta.get("mem_limit", "unknown")
    print(f"wrote {args.output} ({args.to}): {sched.name} pp={sched.pp} vpp={sched.vpp} m={sched.microbatches}, "
          f"{sched.placement.value} placement, {sched.num_jobs} jobs, planned for memory limit "
          f"{'none' if lim is None else lim if isinstance(lim, str) else f'{lim:g}'}"
          + "".join(f" (+ {w}: the name and memory limit torch's CSV has no room for)" for w in written[1:]),
          flush=True)
    return 0
