"""pipeloom: pipeline-parallel schedules for PyTorch.

The core (schedule, sim, partition, memory.analytic) never imports torch.
"""
from .api import compare, evaluate, make_spec, plan
from .schedule.ir import BW, B, F, Job, Kind, Placement, Schedule, W
from .schedule.registry import PlanSpec, ScheduleError
from .schedule.validate import ValidationError, validate
from .sim.costs import Costs, MemModel, parse_mem_limit
from .sim.simulate import DeadlockError, SimResult, simulate

__version__ = "0.1.0"
__all__ = [
    "B", "BW", "Costs", "DeadlockError", "F", "Job", "Kind", "MemModel", "Placement", "PlanSpec", "Schedule",
    "ScheduleError", "SimResult", "ValidationError", "W", "compare", "evaluate", "make_spec", "parse_mem_limit",
    "plan", "simulate", "validate",
]
