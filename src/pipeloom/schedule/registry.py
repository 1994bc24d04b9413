"""Registry of schedule builders (pure functions of a :class:`PlanSpec`)."""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Callable

from ..core.costs import Costs, MemModel
from ..core.errors import ScheduleError
from ..core.ir import Placement, Schedule, device_of
from ..core.limits import check_shape


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
        check_shape(self.pp, self.vpp, self.microbatches)


#: the value kinds a builder option may declare
OPTION_TYPES = ("int", "float", "bool", "choice", "any")


@dataclass(frozen=True, slots=True, kw_only=True)
class Option:
    """One builder option (a key of ``PlanSpec.options``): its type, default, allowed values and help.

    :func:`build` checks every given value against this before the builder runs, so a bad value
    is a one-line :class:`ScheduleError` naming the builder and the option.
    """

    name: str
    """the key in ``PlanSpec.options`` (``-O name=value`` on the command line)"""
    type: str
    """'int' (whole number), 'float', 'bool', 'choice' (one of ``choices``, case-insensitive) or 'any'
    (not checked here: e.g. a list of schedules)"""
    default: object
    """the value the builder uses when the option is absent (None: depends on the shape, see ``help``)"""
    help: str
    """one line: what it does and its unit"""
    min: float | None = None
    """smallest allowed value of an int/float option (None: no lower bound)"""
    min_open: bool = False
    """True: the value must be strictly above ``min``"""
    choices: tuple[str, ...] = ()
    """allowed values of a 'choice' option"""
    max: float | None = None
    """largest allowed value of an int/float option (None: no cap; caps live in :mod:`pipeloom.core.limits`)"""

    def __post_init__(self) -> None:
        if self.type not in OPTION_TYPES:
            raise ValueError(f"option {self.name}: type must be one of {', '.join(OPTION_TYPES)}, got {self.type!r}")
        if self.type == "choice" and not self.choices:
            raise ValueError(f"option {self.name}: a 'choice' option needs choices")

    def describe(self) -> str:
        """``name (type, default ...): help`` for listings."""
        kind = "|".join(self.choices) if self.type == "choice" else self.type
        if self.min is not None:
            kind += f" {'>' if self.min_open else '>='} {self.min:g}"
        return f"{self.name} ({kind}, default {self.default!r}): {self.help}"

    def check(self, value, who: str) -> None:
        """Raise a one-line ScheduleError when ``value`` is not allowed (``who``: the builder's name)."""
        if self.type == "any":
            return
        if self.type == "bool":
            if not isinstance(value, bool):
                raise ScheduleError(f"{who}: option {self.name} must be true or false, got {value!r}")
            return
        if self.type == "choice":
            if str(value).lower() not in self.choices:
                allowed = " or ".join(repr(c) for c in self.choices)
                raise ScheduleError(f"{who}: option {self.name} must be {allowed}, got {value!r}")
            return
        bound = "" if self.min is None else f" {'>' if self.min_open else '>='} {self.min:g}"
        try:
            x = float(value)
            ok = not isinstance(value, bool) and math.isfinite(x)
        except (TypeError, ValueError, OverflowError):
            x, ok = math.nan, False
        if ok and self.type == "int":
            ok = x == int(x)
        if ok and self.min is not None:
            ok = x > self.min if self.min_open else x >= self.min
        if ok and self.max is not None and x > self.max:
            raise ScheduleError(f"{who}: option {self.name} = {value!r} is above the cap of {self.max:g} "
                                f"(caps: docs/robustness.md)")
        if not ok:
            what = "a whole number" if self.type == "int" else "a number"
            raise ScheduleError(f"{who}: option {self.name} must be {what}{bound} ({self.help}), got {value!r}")


#: what ``mem_limit=None`` means for builders that plan without a limit of their own
UNLIMITED = "unlimited"


@dataclass(frozen=True, slots=True)
class BuilderInfo:
    """What the registry knows about a builder without running it."""

    name: str
    fn: Callable[[PlanSpec], Schedule]
    description: str
    vpp: str
    """'1' (one chunk per device), '2' (exactly two), '>=2', 'any'"""
    memory_aware: bool
    """True if the builder honours PlanSpec.mem_limit itself"""
    default_vpp: int | None = None
    """vpp used when the user gives none (None: 1 for '1'/'any' builders, 2 for the others)"""
    options: tuple[Option, ...] = ()
    """the options the builder reads (:func:`build` rejects any other key and checks the values)"""
    placement: Placement | Callable[[int, dict], Placement] = Placement.INTERLEAVED
    """where chunks go at vpp > 1: a placement, or a function of (vpp, options) for builders whose
    placement is an option (at vpp 1 every placement is the same: chunk d on device d)"""
    no_limit: str = UNLIMITED
    """what ``mem_limit=None`` means: 'unlimited', or the limit the builder then plans under"""
    default_limit: Callable[[int], float] | None = None
    """the nominal limit in units for ``pp`` that ``mem_limit=None`` stands for (None: unlimited), raised to
    the smallest feasible limit where it is below (:func:`effective_limit`)"""
    limit_caps: bool = False
    """True: the default limit is the builder's own budget and also caps a given limit (V-Half, V-Min plan
    under ``min(max(default, floor), given)``); False: a given limit replaces the default"""
    shapes: Callable[[int, int, int, dict], str | None] | None = None
    """the shapes the builder plans: ``shapes(pp, vpp, microbatches, options)`` is None for a supported shape,
    else the one-line reason it is not; None: every shape its ``vpp`` rule takes (any pp >= 1, any m >= 1).
    :func:`build` refuses an unsupported shape with that reason; every supported one must build (at no limit
    and at any limit >= the feasibility floor for memory-aware builders: tests/schedule/test_builders_property.py)"""

    @property
    def option_names(self) -> tuple[str, ...]:
        """The keys of ``PlanSpec.options`` the builder reads."""
        return tuple(o.name for o in self.options)

    def option(self, name: str) -> Option:
        """The declaration of option ``name`` (KeyError if the builder has none)."""
        for o in self.options:
            if o.name == name:
                return o
        raise KeyError(name)

    def placement_at(self, vpp: int, options: dict | None = None) -> Placement:
        """The placement this builder uses at ``vpp`` with ``options`` (no schedule is built)."""
        if vpp == 1:
            return Placement.INTERLEAVED
        p = self.placement
        return Placement(p(vpp, dict(options or {}))) if callable(p) else Placement(p)

    def unsupported(self, pp: int, vpp: int, microbatches: int, options: dict | None = None) -> str | None:
        """None when the builder plans this shape (its declared ``vpp`` rule and ``shapes``), else why not."""
        ok = {"1": vpp == 1, "2": vpp == 2, ">=2": vpp >= 2, "any": vpp >= 1}[self.vpp]
        if not ok:
            allowed = {"1": "1", "2": "2", ">=2": "2 or more", "any": "any value >= 1"}[self.vpp]
            return f"schedule {self.name!r} takes vpp {allowed}, got vpp={vpp}"
        return None if self.shapes is None else self.shapes(pp, vpp, microbatches, dict(options or {}))


BUILDERS: dict[str, BuilderInfo] = {}
#: the family modules; importing one registers its builders
FAMILIES = ("classic", "zero_bubble", "v_shape", "dualpipe", "optimal", "zb_looped")


def register(name: str, *, description: str, vpp: str = "1", memory_aware: bool = False,
             default_vpp: int | None = None, options: tuple[Option, ...] = (),
             placement: Placement | Callable[[int, dict], Placement] = Placement.INTERLEAVED,
             no_limit: str = UNLIMITED, default_limit: Callable[[int], float] | None = None,
             limit_caps: bool = False, shapes: Callable[[int, int, int, dict], str | None] | None = None):
    """Decorator: add a builder to :data:`BUILDERS` with its declaration (see :class:`BuilderInfo`)."""
    for o in options:
        if not isinstance(o, Option):
            raise TypeError(f"{name}: options must be Option declarations, got {o!r}")
    if (default_limit is None) != (no_limit == UNLIMITED):
        raise ValueError(f"{name}: give default_limit exactly when mem_limit=None is not unlimited")
    if (default_limit is not None or limit_caps) and not memory_aware:
        raise ValueError(f"{name}: default_limit and limit_caps are for memory-aware builders")
    if limit_caps and default_limit is None:
        raise ValueError(f"{name}: limit_caps needs a default_limit (the budget that caps a given limit)")

    def deco(fn: Callable[[PlanSpec], Schedule]):
        info = BuilderInfo(name, fn, description, vpp, memory_aware, default_vpp, tuple(options), placement,
                           no_limit, default_limit, limit_caps, shapes)
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
    """Every registered builder name, sorted."""
    _load_all()
    return sorted(BUILDERS)


def get(name: str) -> BuilderInfo:
    """The declaration of builder ``name`` (a one-line ScheduleError listing the names if unknown)."""
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
    """Raise if the builder does not take ``vpp`` chunks per device."""
    ok = {"1": vpp == 1, "2": vpp == 2, ">=2": vpp >= 2, "any": vpp >= 1}[info.vpp]
    if not ok:
        allowed = {"1": "1", "2": "2", ">=2": "2 or more", "any": "any value >= 1"}[info.vpp]
        raise ScheduleError(f"schedule {info.name!r} takes vpp {allowed}, got vpp={vpp}")


# ---------------------------------------------------------------------- the memory limit a builder plans under
def min_feasible_limit(pp: int, vpp: int, placement: Placement | str, mem: MemModel | None = None) -> float:
    """THE feasibility floor (units): the smallest memory limit any valid schedule meets, ``max_d sum_{c on d} a_c``.

    Every schedule needs it (a microbatch's B on chunk c needs its F on every later chunk, so right after a
    device runs that microbatch's forward of its last local chunk, the microbatch holds ``a`` on every chunk
    of the device at once) and the one-microbatch-at-a-time schedule reaches it."""
    nc = pp * vpp
    a, _ = (mem or MemModel()).per_chunk(nc, vpp)
    per = [0.0] * pp
    for c in range(nc):
        per[device_of(c, pp, placement)] += a[c]
    return max(per)


def _units(x: float, pp: int) -> str:
    return f"{x:g} units ({x / pp:.3g}p)"


def infeasible_limit(name: str, pp: int, vpp: int, limit: float, floor: float) -> ScheduleError:
    """THE one-line error of a limit below the floor (every memory-aware builder raises this one)."""
    return ScheduleError(
        f"memory limit {_units(limit, pp)} is infeasible for {name} pp={pp} vpp={vpp}: the smallest feasible "
        f"limit is {_units(floor, pp)}, every schedule needs at least {floor:g} units on some device (one "
        f"microbatch's activations on all {vpp} chunk{'s' if vpp > 1 else ''} of a device at once); use "
        f"--mem-limit {floor:g} or more")


def effective_limit(builder: "str | BuilderInfo", spec: PlanSpec, *, floor: float | None = None) -> float | None:
    """The memory limit (units) builder ``builder`` plans ``spec`` under, from its declaration alone: None
    when it plans without one (not memory-aware, or ``default_limit`` None and no limit given); a given
    ``spec.mem_limit``; or ``default_limit(pp)`` raised to the feasibility floor, which with ``limit_caps``
    also caps a given limit. A limit below the floor (:func:`min_feasible_limit`; ``floor`` when the caller
    has it) is :func:`infeasible_limit`. Builders and the tuner both call this: no builder codes its default."""
    info = builder if isinstance(builder, BuilderInfo) else get(builder)
    if not info.memory_aware:
        return None
    given = spec.mem_limit
    if info.default_limit is None and given is None:
        return None
    if floor is None:
        floor = min_feasible_limit(spec.pp, spec.vpp, info.placement_at(spec.vpp, spec.options), spec.mem)
    if info.default_limit is None:
        limit = given
    else:
        nominal = max(float(info.default_limit(spec.pp)), floor)
        limit = nominal if given is None else (min(nominal, given) if info.limit_caps else given)
    if limit < floor - 1e-9:
        raise infeasible_limit(info.name, spec.pp, spec.vpp, limit, floor)
    return limit


def check_options(info: BuilderInfo, options: dict) -> None:
    """Reject option keys the builder does not read (a typo would otherwise be ignored silently) and
    values outside the declarations."""
    unknown = set(options) - set(info.option_names)
    if unknown:
        allowed = ", ".join(sorted(info.option_names)) if info.options else "none (this schedule takes no options)"
        raise ScheduleError(f"{info.name}: unknown option(s) {', '.join(sorted(unknown))}; allowed: {allowed}")
    for o in info.options:
        if o.name in options:
            o.check(options[o.name], info.name)


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


#: planning effort of the search-based builders (zbv, vhalf, vmin, zbvpp): 'fast' (the default) skips the
#: CP-SAT polish and the extra local searches so a plan takes well under 1 s up to pp 16, m 64; 'high' runs
#: them (seconds to about a minute on shapes of up to 400 jobs). Explicit budget options win over it.
EFFORT_OPTION = Option(name="effort", type="choice", choices=("fast", "high"), default="fast",
                       help="planning effort: 'fast' (< 1 s up to pp 16, m 64; no CP-SAT polish) or 'high' (the "
                            "CP-SAT polish and local searches on shapes of at most 400 jobs); explicit polish/budget "
                            "options win")


def effort_option(spec: PlanSpec) -> str:
    """``spec.options['effort']`` lower-cased ('fast' when absent); checked by :func:`check_options`."""
    return str(spec.options.get("effort", "fast")).lower()


def build(name: str, spec: PlanSpec) -> Schedule:
    """Build and return the schedule (not yet validated; see :func:`pipeloom.plan`). A shape the builder does
    not declare (:meth:`BuilderInfo.unsupported`) is refused here, before the builder runs."""
    info = get(name)
    check_vpp(info, spec.vpp)
    check_options(info, spec.options)
    why = info.unsupported(spec.pp, spec.vpp, spec.microbatches, spec.options)
    if why:
        raise ScheduleError(why)
    return info.fn(spec)
