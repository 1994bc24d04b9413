"""The optional C extension ``pipeloom.sim._accel`` (built from ``sim/_accel.c`` by setup.py), as the planners use it.

``_accel.c`` holds the compiled form of the timing kernel (:mod:`pipeloom.sim.kernel`, which loads it) and
transcribes two Python passes line by line: the greedy pass of :mod:`.greedy` (its specification) and the
validator's witness check. Without a C compiler at install time ``ext`` is None and everything runs in
Python; ``PIPELOOM_PURE_PYTHON=1`` forces that path.
"""
from __future__ import annotations

from ...core.ir import Kind, device_of
from ...sim.kernel import accelerated, ext

__all__ = ["accelerated", "ext", "witness_check"]


def witness_check(schedule, a: list[float], b: list[float], mem_limit: float | None) -> bool:
    """Every rule of the validator checked in one pass of the C extension, with ``schedule.witness`` as the
    deadlock proof (see ``proven_valid`` in ``_accel.c``). False when the extension is absent or off, or when
    any rule fails: the caller then checks job by job."""
    if not accelerated() or schedule.witness is None or schedule.overlapped:
        return False
    pp = schedule.pp
    home = [device_of(c, pp, schedule.placement) for c in range(schedule.num_chunks)]
    return ext.proven_valid(schedule.devices, schedule.witness, (pp, schedule.vpp, schedule.microbatches), home,
                            (Kind.F, Kind.B, Kind.W, Kind.BW), a, b, mem_limit)
