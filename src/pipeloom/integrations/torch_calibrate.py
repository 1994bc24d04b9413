"""Costs for planning a torch.distributed.pipelining run, read from a profiled torch step (no torch needed).

torch's ``_PipelineScheduleRuntime`` wraps every action of a step in ``record_function("PP:<action>")``:
compute (``PP:1F0``, ``PP:0I3``, ``PP:2W1``, ``PP:3B0``) and communication (``PP:0SEND_F2``, ``PP:3RECV_B1``).
A torch profiler trace of such a step (one Chrome/Kineto JSON per rank, plain or ``.gz``, the files
``pipeloom trace DIR`` reads) therefore holds what each action costs *in torch's runtime*, which is what a
plan meant for that runtime must be timed with. Isolated per-chunk timings miss three things this reads:

* torch's own I/W split: stage 0's ``I`` is a no-op and its ``W`` runs the whole backward, so a profile gives
  chunk 0 ``B ~ 0`` and ``W`` = the full backward;
* the runtime's per-action cost outside the math: Python dispatch, posting the sends that follow an action
  and the receives placed between actions, the gaps between spans;
* the latency of a transfer between ranks (gloo's send/receive handshake and the copy).

How (:func:`profile_costs`): an action that consumes another rank's output first waits for it inside its own
span, before its first operator; so an action's *work* starts at its first child operator (``lead``, the
median time from a span's start to its first operator among spans that never wait, is added back). An
action's cost is its work (to the span's end) plus the send spans that follow it (posting its output for the
next rank); per (chunk, kind) a quantile (the median by default) over microbatches and steps. The receive
postings and the gaps between spans are left out: where torch places receives depends on the lowering (see
:func:`pipeloom.integrations.torch.lower_early_recvs`), not on the plan's actions. The transfer latency is,
for every cross-rank edge where the consumer surely waited (its producer's send was posted after the consumer's
span began), the time from the start of the producer's send span
(the data is handed to gloo inside it; the call itself may return much later, when gloo's thread releases
its lock) to the consumer's work start; ``comm`` is their lower quartile by default (0 when no consumer ever waited: then the
latency never showed). Times are in milliseconds.
"""
from __future__ import annotations

import bisect
import re
import statistics
from dataclasses import dataclass, field

from ..core.costs import Costs
from ..core.ir import Kind
from ..core.torch_kinds import KIND_OF_LETTER, TORCH_LETTER
from ..trace.run import LogError
from ..trace.torch_profile import PP_COMPUTE as _COMPUTE
from ..trace.torch_profile import complete_events, find_traces, load_trace, trace_rank

_SEND = re.compile(r"^PP:(\d+)(SEND_F|SEND_B)(\d+)$")


@dataclass
class ProfileCosts:
    """What :func:`profile_costs` read: the costs, and the samples they come from (milliseconds)."""

    costs: Costs
    """per-chunk F, B (torch's I), W and the measured comm latency"""
    samples: dict = field(default_factory=dict)
    """(chunk, 'F'|'B'|'W') -> the per-action costs measured"""
    lead: float = 0.0
    """median time from a span's start to its first operator, for spans that never wait"""
    comm_samples: list = field(default_factory=list)
    """the transfer latencies observed where a consumer waited"""
    ranks: int = 0
    steps: int = 0


@dataclass
class _Span:
    name: str
    start: float  # ms
    end: float
    work: float | None = None  # start of the first child operator (ms), None when it has none


def _spans(data: dict, path: str) -> list[_Span]:
    """The ``PP:`` spans of one trace in time order, each with the start of its first child operator."""
    base = data.get("baseTimeNanoseconds")
    offset = float(base) * 1e-6 if isinstance(base, (int, float)) else 0.0  # ts are us after it; ms here
    pp, ops = [], {}
    for name, t0, dur, ev in complete_events(data["traceEvents"]):
        t0, dur = t0 * 1e-3 + offset, dur * 1e-3
        key = (ev.get("pid"), ev.get("tid"))
        if name.startswith("PP:"):
            pp.append((key, _Span(name, t0, t0 + dur)))
        else:
            ops.setdefault(key, []).append(t0)
    if not pp:
        raise LogError(f"{path} holds no pipeline actions (no 'PP:<action>' spans); profile a step of torch's "
                       f"_PipelineScheduleRuntime (or one of its schedule classes)")
    for key in ops:
        ops[key].sort()
    for key, s in pp:
        starts = ops.get(key, [])
        i = bisect.bisect_left(starts, s.start)
        if i < len(starts) and starts[i] <= s.end:
            s.work = starts[i]
    return sorted((s for _, s in pp), key=lambda s: s.start)


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def profile_costs(source, *, quantile: float = 0.5, comm_quantile: float = 0.25) -> ProfileCosts:
    """Read the per-action costs of a profiled torch pipeline step; ``source`` is a directory or file of torch
    profiler traces (as :func:`pipeloom.trace.torch_profile.find_traces` finds them), or a dict
    ``{rank: [trace dict, ...]}`` of loaded traces. See the module docstring for the method. ``quantile``: the
    statistic taken over each (chunk, kind)'s samples and over the transfer latencies (0.5 = the median; on a
    shared machine a lower one, e.g. 0.25, leaves out more of the time other processes took). ``comm_quantile``:
    the one taken over the transfer latencies; low by default, because a latency observed where torch's lowering
    posted the receive late also holds gloo's handshake, which posting receives first removes."""
    for name, q in (("quantile", quantile), ("comm_quantile", comm_quantile)):
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {q}")
    if isinstance(source, dict):
        traces = [(r, f"rank {r} trace {i}", d) for r, ds in sorted(source.items()) for i, d in enumerate(ds)]
    else:
        found = find_traces(str(source))
        if not found:
            raise LogError(f"no torch profiler traces (*.json, *.json.gz) under {source}")
        traces = []
        for i, (path, _) in enumerate(found):
            data = load_trace(path)
            traces.append((trace_rank(data, path, i), path, data))
    per_trace = [(rank, path, _spans(data, path)) for rank, path, data in traces]
    home: dict[int, int] = {}
    for rank, _, spans in per_trace:
        for s in spans:
            c = _COMPUTE.match(s.name)
            if c:
                home[int(c.group(1))] = rank
    if not home:
        raise LogError("the traces hold no compute actions (PP:<stage>F<mb>, I, W or B spans)")
    nc = max(home) + 1
    missing = sorted(set(range(nc)) - set(home))
    if missing:
        raise LogError(f"the traces name stages up to {nc - 1} but never run stage(s) {missing}")

    def may_wait(stage: int, kind: str) -> bool:  # does this action wait for another rank's output first?
        if kind == "F":
            return stage > 0 and home[stage - 1] != home[stage]
        if KIND_OF_LETTER[kind] in (Kind.B, Kind.BW):
            return stage < nc - 1 and home[stage + 1] != home[stage]
        return False

    leads = [s.work - s.start for _, _, spans in per_trace for s in spans
             if s.work is not None and (c := _COMPUTE.match(s.name)) and not may_wait(int(c.group(1)), c.group(2))]
    lead = statistics.median(leads) if leads else 0.0
    samples: dict[tuple[int, str], list[float]] = {}
    produced: dict[tuple[str, int, int], float] = {}  # (edge kind, consumer stage, mb) -> the send posted
    waited: list = []  # (edge kind, stage, mb, span start, work start) of the actions that may wait
    for rank, path, spans in per_trace:
        compute = [s for s in spans if _COMPUTE.match(s.name)]
        for s in spans:
            m = _SEND.match(s.name)
            if m:
                st, mb = int(m.group(1)), int(m.group(3))
                if m.group(2) == "SEND_F":
                    produced[("F", st + 1, mb)] = s.start
                else:
                    produced[("B", st - 1, mb)] = s.start
        for i, s in enumerate(compute):
            st, kind, mb = _COMPUTE.match(s.name).groups()
            st, mb = int(st), int(mb)
            waits = may_wait(st, kind)
            arrived = s.work if s.work is not None else s.end  # a no-op (stage 0's I) ends when its wait does
            begin = s.start if not waits else arrived - lead
            if waits:
                waited.append(("F" if kind == "F" else "B", st, mb, s.start, arrived - lead))
            stop = compute[i + 1].start if i + 1 < len(compute) else float("inf")
            sends = sum(x.end - x.start for x in spans if s.end <= x.start < stop and _SEND.match(x.name))
            cost = max(0.0, s.end - begin) + sends
            # torch's B is a full backward (what pipeloom splits into B and W): kept whole under 'BW'
            samples.setdefault((st, KIND_OF_LETTER[kind].value), []).append(cost)
    # a consumer surely waited for the transfer when its producer's send was posted after the consumer began (a
    # late first operator alone may be the process being descheduled, not a wait)
    comm = [max(0.0, t - produced[(k, st, mb)]) for k, st, mb, began, t in waited
            if (k, st, mb) in produced and produced[(k, st, mb)] > began]
    per = {"F": [], "B": [], "W": []}
    for c in range(nc):
        for k in ("F", "B", "W"):
            if (c, k) in samples:
                per[k].append(_quantile(samples[(c, k)], quantile))
            elif k in ("B", "W") and (c, "BW") in samples:
                raise LogError(f"stage {c} ran only full backwards (torch's B) in the traces, which cannot be "
                               f"split into I and W: profile a schedule that splits them (e.g. "
                               f"ZBVZeroBubble or InterleavedZeroBubble)")
            else:
                raise LogError(f"the traces hold no {TORCH_LETTER[Kind(k)]} action of stage {c}")
    costs = Costs(F=tuple(per["F"]), B=tuple(per["B"]), W=tuple(per["W"]),
                  comm=_quantile(comm, comm_quantile) if comm else 0.0)
    steps = max(1, len(per_trace) // max(1, len({r for r, _, _ in per_trace})))
    return ProfileCosts(costs=costs, samples={k: v for k, v in samples.items()}, lead=lead, comm_samples=comm,
                        ranks=len({r for r, _, _ in per_trace}), steps=steps)


def costs_from_torch_profile(source, *, quantile: float = 0.5, comm_quantile: float = 0.25) -> Costs:
    """Per-chunk F, B (torch's I), W and comm in milliseconds, as torch's runtime ran them in a profiled step
    (``source``: a directory or file of torch profiler traces, see :func:`profile_costs`). Plan for torch with
    them, e.g. ``make_spec(..., costs=costs_from_torch_profile("profile_trace/iteration_10"),
    mem=runtime_mem_model("torch"))``."""
    return profile_costs(source, quantile=quantile, comm_quantile=comm_quantile).costs


def peak_with_retention(schedule, mem, kept) -> list[float]:
    """Per-device peak memory of ``schedule`` under ``mem`` (a :class:`~pipeloom.core.costs.MemModel`) when each
    chunk's W leaves ``kept[c]`` of a microbatch's saved tensors held until the step ends.

    Measured in torch's runtime (saved-tensor hooks around each stage call): a last stage with a vocabulary head
    and cross-entropy keeps about 0.84 MiB per microbatch after its W (torch's ``I`` then ``W``:
    ``stage_backward_input``, ``stage_backward_weight``), in torch's own orders as in pipeloom's, and pipeloom's
    memory model (F allocates ``a``, B frees ``b``, W frees the rest) has no term for it. A fused backward (pipeloom
    ``BW``, torch's full ``B``: ``stage_backward``) leaves nothing. A plan whose peak comes later in the step than
    torch's then holds more than planned; compare plans with this peak instead (``kept`` all 0 gives the model's
    own peak)."""
    from ..core import rules

    nc = schedule.num_chunks
    a, b = mem.per_chunk(nc, schedule.vpp)
    kept = [float(k) for k in kept]
    if len(kept) != nc:
        raise ValueError(f"kept has {len(kept)} values but the schedule has {nc} chunks")
    delta = rules.memory_deltas(nc, a, b)  # the model's own change per job, plus what W leaves held
    delta[Kind.W] = [d + kept[c] for c, d in enumerate(delta[Kind.W])]
    peaks = []
    for seq in schedule.devices:
        now = peak = 0.0
        for kind, _mb, c in seq:
            now += delta[kind][c]
            peak = max(peak, now)
        peaks.append(peak)
    return peaks
