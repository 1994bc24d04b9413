"""Registry of schedule builders (pure functions of a :class:`PlanSpec`)."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

from ..core.costs import Costs, MemModel
from ..core.errors import ScheduleError
from ..core.ir import Schedule


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanSpec:
    """Everything a builder may use. Builders ignore what they do not need."""

    pp: int
    """pipeline degree (devices)"""
    microbatches: int
    """microbatches per step (gradient accumulation)"""
    vpp: int = 1
    """chunks per device"""
    costs: Costs = field(default_factory=Costs)
    """per chunk-pass durations and comm latency"""
    mem: MemModel = field(default_factory=MemModel)
    """per chunk-pass activation memory"""
    mem_limit: float | None = None
    """peak memory limit per device in units (1p = pp); None = unlimited"""
    options: dict = field(default_factory=dict)
    """builder-specific options"""

    def __post_init__(self) -> None:
        for name in ("pp", "microbatches", "vpp"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ScheduleError(f"{name} must be an integer >= 1, got {v!r}")


@dataclass(frozen=True, slots=True)
class BuilderInfo:
    name: str
    fn: Callable[[PlanSpec], Schedule]
    description: str
    vpp: str
    """'1' (one chunk per device), '2' (exactly two), '>=2', 'any'"""
    memory_aware: bool
    """True if the builder honours PlanSpec.mem_limit itself"""
    default_vpp: int | None = None
    """vpp used when the user gives none (None: 1 for '1'/'any' builders, 2 for the others)"""
    options: tuple[str, ...] = ()
    """the keys of PlanSpec.options the builder reads; :func:`build` rejects any other"""


BUILDERS: dict[str, BuilderInfo] = {}
#: the family modules; importing one registers its builders
FAMILIES = ("classic", "zero_bubble", "v_shape", "dualpipe", "optimal")


def register(name: str, *, description: str, vpp: str = "1", memory_aware: bool = False,
             default_vpp: int | None = None, options: tuple[str, ...] = ()):
    def deco(fn: Callable[[PlanSpec], Schedule]):
        info = BuilderInfo(name, fn, description, vpp, memory_aware, default_vpp, tuple(options))
        if default_vpp is not None:
            check_vpp(info, default_vpp)
        BUILDERS[name] = info
        return fn
    return deco


def _load_all() -> None:
    # importing the family modules registers their builders
    for mod in FAMILIES:
        importlib.import_module(f"{__package__}.{mod}")


def names() -> list[str]:
    _load_all()
    return sorted(BUILDERS)


def get(name: str) -> BuilderInfo:
    _load_all()
    try:
        return BUILDERS[name]
    except KeyError:
        raise ScheduleError(f"unknown schedule {name!r}; choose one of: {', '.join(sorted(BUILDERS))}") from None


def default_vpp(name: str) -> int:
    """The vpp a schedule is built with when the user gives none: the builder's own default
    (interleaved: 2, else it would be plain 1F1B), else 1 for single-chunk builders, 2 for V-shapes."""
    info = get(name)
    if info.default_vpp is not None:
        return info.default_vpp
    return 1 if info.vpp in ("1", "any") else 2


def check_vpp(info: BuilderInfo, vpp: int) -> None:
    ok = {"1": vpp == 1, "2": vpp == 2, ">=2": vpp >= 2, "any": vpp >= 1}[info.vpp]
    if not ok:
        allowed = {"1": "1", "2": "2", ">=2": "2 or more", "any": "any value >= 1"}[info.vpp]
        raise ScheduleError(f"schedule {info.name!r} takes vpp {allowed}, got vpp={vpp}")


def check_options(info: BuilderInfo, options: dict) -> None:
    """Reject option keys the builder does not read (a typo would otherwise be ignored silently)."""
    unknown = set(options) - set(info.options)
    if unknown:
        allowed = ", ".join(sorted(info.options)) if info.options else "none (this schedule takes no options)"
        raise ScheduleError(f"{info.name}: unknown option(s) {', '.join(sorted(unknown))}; allowed: {allowed}")


def int_option(options: dict, key: str, default: int, *, what: str = "job placements", who: str = "") -> int:
    """``options[key]`` as a whole number >= 0 (``default`` when absent), else a ScheduleError naming it
    (prefixed with ``who``, the builder's name, when given)."""
    v = options.get(key, default)
    try:
        n = int(v)
        whole = not isinstance(v, bool) and n == float(v)
    except (TypeError, ValueError, OverflowError):
        n, whole = -1, False
    if n < 0 or not whole:
        raise ScheduleError(f"{who + ': ' if who else ''}option {key} must be a whole number >= 0 ({what}), got {v!r}")
    return n


def build(name: str, spec: PlanSpec) -> Schedule:
    """Build and return the schedule (not yet validated; see :func:`pipeloom.plan`)."""
    info = get(name)
    check_vpp(info, spec.vpp)
    check_options(info, spec.options)
    return info.fn(spec)
