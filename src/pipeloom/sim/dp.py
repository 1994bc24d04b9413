"""Data-parallel gradient reduction on top of a simulated pipeline step (no torch).

With ``dp`` replicas of the pipeline, every device's gradients are reduced over its dp group (one
link per device: the reductions of a device run one after another). The cost of one collective
over ``n`` ranks of ``B`` bytes on a link of bandwidth ``bw`` (bytes/s) and per-step latency ``lat``
(ring algorithms, Patarasuk & Yuan 2009; Thakur et al. 2005)::

    all-reduce        2 (n-1)/n * B / bw  +  2 (n-1) * lat
    reduce-scatter      (n-1)/n * B / bw  +    (n-1) * lat
    all-gather          (n-1)/n * B / bw  +    (n-1) * lat

``overlap`` (Megatron's and the runtime's ``--overlap-grad-reduce``): a chunk's gradients are final during its
LAST W (or BW) of the step on its device; they fill buckets of ``bucket_bytes`` in the backward's order at a
uniform rate over that job, and each bucket's collective is ready when its last gradient is (:func:`bucket_ready`;
Megatron-Core's default bucket is ``max(40M, 1M x dp)`` parameters, :func:`default_bucket_params`; no bucket size:
one bucket per chunk, ready at the job's end). Ready collectives queue on the link in ready order, so an
early-finished chunk's reduction runs while the device drains the pipeline, and with pp = 1 most of the
reduction hides behind the last microbatch's backward. Without overlap, one all-reduce of all the device's
bytes (ZeRO-1: its per-chunk reduce-scatters) starts when the device's last job ends.

ZeRO (Rajbhandari et al. 2020): 1 (distributed optimizer) reduce-scatters instead of all-reducing and adds the
all-gather of the updated parameters after the device's last reduce-scatter; 2 (gradients sharded) reduce-scatters
the chunk's gradients after EVERY backward of the chunk (each microbatch: the unsharded gradients are not kept),
then the same parameter all-gather; 3 (FSDP, parameters sharded) also all-gathers the chunk's parameters before
each F and each B/BW, one unit (a layer: FSDP's wrapping) at a time, each issued when the unit before it starts
(the first when the device's previous job starts: FSDP's one-ahead prefetch); a unit whose parameters are late
waits, and the device's later jobs shift (not propagated to other devices). With units, ZeRO-2/3 reduce-scatter
one unit's gradients at a time. The optimizer step itself is not modelled
here (the tuner adds it).

Gradient groups (expert parallelism): a chunk's gradients may reduce over more than one group
(:class:`GradGroup`: a share of every chunk's bytes, its ranks and its link); with expert parallel the dense
gradients reduce over ``dp x cp`` ranks and the routed experts' over ``dp x cp / ep``
(:func:`pipeloom.models.moe.group_sizes`). Every collective of a chunk then moves each group's share over that
group's ranks and link, one group after the other on the device's link: its time is the sum of the groups' ring
times (the buckets mix the groups in proportion; Megatron keeps expert buckets apart, which the sum also times).

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

#: ZeRO levels the dp model times (what each shards: :mod:`pipeloom.memory`'s sharding table)
ZERO_LEVELS = (0, 1, 2, 3)


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


@dataclass(frozen=True, slots=True, kw_only=True)
class GradGroup:
    """One gradient group of :func:`device_dp`: ``share[c]`` of chunk ``c``'s bytes reduce over ``ranks`` ranks
    on ``link``."""

    share: Sequence[float]
    ranks: int
    link: Link

    def __post_init__(self) -> None:
        if isinstance(self.ranks, bool) or not isinstance(self.ranks, int) or self.ranks < 1:
            raise ValueError(f"a gradient group needs ranks >= 1, got {self.ranks!r}")
        if any(not 0.0 <= x <= 1.0 for x in self.share):
            raise ValueError(f"a gradient group's shares must lie in [0, 1], got {list(self.share)}")


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
    bucket_bytes: float | None = None

    def to_dict(self) -> dict:
        return {"dp": self.dp, "overlap_grad_reduce": self.overlap, "zero": self.zero, "step_time": self.step_time,
                "dp_exposed": self.dp_exposed, "dp_time": self.dp_time, "dp_hidden_share": self.dp_hidden_share,
                "bucket_bytes": self.bucket_bytes}


def last_weight_grad_ends(sim: SimResult, device: int) -> dict[int, float]:
    """Chunk -> end of its last W or BW on ``device`` (when its gradients are final)."""
    return {c: e for c, (_, e) in last_weight_grad_jobs(sim, device).items()}


def last_weight_grad_jobs(sim: SimResult, device: int) -> dict[int, tuple[float, float]]:
    """Chunk -> (start, end) of its last W or BW on ``device`` (the job that finishes its gradients)."""
    out: dict[int, tuple[float, float]] = {}
    for j, s, e in zip(sim.schedule.devices[device], sim.start[device], sim.end[device]):
        if j.kind in (Kind.W, Kind.BW) and e >= out.get(j.chunk, (0.0, -1.0))[1]:
            out[j.chunk] = (s, e)
    return out


#: Megatron-Core's default bucket: ``max(40000000, 1000000 * dp_size)`` parameters
#: (``DistributedDataParallelConfig.bucket_size``, megatron/core/distributed/distributed_data_parallel_config.py)
MEGATRON_BUCKET_PARAMS = 40_000_000


def default_bucket_params(dp: int) -> int:
    """Megatron-Core's default gradient bucket (parameters) for ``dp`` replicas."""
    return max(MEGATRON_BUCKET_PARAMS, 1_000_000 * dp)


def bucket_ready(start: float, end: float, nbytes: float, bucket: float | None) -> list[tuple[float, float]]:
    """(ready time, bytes) of the buckets of a chunk whose gradients are made by the job running from ``start`` to
    ``end``: the gradients fill buckets of ``bucket`` bytes in the backward's order at a uniform rate over the
    job (Megatron's ``--overlap-grad-reduce`` launches a bucket's collective once its last gradient is ready),
    so bucket i of n is ready at ``start + (end - start) * min(1, (i+1) bucket / nbytes)``. ``bucket`` None or
    not below ``nbytes``: one bucket, ready at ``end``."""
    if nbytes <= 0:
        return []
    if bucket is None or bucket >= nbytes:
        return [(end, nbytes)]
    out, done = [], 0.0
    while done < nbytes - 1e-9 * nbytes:
        size = min(bucket, nbytes - done)
        done += size
        out.append((start + (end - start) * min(1.0, done / nbytes), size))
    return out


def device_dp(sim: SimResult, device: int, grad_bytes: Sequence[float], dp: int, link: Link, *, unit_s: float = 1.0,
              overlap: bool = True, zero: int = 0, param_bytes: Sequence[float] | None = None,
              bucket_bytes: float | None = None,
              units: Sequence[int] | None = None,
              groups: Sequence[GradGroup] | None = None) -> tuple[float, list[tuple[float, float, str]]]:
    """The data-parallel collectives of one device of ``sim`` (times in the schedule's unit, ``unit_s`` seconds
    each): (the device's end of step, the (start, end, label) of each collective). THE dp model of the
    simulator's ``--dp`` and the tuner; the module docstring has the rules. ``grad_bytes`` / ``param_bytes``:
    per global chunk, the bytes reduced / gathered (``param_bytes`` None: ``grad_bytes``); ``units``: per chunk,
    the units (layers) ZeRO-2/3 shard and gather one at a time (None: the whole chunk is one unit); ``groups``:
    the gradient groups (None: one, every byte over ``dp`` ranks on ``link``)."""
    sched = sim.schedule
    pbytes = grad_bytes if param_bytes is None else param_bytes
    jobs, starts, ends = sched.devices[device], sim.start[device], sim.end[device]
    last_job = ends[-1] if ends else 0.0
    ivs: list[tuple[float, float, str]] = []
    if groups is None:
        groups = [GradGroup(share=[1.0] * sched.num_chunks, ranks=dp, link=link)]
    if all(g.ranks <= 1 for g in groups) or not jobs:
        return last_job, ivs

    def secs(kind: str, nbytes: float, c: int) -> float:
        return sum(collective_seconds(kind, nbytes * g.share[c], g.ranks, g.link) for g in groups) / unit_s

    red, tag = ("reduce_scatter", "RS") if zero else ("allreduce", "AR")
    t = 0.0
    if zero >= 2:
        # gradients sharded: every backward of a chunk reduce-scatters its gradients (bucketed through the
        # job); ZeRO-3 also all-gathers the chunk's parameters before each F and each B/BW, one unit (layer,
        # FSDP's wrapping) at a time: unit 0's gather is prefetched when the device's previous job starts, unit
        # i's when unit i-1 starts (FSDP's one-ahead prefetch); without overlap each when its unit would start.
        # A unit waits for its parameters and, without overlap, a job for its own reduce-scatter: the device's
        # later jobs shift (the shift does not propagate to other devices).
        shift, prev_start = 0.0, 0.0
        for j, s0, e0 in zip(jobs, starts, ends):
            s, e = s0 + shift, e0 + shift
            u = max(1, int(units[j.chunk])) if units is not None else 1
            if zero == 3 and j.kind in (Kind.F, Kind.B, Kind.BW):
                step, here, issued, first = (e0 - s0) / u, s, prev_start, None
                for _ in range(u):
                    a0 = max(t, issued if overlap else here)
                    t = a0 + secs("all_gather", pbytes[j.chunk] / u, j.chunk)
                    ivs.append((a0, t, f"AG {j.chunk}"))
                    start = max(here, t)  # the unit starts once its parameters are gathered
                    first = start if first is None else first
                    issued, here = start, start + step  # the next unit's gather is issued as this one starts
                s, e = first, here
                shift = e - e0
            prev_start = s
            if j.kind in (Kind.W, Kind.BW):
                rs_bucket = (grad_bytes[j.chunk] / u if units is not None else bucket_bytes) if overlap else None
                for r, nb in bucket_ready(s, e, grad_bytes[j.chunk], rs_bucket):
                    a0 = max(t, r)
                    t = a0 + secs("reduce_scatter", nb, j.chunk)
                    ivs.append((a0, t, f"RS {j.chunk}"))
                if not overlap and t > e:
                    shift += t - e
        last_job = ends[-1] + shift
    elif overlap:
        items = []
        for c, (s, e) in last_weight_grad_jobs(sim, device).items():
            items += [(r, c, nb) for r, nb in bucket_ready(s, e, grad_bytes[c], bucket_bytes)]
        for r, c, nb in sorted(items):
            a0 = max(t, r)
            t = a0 + secs(red, nb, c)
            ivs.append((a0, t, f"{tag} {c}"))
    elif zero:
        t = last_job
        for c in sorted(last_weight_grad_ends(sim, device)):
            a0, t = t, t + secs(red, grad_bytes[c], c)
            ivs.append((a0, t, f"RS {c}"))
    else:
        mine = last_weight_grad_ends(sim, device)  # one all-reduce per group of all the device's bytes
        total = sum(collective_seconds("allreduce", sum(grad_bytes[c] * g.share[c] for c in mine), g.ranks, g.link)
                    for g in groups) / unit_s
        ivs.append((last_job, last_job + total, "AR"))
        t = ivs[-1][1]
    if zero in (1, 2):  # the updated parameters' all-gather after the last reduce-scatter (distributed optimizer)
        t = max(t, last_job)
        for c in sorted(last_weight_grad_ends(sim, device)):
            a0, t = t, t + secs("all_gather", pbytes[c], c)
            ivs.append((a0, t, f"AG {c}"))
    return max(last_job, t), ivs


def simulate_dp(sim: SimResult, chunk_bytes: Sequence[float], dp: int, link: DPLink, *, overlap: bool = True,
                zero: int = 0, param_bytes: Sequence[float] | None = None,
                bucket_bytes: float | None = None, units: Sequence[int] | None = None) -> DPResult:
    """The step time of ``sim``'s pipeline with ``dp`` replicas (see the module docstring).

    ``chunk_bytes``: gradient bytes of every global chunk (len = number of chunks); ``param_bytes``: the
    parameter bytes the ZeRO all-gathers move (None: ``chunk_bytes``); ``bucket_bytes``: gradient bytes per
    bucket (None: one bucket per chunk); ``units``: layers per chunk, which ZeRO-2/3 reduce and gather one at a
    time (None: one unit per chunk)."""
    sched = sim.schedule
    if not isinstance(dp, int) or dp < 1:
        raise ValueError(f"dp must be an integer >= 1, got {dp!r}")
    if zero not in ZERO_LEVELS or isinstance(zero, bool):
        raise ValueError(f"zero must be 0, 1, 2 or 3, got {zero!r}")
    if bucket_bytes is not None and not bucket_bytes > 0:
        raise ValueError(f"the dp bucket must be > 0 bytes, got {bucket_bytes!r}")
    for what, vals in (("chunk bytes", chunk_bytes), ("param bytes", param_bytes)):
        if vals is None:
            continue
        if len(vals) != sched.num_chunks:
            raise ValueError(f"{what} has {len(vals)} entries but the schedule has {sched.num_chunks} "
                             f"chunks (pp*vpp)")
        if any(not b >= 0 for b in vals):
            raise ValueError(f"{what} must be >= 0, got {list(vals)}")
    ends, intervals, busiest = [], [], 0.0
    for d in range(sched.pp):
        end, ivs = device_dp(sim, d, chunk_bytes, dp, link, unit_s=link.unit_s, overlap=overlap, zero=zero,
                             param_bytes=param_bytes, bucket_bytes=bucket_bytes, units=units)
        ends.append(end)
        intervals.append(ivs)
        busiest = max(busiest, sum(e - s for s, e, _ in ivs))
    step = max(ends + [sim.makespan])
    exposed = step - sim.makespan
    share = None if busiest <= 0 else max(0.0, min(1.0, 1.0 - exposed / busiest))
    return DPResult(dp=dp, overlap=overlap, zero=zero, makespan=sim.makespan, step_time=step, dp_exposed=exposed,
                    dp_time=busiest, dp_hidden_share=share, intervals=intervals, bucket_bytes=bucket_bytes)


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


__all__ = ["DPLink", "DPResult", "GradGroup", "Link", "MEGATRON_BUCKET_PARAMS", "ZERO_LEVELS", "bucket_ready",
           "collective_seconds",
           "default_bucket_params", "device_dp", "last_weight_grad_ends", "last_weight_grad_jobs", "p2p_seconds",
           "parse_bandwidth", "parse_seconds", "simulate_dp"]
