"""The library's front door: the few calls a user (and the CLI) starts from (no torch).

A thin facade over the packages that do the work; nothing inside :mod:`pipeloom` imports it.
"""
from __future__ import annotations

from .core.costs import Costs, MemModel, parse_mem_limit
from .core.errors import DeadlockError, ScheduleError, ScheduleFormatError, ValidationError, Violation
from .core.ir import BW, B, F, Job, Kind, Placement, Schedule, W
from .schedule.io import load, save
from .schedule.planning import compare, evaluate, make_spec, plan
from .schedule.registry import PlanSpec
from .schedule.validate import validate
from .sim.simulate import SimResult, simulate

__all__ = [
    "B", "BW", "Costs", "DeadlockError", "F", "Job", "Kind", "MemModel", "Placement", "PlanSpec", "Schedule",
    "ScheduleError", "ScheduleFormatError", "SimResult", "ValidationError", "Violation", "W", "compare",
    "evaluate", "load", "make_spec", "parse_mem_limit", "plan", "save", "simulate", "validate",
]
