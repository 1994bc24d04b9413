"""Data-parallel gradient reduction on top of a simulated pipeline step (no torch).

With ``dp`` replicas of the pipeline, every device's gradients are reduced over its dp group (one
link per device: the reductions of a device run one after another). The cost of one collective
over ``n`` ranks of ``B`` bytes on a link of bandwidth ``bw`` (bytes/s) and per-step latency ``lat``
(ring algorithms, Patarasuk & Yuan 2009; Thakur et al. 2005)::

    all-reduce        2 (n-1)/n * B / bw  +  2 (n-1) * lat
    reduce-scatter      (n-1)/n * B / bw  +    (n-1) * lat
    all-gather          (n-1)/n * B / bw  +    (n-1) * lat

``overlap`` (the runtime's ``--overlap-grad-reduce``): a chunk's reduction becomes ready when the
chunk's LAST W (or BW) of the step on its device ends, so the reduction of an early-finished chunk
runs while the device is still draining the pipeline; ready reductions queue on the link in ready
order. Without overlap, one all-reduce of all the device's bytes (ZeRO-1: its per-chunk
reduce-scatters) starts when the device's last job ends. ZeRO-1 adds the all-gather of the updated
parameters (the same bytes, per chunk) after the device's last reduce-scatter (the optimizer step
itself is not modelled).

    step_time        = max over devices of (the device's last job end, its last collective end)
    dp_exposed       = step_time - makespan              (the un-hidden tail)
    dp_time          = the busiest link's total collective time
    dp_hidden_share  = 1 - dp_exposed / dp_time          (None when nothing is reduced)

Times are in the schedule's cost unit; ``unit_s`` says how many seconds one unit is (1e-3: costs in
ms, as measured costs are).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from ..core.ir import Kind
from .simulate import SimResult


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """THE link type: the network one device uses for a collective or a send (the tuner's intra- and
    inter-node links are these too)."""

    bandwidth: float
    """bytes per second one device moves (per direction; the bus bandwidth of a ring collective)"""
    latency: float = 0.0
    """seconds per message (one ring step)"""

    def __post_init__(self) -> None:
        if not (self.bandwidth > 0) or not (self.latency >= 0):
            raise ValueError(f"a link needs bandwidth > 0 and latency >= 0, got {self.bandwidth}, {self.latency}")


@dataclass(frozen=True, slots=True, kw_only=True)
class DPLink(Link):
    """The data-parallel network of one device, and how many seconds one schedule cost unit is."""

    unit_s: float = 1e-3
    """seconds per schedule cost unit"""

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise ValueError(f"dp bandwidth must be > 0 bytes/s, got {self.bandwidth!r}")
        if not self.latency >= 0:
            raise ValueError(f"dp latency must be >= 0 s, got {self.latency!r}")
        if not self.unit_s > 0:
            raise ValueError(f"the cost unit must be > 0 s, got {self.unit_s!r}")


def collective_seconds(kind: str, nbytes: float, n: int, link: Link) -> float:
    """Seconds of one ring collective (``allreduce``, ``reduce_scatter``, ``all_gather``) of ``nbytes`` over ``n``
    ranks: THE ring formulas of the module docstring (the tuner's too)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    steps = {"allreduce": 2, "reduce_scatter": 1, "all_gather": 1}.get(kind)
    if steps is None:
        raise ValueError(f"unknown collective {kind!r}; choose allreduce, reduce_scatter or all_gather")
    return steps * (n - 1) / n * nbytes / link.bandwidth + steps * (n - 1) * link.latency


def p2p_seconds(nbytes: float, link: Link) -> float:
    """Seconds of one send of ``nbytes``: ``latency + bytes / bandwidth``."""
    return link.latency + nbytes / link.bandwidth


def queue_buckets(ready: dict[int, float], seconds) -> list[tuple[float, float, int]]:
    """Overlapped reduction (the module docstring's ``overlap``): each chunk's bucket becomes ready at
    ``ready[chunk]`` and the buckets queue on the device's link in ready order, each taking ``seconds(chunk)``.
    Returns (start, end, chunk) per bucket. The simulator's dp model and the tuner's step time use this one
    queue."""
    out, t = [], 0.0
    for r, c in sorted((r, c) for c, r in ready.items()):
        s = max(t, r)
        t = s + seconds(c)
        out.append((s, t, c))
    return out


@dataclass(slots=True)
class DPResult:
    dp: int
    overlap: bool
    zero: int
    makespan: float
    step_time: float
    dp_exposed: float
    dp_time: float
    dp_hidden_share: float | None
    intervals: list[list[tuple[float, float, str]]] = field(default_factory=list)
    """per device: (start, end, label) of each collective, in schedule units"""

    def to_dict(self) -> dict:
        return {"dp": self.dp, "overlap_grad_reduce": self.overlap, "zero": self.zero, "step_time": self.step_time,
                "dp_exposed": self.dp_exposed, "dp_time": self.dp_time, "dp_hidden_share": self.dp_hidden_share}


def last_weight_grad_ends(sim: SimResult, device: int) -> dict[int, float]:
    """Chunk -> end of its last W or BW on ``device`` (when its gradients are final)."""
    out: dict[int, float] = {}
    for j, e in zip(sim.schedule.devices[device], sim.end[device]):
        if j.kind in (Kind.W, Kind.BW):
            out[j.chunk] = max(out.get(j.chunk, e), e)
    return out


def simulate_dp(sim: SimResult, chunk_bytes: Sequence[float], dp: int, link: DPLink, *, overlap: bool = True,
                zero: int = 0) -> DPResult:
    """The step time of ``sim``'s pipeline with ``dp`` replicas (see the module docstring).

    ``chunk_bytes``: gradient bytes of every global chunk (len = number of chunks)."""
    sched = sim.schedule
    if not isinstance(dp, int) or dp < 1:
        raise ValueError(f"dp must be an integer >= 1, got {dp!r}")
    if zero not in (0, 1):
        raise ValueError(f"zero must be 0 or 1, got {zero!r}")
    if len(chunk_bytes) != sched.num_chunks:
        raise ValueError(f"chunk bytes has {len(chunk_bytes)} entries but the schedule has {sched.num_chunks} "
                         f"chunks (pp*vpp)")
    if any(not b >= 0 for b in chunk_bytes):
        raise ValueError(f"chunk bytes must be >= 0, got {list(chunk_bytes)}")
    unit = link.unit_s
    red = "reduce_scatter" if zero else "allreduce"
    ends, intervals, busiest = [], [], 0.0
    for d in range(sched.pp):
        last_job = sim.end[d][-1] if sim.end[d] else 0.0
        ready = last_weight_grad_ends(sim, d)
        ivs: list[tuple[float, float, str]] = []
        t = 0.0
        if dp > 1:
            if overlap:
                for s, t, c in queue_buckets(ready, lambda c: collective_seconds(red, chunk_bytes[c], dp, link) / unit):
                    ivs.append((s, t, f"{'RS' if zero else 'AR'} {c}"))
            elif zero:
                t = last_job
                for c in sorted(ready):
                    s, t = t, t + collective_seconds(red, chunk_bytes[c], dp, link) / unit
                    ivs.append((s, t, f"RS {c}"))
            else:
                total = sum(chunk_bytes[c] for c in ready)
                s, t = last_job, last_job + collective_seconds("allreduce", total, dp, link) / unit
                ivs.append((s, t, "AR"))
            if zero:
                t = max(t, last_job)
                for c in sorted(ready):
                    s, t = t, t + collective_seconds("all_gather", chunk_bytes[c], dp, link) / unit
                    ivs.append((s, t, f"AG {c}"))
        ends.append(max(last_job, t))
        intervals.append(ivs)
        busiest = max(busiest, sum(e - s for s, e, _ in ivs))
    step = max(ends + [sim.makespan])
    exposed = step - sim.makespan
    share = None if busiest <= 0 else max(0.0, min(1.0, 1.0 - exposed / busiest))
    return DPResult(dp=dp, overlap=overlap, zero=zero, makespan=sim.makespan, step_time=step, dp_exposed=exposed,
                    dp_time=busiest, dp_hidden_share=share, intervals=intervals)


_BW = re.compile(r"^\s*([0-9.eE+-]+)\s*([kKmMgGtT]?)([bB])?(?:it)?(?:ps|/s)?\s*$")
_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_bandwidth(text: str | float) -> float:
    """Bytes per second from ``100Gb/s`` (bits), ``12.5GB/s`` (bytes), ``25Gbps`` or a plain number (bytes/s)."""
    if isinstance(text, (int, float)):
        v = float(text)
    else:
        m = _BW.match(str(text))
        if not m:
            raise ValueError(f"dp bandwidth {text!r}: expected e.g. 100Gb/s (bits), 12.5GB/s (bytes) or bytes/s")
        try:
            v = float(m.group(1)) * _SCALE[m.group(2).lower()]
        except ValueError:
            raise ValueError(f"dp bandwidth {text!r}: {m.group(1)!r} is not a number") from None
        if m.group(3) == "b":
            v /= 8.0
    if not v > 0 or v == float("inf"):
        raise ValueError(f"dp bandwidth must be > 0, got {text!r}")
    return v


def parse_seconds(text: str | float) -> float:
    """Seconds from ``5us``, ``0.01ms``, ``2e-6s`` or a plain number (seconds)."""
    if isinstance(text, (int, float)):
        v = float(text)
    else:
        m = re.match(r"^\s*([0-9.eE+-]+)\s*(s|ms|us|ns)?\s*$", str(text))
        if not m:
            raise ValueError(f"dp latency {text!r}: expected e.g. 5us, 0.01ms or seconds")
        try:
            v = float(m.group(1)) * {None: 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[m.group(2)]
        except ValueError:
            raise ValueError(f"dp latency {text!r}: {m.group(1)!r} is not a number") from None
    if not v >= 0 or v == float("inf"):
        raise ValueError(f"dp latency must be a finite number >= 0, got {text!r}")
    return v


__all__ = ["DPLink", "DPResult", "Link", "collective_seconds", "last_weight_grad_ends", "p2p_seconds", "parse_bandwidth",
           "parse_seconds", "queue_buckets", "simulate_dp"]
