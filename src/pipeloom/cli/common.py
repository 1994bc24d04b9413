"""Options and output helpers shared by the subcommands."""
from __future__ import annotations

import argparse
import json
import sys

from ..api import make_spec
from ..schedule import registry
from ..schedule.registry import PlanSpec


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def add_plan_options(p: argparse.ArgumentParser, *, schedule: bool = True) -> None:
    """--schedule/--pp/--microbatches/--vpp/--mem-limit/--costs/--mem (shared by simulate, plan, compare)."""
    if schedule:
        p.add_argument("--schedule", "-s", required=True, metavar="NAME",
                       help="schedule builder; one of: " + ", ".join(registry.names()))
    p.add_argument("--pp", type=positive_int, required=True, help="pipeline degree (number of devices)")
    p.add_argument("--microbatches", "-m", type=positive_int, required=True,
                   help="microbatches per step (gradient accumulation steps)")
    p.add_argument("--vpp", type=positive_int, default=None,
                   help="chunks per device (default: 1, or 2 for V-shape schedules)")
    p.add_argument("--mem-limit", default="none", metavar="LIMIT",
                   help="peak activation memory per device: none, 1p (1F1B's peak = pp units), 1.5p, 2p, Xp, "
                        "or a number of units (one unit = one full-stage microbatch activation)")
    p.add_argument("--costs", default="F=1,B=1,W=1,comm=0", metavar="F=..,B=..,W=..,comm=..",
                   help="durations per chunk pass (BW = B+W) and cross-device latency; per-chunk lists as "
                        "F=1:2:1:1 (default: %(default)s)")
    p.add_argument("--mem", default=None, metavar="a=..,b=..",
                   help="activation memory per chunk pass in units: F allocates a (default 1/vpp), "
                        "B frees b (default a/2), W frees a-b")


def spec_from_args(args, schedule: str | None = None) -> PlanSpec:
    vpp = args.vpp
    if vpp is None:
        vpp = registry.default_vpp(schedule) if schedule else 1
    spec = make_spec(pp=args.pp, microbatches=args.microbatches, vpp=vpp, costs=args.costs, mem=args.mem,
                     mem_limit=args.mem_limit, options=getattr(args, "options", None))
    return spec


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=None if isinstance(obj, dict) and len(obj) < 20 else 1)
    sys.stdout.write("\n")


def fmt(x, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)
