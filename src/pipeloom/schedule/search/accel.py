"""The optional C extension ``pipeloom.sim._accel`` (built from ``sim/_accel.c`` by setup.py), as the planners use it.

``_accel.c`` holds the compiled form of the timing kernel (:mod:`pipeloom.sim.kernel`, which loads it), of the
list-scheduling board (:mod:`pipeloom.sim.listsched`) with the greedy pass of :mod:`.greedy`, the lock-step
pass of :mod:`.lockstep`, the paced pass of :mod:`.paced` and the template pass of
:mod:`pipeloom.schedule.zb_looped` on it, the squeezes of :mod:`.vsqueeze` and the
validator's witness check (their Python forms are the specification); the board, the squeezes and the witness
check read the rules as the tables of :class:`pipeloom.sim.kernel.Rules`. Without a C compiler at
install time ``ext`` is None and everything runs in Python; ``PIPELOOM_PURE_PYTHON=1`` forces that path.
"""
from __future__ import annotations

from ...core.ir import device_of
from ...sim.kernel import KINDS, Rules, accelerated, ext
from ...sim.listsched import mem_table

__all__ = ["accelerated", "ext", "witness_check"]


def witness_check(schedule, a: list[float], b: list[float], mem_limit: float | None) -> bool:
    """Every rule of the validator checked in one pass of the C extension, with ``schedule.witness`` as the
    deadlock proof (see ``proven_valid`` in ``_accel.c``). False when the extension is absent or off, or when
    any rule fails: the caller then checks job by job."""
    if not accelerated() or schedule.witness is None or schedule.overlapped:
        return False
    pp, nc = schedule.pp, schedule.num_chunks
    home = [device_of(c, pp, schedule.placement) for c in range(nc)]
    tables = Rules.make(pp, nc, schedule.placement)  # the rules as the list-scheduling board reads them
    return ext.proven_valid(schedule.devices, schedule.witness, (pp, schedule.vpp, schedule.microbatches), home,
                            KINDS, tables.needs, tables.produces, mem_table(nc, a, b), mem_limit)
