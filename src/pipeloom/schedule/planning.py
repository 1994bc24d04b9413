"""Plan, evaluate and compare schedules: a builder from the registry, then the validator and the
simulator (no torch). :mod:`pipeloom.api` re-exports these for users; nothing inside the library goes
through that facade.
"""
from __future__ import annotations

from dataclasses import replace

from ..core.costs import Costs, MemLimit, MemModel
from ..core import progress
from ..core.errors import ScheduleError
from ..core.limits import check_shape
from ..core.ir import Schedule
from ..sim.simulate import simulate
from . import registry
from .registry import PlanSpec
from .validate import summary, validate


def make_spec(*, pp: int, microbatches: int, vpp: int = 1, costs: Costs | str | None = None,
              mem: MemModel | str | None = None, mem_limit: MemLimit | str | float | None = None,
              options: dict | None = None) -> PlanSpec:
    """Parse loose inputs (strings from a CLI or config) into a :class:`PlanSpec`. ``mem_limit``: a
    :class:`~pipeloom.core.costs.MemLimit` or its text (``none``, units, ``Xp``; a size in bytes needs a model:
    :func:`pipeloom.memory.budget.limit_units`)."""
    if not isinstance(pp, int) or pp < 1:
        raise ScheduleError(f"pp must be an integer >= 1, got {pp!r}")
    if isinstance(vpp, int) and isinstance(microbatches, int):  # before anything is sized by them
        check_shape(pp, vpp, microbatches)
    costs = costs if isinstance(costs, Costs) else Costs.parse(costs)
    mem = mem if isinstance(mem, MemModel) else MemModel.parse(mem)
    limit = MemLimit.parse(mem_limit, what="memory limit", bytes_ok=False).units(pp)
    if limit is not None and isinstance(vpp, int) and vpp >= 1:
        a, _ = mem.per_chunk(pp * vpp, vpp)
        if limit < max(a) - 1e-12:
            raise ScheduleError(
                f"memory limit {limit:g} units is below one chunk's activation ({max(a):g} units), which every "
                f"schedule holds at least once; no schedule can meet it (smallest conceivable limit: {max(a):g})")
    return PlanSpec(pp=pp, vpp=vpp, microbatches=microbatches, costs=costs, mem=mem, mem_limit=limit,
                    options=dict(options or {}))


def plan(name: str, spec: PlanSpec, *, check: bool = True) -> Schedule:
    """Build schedule ``name`` for ``spec``; with ``check`` raise if it is invalid or over the limit."""
    progress.report(f"planning {name}: pp={spec.pp} vpp={spec.vpp} m={spec.microbatches} "
                    f"({spec.pp * spec.vpp * spec.microbatches:,} forward jobs)")
    sched = registry.build(name, spec)
    if check:
        progress.report(f"validating {name} ({sched.num_jobs:,} jobs)")
        v = validate(sched, mem=spec.mem, mem_limit=spec.mem_limit)
        if v and all(x.kind == "memory" for x in v):
            aware = [n for n in registry.names() if registry.get(n).memory_aware]
            raise ScheduleError(
                f"schedule {name!r} needs more memory than the limit {spec.mem_limit:g} units: {v[0]}; "
                f"memory-aware schedules that honour a limit: {', '.join(aware) or 'none registered'}")
        if v:
            raise ScheduleError(f"schedule {name!r} for pp={spec.pp} vpp={spec.vpp} m={spec.microbatches} "
                                f"is invalid: {summary(v)}")
    return sched


def evaluate(sched: Schedule, spec: PlanSpec) -> dict:
    """The public JSON contract of ``pipeloom simulate --json``."""
    progress.report(f"validating and simulating {sched.name} ({sched.num_jobs:,} jobs)")
    violations = validate(sched, mem=spec.mem, mem_limit=spec.mem_limit)
    out = {
        "schedule": sched.name,
        "pp": sched.pp,
        "vpp": sched.vpp,
        "microbatches": sched.microbatches,
        "makespan": None,
        "bubble": None,
        "stage_bubble": None,
        "peak_memory": None,
        "memory_limit": spec.mem_limit,
        "valid": not violations,
        "violations": violations,
    }
    if not any(v.kind == "deadlock" or v.structural for v in violations):
        r = simulate(sched, spec.costs, spec.mem)
        out.update(makespan=r.makespan, bubble=r.bubble, stage_bubble=r.stage_bubble, peak_memory=r.peak_memory)
    return out



def compare(spec: PlanSpec, names: list[str] | None = None) -> list[dict]:
    """Plan and simulate every schedule that accepts ``spec``'s vpp, sorted by makespan.

    Rows for schedules that do not apply carry ``error`` instead of metrics. Each builder gets the
    options of ``spec.options`` it reads (e.g. ``time_limit`` only ``optimal``); an option that
    none of them reads is an error.
    """
    rows = []
    infos = [registry.get(name) for name in names or registry.names()]
    unread = set(spec.options) - {k for info in infos for k in info.option_names}
    if unread:
        elsewhere = sorted(n for n in registry.names() if set(registry.get(n).option_names) & unread)
        readers = ", ".join(f"{i.name} ({', '.join(i.option_names)})" for i in infos if i.options) or "none"
        raise ScheduleError(f"option(s) {', '.join(sorted(unread))} are read by none of the compared schedules"
                            + (f" (only by {', '.join(elsewhere)}, not compared here)" if elsewhere else "")
                            + f"; their options: {readers}")
    for info in infos:
        name = info.name
        try:
            registry.check_vpp(info, spec.vpp)
        except ScheduleError as e:
            rows.append({"schedule": name, "vpp": spec.vpp, "error": str(e)})
            continue
        own = {k: v for k, v in spec.options.items() if k in info.option_names}
        try:
            sched = plan(name, spec if own == spec.options else replace(spec, options=own))
        except (ScheduleError, ValueError) as e:
            rows.append({"schedule": name, "vpp": spec.vpp, "error": str(e)})
            continue
        rows.append(evaluate(sched, spec))
    ok = sorted((r for r in rows if "error" not in r), key=lambda r: (r["makespan"], max(r["peak_memory"])))
    return ok + [r for r in rows if "error" in r]
