"""Bubble check: compare a measured run with its plan; find late jobs and the straggler (no torch).

Inputs: a :class:`~pipeloom.trace.reader.RunLog` (clocks aligned) whose meta line carries the
schedule (text logs: the measured order of the first step stands in for the plan).

1. Fit durations. The plan's costs are relative (F=1, ...); seconds come from the run: for each
   kind, ``scale = lower median over ranks of (that rank's median of measured / planned cost)``
   (a lower median so a minority of slow ranks, even 1 of 2, does not set the norm). Expected
   duration of a job = scale[kind] * cost(kind, chunk). Communication latency = median over
   cross-device edges where the consumer sat idle of (consumer start - producer end).
2. Plan: the schedule replayed (:func:`~pipeloom.sim.replay.replay`) with expected durations and
   that latency. Planned bubble of device d = 1 - busy_d / makespan; measured bubble of device
   d in a step = 1 - busy_d / (last end - first start of the step over the pipeline).
   For FThenB, 1F1B and balanced interleaved VPP the closed form of the bubble is reported too
   (stage s, t_f / t_b = expected F / BW per chunk pass, comm ignored):
       FThenB:    s*t_f before the forwards, (pp-s-1)*(t_f+t_b) between forwards and
                  backwards, s*t_b after the backwards
       1F1B, VPP: s*t_f before warm-up, (pp-s-1)*t_f + (pp-s-1)*t_b around the steady
                  phase, s*t_b after cool-down
3. Late jobs: start (from the step's first start) minus planned start > tolerance
   (default max(median expected job, 3% of the planned makespan): run-to-run jitter adds up
   along dependency chains, so smaller gaps are noise).
4. Root cause. Each job's own delay = its start minus the moment it could have started (device
   free, inputs arrived + latency). "Leave one in": replay the measured order with every rank
   nominal (expected durations, no own delays) except rank r, which keeps its measured
   durations and delays; impact_r = that makespan - the all-nominal makespan. Downstream
   ranks that only waited keep nominal numbers, so the blame lands on the rank whose own
   jobs grew or started late, and several slow ranks are each found. Stragglers: impact_r >=
   threshold (default 3%) of the planned makespan; when more than half the ranks pass it the run is
   called unsteady and only ranks at >= 2x the median impact are named, unless those clear outliers
   explain the spread alone (they cause >= 75% of the late jobs and each costs the step >= 4x the median
   other rank: one rank 10x slower on a noisy machine), which is a straggler. A late job's cause = the rank
   whose leave-one-in replay delays that job most.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from ..core.ir import Kind, Schedule
from ..core.costs import Costs
from . import sanity
from .run import LogJob, RunLog
from ..sim.replay import ReplayDeadlock, dependencies, produces, replay

CLOSED_FORM_SCHEDULES = ("fthenb", "1f1b", "interleaved")


@dataclass(slots=True)
class Fit:
    scale: dict[str, float]
    """seconds per cost unit, per kind"""
    comm: float
    """seconds added on a cross-device edge"""
    costs: Costs
    num_chunks: int

    def expected(self, kind: str, chunk: int) -> float:
        dF, dB, dW = self.costs.per_chunk(self.num_chunks)
        c = min(max(chunk, 0), self.num_chunks - 1)
        cost = {"F": dF[c], "B": dB[c], "W": dW[c], "BW": dB[c] + dW[c]}[kind]
        return self.scale.get(kind, 0.0) * cost


@dataclass(slots=True)
class StepRun:
    """One pipeline (data-parallel replica) in one step, as executed."""

    dp_rank: int
    step: int
    ranks: list[int]
    """global rank of each device"""
    order: Schedule
    """the measured job order (same jobs as the plan)"""
    start: list[list[float]]
    end: list[list[float]]
    t0: float = 0.0
    t1: float = 0.0


@dataclass
class CheckReport:
    schedule: str
    pp: int
    dp: int
    steps: list[int]
    planned_bubble: float
    measured_bubble: float
    planned_makespan_s: float
    measured_makespan_s: float
    stragglers: list[int]
    late_jobs: int
    verdict: str
    ok: bool
    per_device: list[dict]
    per_rank: list[dict]
    late: list[dict]
    fit: dict
    closed_form: list[dict] | None
    malformed_lines: int
    clock_alignment: str
    clock_offsets_s: dict
    warnings: list[str] = field(default_factory=list)
    late_by_job: dict = field(default_factory=dict, repr=False)
    """(rank, step, job str) -> seconds late (for drawing)"""
    planned_runs: list = field(default_factory=list, repr=False)
    """(StepRun, planned replay start/end lists) for drawing the plan next to the run"""

    def to_dict(self) -> dict:
        return {
            "schedule": self.schedule, "pp": self.pp, "dp": self.dp, "steps": self.steps,
            "planned_bubble": self.planned_bubble, "measured_bubble": self.measured_bubble,
            "planned_makespan_s": self.planned_makespan_s, "measured_makespan_s": self.measured_makespan_s,
            "stragglers": self.stragglers, "late_jobs": self.late_jobs, "verdict": self.verdict, "ok": self.ok,
            "per_device": self.per_device, "per_rank": self.per_rank, "late": self.late, "fit": self.fit,
            "closed_form": self.closed_form, "malformed_lines": self.malformed_lines,
            "clock_alignment": self.clock_alignment, "clock_offsets_s": self.clock_offsets_s,
            "warnings": self.warnings,
        }


class CheckError(ValueError):
    """The logs cannot be compared with a plan (nothing complete to compare)."""


# ------------------------------------------------------------------------------------ assembling
def step_runs(run: RunLog, warnings: list[str]) -> list[StepRun]:
    """Group the logged jobs into (pipeline, step) runs that contain exactly the plan's jobs."""
    plan = run.schedule
    want = {job for _, _, job in plan.jobs()}
    pair_of = {plan.devices[d][i]: plan.devices[d][i + 1] for d, i in plan.overlapped if i + 1 < len(plan.devices[d])}
    groups: dict[int, dict[int, object]] = defaultdict(dict)
    for r in run.ranks:
        groups[r.dp_rank][r.pp_rank] = r
    out = []
    for dpr, by_dev in sorted(groups.items()):
        if sorted(by_dev) != list(range(plan.pp)):
            warnings.append(f"pipeline dp_rank={dpr} has logs for pp ranks {sorted(by_dev)}, expected 0..{plan.pp - 1}; "
                            f"skipped")
            continue
        for step in run.steps:
            devs, starts, ends, seen, bad = [], [], [], set(), None
            for d in range(plan.pp):
                js: list[LogJob] = sorted((j for j in by_dev[d].jobs if j.step == step), key=lambda j: (j.start, j.end))
                for j in js:
                    job = j.job()
                    if job not in want or job in seen:
                        bad = f"job {job} on rank {by_dev[d].rank} is {'repeated' if job in seen else 'not in the plan'}"
                    elif plan.device_of(job.chunk) != d:
                        bad = f"job {job} ran on pp rank {d}, the plan puts chunk {job.chunk} on {plan.device_of(job.chunk)}"
                    seen.add(job)
                devs.append([j.job() for j in js])
                starts.append([j.start for j in js])
                ends.append([j.end for j in js])
            if bad is None and seen != want:
                miss = sorted(want - seen, key=str)
                bad = f"{len(miss)} planned job(s) missing, e.g. {miss[0]}"
            if bad:
                warnings.append(f"step {step}, dp_rank {dpr}: {bad}; step left out of the check")
                continue
            ov = {(d, i) for d, seq in enumerate(devs) for i in range(len(seq) - 1) if pair_of.get(seq[i]) == seq[i + 1]}
            order = Schedule("measured", plan.pp, plan.vpp, plan.microbatches, plan.placement, devs, ov)
            t0 = min(s[0] for s in starts if s)
            t1 = max(e[-1] for e in ends if e)
            out.append(StepRun(dpr, step, [by_dev[d].rank for d in range(plan.pp)], order, starts, ends, t0, t1))
    return out


def _durations(sr: StepRun) -> list[list[float]]:
    out = []
    for d, seq in enumerate(sr.order.devices):
        row = []
        for i in range(len(seq)):
            if (d, i) in sr.order.overlapped:
                row.append(max(sr.end[d][i], sr.end[d][i + 1]) - sr.start[d][i])
            else:
                row.append(sr.end[d][i] - sr.start[d][i])
        out.append(row)
    return out


def _event_ends(sr: StepRun) -> dict:
    """Event (what a job produces) -> (device that produced it, measured end time)."""
    ends = {}
    for d, i, job in sr.order.jobs():
        for ev in produces(job):
            ends[ev] = (d, sr.end[d][i])
    return ends


def _edge_waits(sr: StepRun) -> tuple[list[float], list[list[float]]]:
    """(gaps of cross-device edges where the consumer was idle, ready time of each job ignoring comm)."""
    sched = sr.order
    nc = sched.num_chunks
    ends = _event_ends(sr)
    gaps, ready = [], []
    for d, seq in enumerate(sched.devices):
        row = []
        for i, job in enumerate(seq):
            free = sr.end[d][i - 1] if i > 0 else sr.t0
            dep_t, cross = None, None
            for ev in dependencies(job, nc):
                src_d, t = ends[ev]
                if dep_t is None or t > dep_t:
                    dep_t, cross = t, src_d != d
            row.append(free if dep_t is None else max(free, dep_t))
            if dep_t is not None and cross and sr.start[d][i] > free + 1e-9 and dep_t >= free:
                gaps.append(sr.start[d][i] - dep_t)
        ready.append(row)
    return gaps, ready


def fit_durations(run: RunLog, runs: list[StepRun]) -> Fit:
    """Seconds per cost unit per kind and the comm latency (module docstring, step 1)."""
    plan = run.schedule
    costs = run.costs or Costs()
    unit = Fit({"F": 1.0, "B": 1.0, "W": 1.0, "BW": 1.0}, 0.0, costs, plan.num_chunks)
    ratios: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    gaps: list[float] = []
    for sr in runs:
        durs = _durations(sr)
        for d, seq in enumerate(sr.order.devices):
            for i, job in enumerate(seq):
                c = unit.expected(job.kind.value, job.chunk)
                if c > 0 and not ((d, i) in sr.order.overlapped or (d, i - 1) in sr.order.overlapped):
                    ratios[job.kind.value][sr.ranks[d]].append(durs[d][i] / c)
        gaps += _edge_waits(sr)[0]
    scale = {}
    for kind, per_rank in ratios.items():
        meds = sorted(statistics.median(v) for v in per_rank.values())
        scale[kind] = meds[(len(meds) - 1) // 2]
    if not scale:
        raise CheckError("no job with a positive planned cost to fit durations from")
    fallback = statistics.median(scale.values())
    for kind in ("F", "B", "W", "BW"):
        scale.setdefault(kind, fallback)
    comm = max(0.0, statistics.median(gaps)) if gaps else 0.0
    return Fit(scale, comm, costs, plan.num_chunks)


def fit_chunk_costs(run: RunLog, runs: list[StepRun] | None = None, *, unit: float = 1e-3) -> Costs:
    """Per-chunk F, B, W and the comm latency measured in ``run``, in units of ``unit`` seconds (ms).

    Each (kind, chunk) costs the median duration of its jobs (overlapped pairs left out); a fused
    BW is split half/half into B and W where the log has no split jobs of that chunk. comm is the
    latency :func:`fit_durations` fits. These costs plan a schedule for the measured hardware
    (``pipeloom run --costs measured``).
    """
    warnings: list[str] = []
    runs = step_runs(run, warnings) if runs is None else runs
    if not runs:
        raise CheckError("no complete step to measure costs from" + (f" ({warnings[-1]})" if warnings else ""))
    nc = run.schedule.num_chunks
    durs: dict[tuple[str, int], list[float]] = defaultdict(list)
    for sr in runs:
        d_all = _durations(sr)
        for d, seq in enumerate(sr.order.devices):
            for i, job in enumerate(seq):
                if (d, i) not in sr.order.overlapped and (d, i - 1) not in sr.order.overlapped:
                    durs[(job.kind.value, job.chunk)].append(d_all[d][i] / unit)
    med = {k: statistics.median(v) for k, v in durs.items()}
    missing = [c for c in range(nc) if ("F", c) not in med or not ((("B", c) in med) or (("BW", c) in med))]
    if missing:
        raise CheckError(f"no timed F and backward job of chunk {missing[0]} to measure its costs from")
    F = tuple(med[("F", c)] for c in range(nc))
    B = tuple(med[("B", c)] if ("B", c) in med else med[("BW", c)] / 2 for c in range(nc))
    W = tuple(med.get(("W", c), med.get(("BW", c), 0.0) / 2) for c in range(nc))
    return Costs(F=F, B=B, W=W, comm=fit_durations(run, runs).comm / unit)


# ------------------------------------------------------------------------------------ the check
def check_run(run: RunLog, *, straggler_threshold: float = 0.03, late_tolerance: float | None = None,
              bubble_tolerance: float = 0.05) -> CheckReport:
    """Compare ``run`` with its plan (module docstring). Thresholds are fractions of the planned makespan."""
    warnings = list(run.warnings)
    plan = run.schedule
    if plan is None:
        raise CheckError("the logs carry no schedule and none could be inferred")
    sanity.check_times(run)  # times that cannot be real: a one-line error, no verdict
    runs = step_runs(run, warnings)
    if not runs:
        raise CheckError("no complete step to check: every profiled step lacks some planned jobs "
                         f"({warnings[-1] if warnings else 'no jobs'})")
    fit = fit_durations(run, runs)
    exp_plan = [[fit.expected(j.kind.value, j.chunk) for j in seq] for seq in plan.devices]
    try:
        prep = replay(plan, exp_plan, comm=fit.comm)
    except ReplayDeadlock as e:
        raise CheckError(f"the plan cannot be replayed: {e}") from None
    m_plan = prep.makespan
    busy_plan = [sum(exp_plan[d][i] for i in range(len(seq)) if (d, i - 1) not in plan.overlapped)
                 for d, seq in enumerate(plan.devices)]
    planned_dev = [1.0 - b / m_plan if m_plan > 0 else 0.0 for b in busy_plan]
    plan_start = {job: prep.start[d][i] for d, i, job in plan.jobs()}
    med_job = statistics.median(x for row in exp_plan for x in row) if plan.num_jobs else 0.0
    tol = late_tolerance if late_tolerance is not None else max(med_job, 0.03 * m_plan)

    meas_dev: dict[tuple[int, int], list[float]] = defaultdict(list)  # (dp, device) -> bubbles per step
    idle_tot = span_tot = 0.0
    impacts: dict[int, list[float]] = defaultdict(list)
    slow_ratio: dict[int, list[float]] = defaultdict(list)
    own_delay: dict[int, float] = defaultdict(float)
    late_rows, late_by_job = [], {}
    order_warned = set()
    cause_count: dict[int, int] = defaultdict(int)
    for sr in runs:
        window = sr.t1 - sr.t0
        durs = _durations(sr)
        _, ready = _edge_waits(sr)
        sched = sr.order
        nc = sched.num_chunks
        # own delay of each job: start minus the moment it could start (inputs + fitted latency)
        ends = _event_ends(sr)
        delays = []
        for d, seq in enumerate(sched.devices):
            row = []
            for i, job in enumerate(seq):
                free = sr.end[d][i - 1] if i > 0 else sr.t0
                r = free
                for ev in dependencies(job, nc):
                    src_d, t = ends[ev]
                    r = max(r, t + (fit.comm if src_d != d else 0.0))
                row.append(max(0.0, sr.start[d][i] - r))
            delays.append(row)
        for d in range(plan.pp):
            busy = sum(durs[d][i] for i in range(len(durs[d])) if (d, i - 1) not in sched.overlapped)
            b = 1.0 - busy / window if window > 0 else 0.0
            meas_dev[(sr.dp_rank, d)].append(b)
            idle_tot += window - busy
            span_tot += window
            if sched.devices[d] != plan.devices[d] and (sr.dp_rank, d) not in order_warned:
                order_warned.add((sr.dp_rank, d))
                warnings.append(f"rank {sr.ranks[d]} (pp rank {d}) ran its jobs in another order than the plan")
            for i, job in enumerate(sched.devices[d]):
                e = fit.expected(job.kind.value, job.chunk)
                if e > 0 and (d, i) not in sched.overlapped and (d, i - 1) not in sched.overlapped:
                    slow_ratio[sr.ranks[d]].append(durs[d][i] / e)
                own_delay[sr.ranks[d]] += delays[d][i]
        # leave-one-in counterfactuals
        nominal = [[fit.expected(j.kind.value, j.chunk) for j in seq] for seq in sched.devices]
        zero = [[0.0] * len(seq) for seq in sched.devices]
        base = replay(sched, nominal, comm=fit.comm, delays=zero)
        only = {}
        for d in range(plan.pp):
            dd = [durs[x] if x == d else nominal[x] for x in range(plan.pp)]
            dl = [delays[x] if x == d else zero[x] for x in range(plan.pp)]
            only[d] = replay(sched, dd, comm=fit.comm, delays=dl)
            impacts[sr.ranks[d]].append(only[d].makespan - base.makespan)
        # late jobs
        for d, seq in enumerate(sched.devices):
            for i, job in enumerate(seq):
                late = (sr.start[d][i] - sr.t0) - plan_start[job]
                if late > tol:
                    gains = {x: only[x].start[d][i] - base.start[d][i] for x in range(plan.pp)}
                    cx = max(gains, key=gains.get)
                    cause = sr.ranks[cx] if gains[cx] > tol / 2 else None
                    if cause is not None:
                        cause_count[cause] += 1
                    late_rows.append({"step": sr.step, "rank": sr.ranks[d], "pp_rank": d, "job": str(job),
                                      "late_s": late, "cause_rank": cause})
                    late_by_job[(sr.ranks[d], sr.step, str(job))] = late

    ranks_sorted = sorted(impacts)
    stragglers = [r for r in ranks_sorted if max(impacts[r]) >= straggler_threshold * m_plan]
    unsteady = len(stragglers) > len(ranks_sorted) / 2
    noisy_others = False
    if unsteady:  # most ranks cost time: a noisy run, name only the clear outliers
        med = statistics.median(max(v) for v in impacts.values())
        stragglers = [r for r in stragglers if max(impacts[r]) >= 2 * med]
        if _single_cause(stragglers, impacts, cause_count):
            unsteady, noisy_others = False, True  # one cause explains the spread: a straggler, not noise
    measured_bubble = idle_tot / span_tot if span_tot > 0 else 0.0
    planned_bubble = sum(planned_dev) / len(planned_dev) if planned_dev else 0.0
    meas_ms = statistics.mean(sr.t1 - sr.t0 for sr in runs)
    rank_of = {(r.dp_rank, r.pp_rank): r.rank for r in run.ranks}
    per_device = []
    for (dpr, d), vals in sorted(meas_dev.items()):
        per_device.append({"rank": rank_of.get((dpr, d)), "pp_rank": d, "dp_rank": dpr,
                           "planned_bubble": planned_dev[d], "measured_bubble": statistics.mean(vals)})
    per_rank = []
    for r in ranks_sorted:
        per_rank.append({"rank": r, "slowdown": statistics.median(slow_ratio[r]) if slow_ratio[r] else None,
                         "own_delay_s": own_delay[r], "impact_s": max(impacts[r]),
                         "impact_frac": max(impacts[r]) / m_plan if m_plan > 0 else 0.0,
                         "late_jobs_caused": cause_count.get(r, 0), "straggler": r in stragglers})
    late_rows.sort(key=lambda x: -x["late_s"])
    closed = closed_form(plan, fit, runs) if _closed_form_applies(plan) else None

    gap = measured_bubble - planned_bubble
    if unsteady:
        verdict = (f"UNSTEADY: job times vary on most ranks (each alone lengthens a step by >= "
                   f"{100 * straggler_threshold:g}%; noisy or shared machine?)"
                   + (f"; clear outlier rank(s) {', '.join(map(str, stragglers))}" if stragglers else "")
                   + f"; bubble {100 * measured_bubble:.1f}% measured vs {100 * planned_bubble:.1f}% planned")
        ok = False
    elif stragglers:
        parts = []
        for r in stragglers:
            pr = next(p for p in per_rank if p["rank"] == r)
            why = (f"jobs {pr['slowdown']:.2f}x the fitted time" if pr["slowdown"] and pr["slowdown"] > 1.05
                   else f"{pr['own_delay_s'] * 1e3:.3g} ms of late starts")
            parts.append(f"rank {r} ({why}, costs the step {100 * pr['impact_frac']:.1f}%, causes "
                         f"{pr['late_jobs_caused']} of the {len(late_rows)} late job(s))")
        verdict = ("STRAGGLER: " + "; ".join(parts) + f"; bubble "
                   f"{100 * measured_bubble:.1f}% measured vs {100 * planned_bubble:.1f}% planned"
                   + ("; the other ranks' job times vary too (noisy or shared machine), far less"
                      if noisy_others else ""))
        ok = False
    elif gap > bubble_tolerance:
        verdict = (f"SLOWER THAN PLAN: bubble {100 * measured_bubble:.1f}% measured vs {100 * planned_bubble:.1f}% "
                   f"planned with no single straggler (communication, launch overhead or clock alignment?)")
        ok = False
    else:
        verdict = (f"OK: bubble {100 * measured_bubble:.1f}% measured vs {100 * planned_bubble:.1f}% planned, "
                   f"no straggler" + (f", {len(late_rows)} job(s) slightly late" if late_rows else ""))
        ok = True
    present = {j.kind.value for _, _, j in plan.jobs()}
    fit_d = {"seconds_per_cost_unit": {k: v for k, v in fit.scale.items() if k in present}, "comm_s": fit.comm, "late_tolerance_s": tol,
             "straggler_threshold_s": straggler_threshold * m_plan}
    rep = CheckReport(schedule=plan.name, pp=plan.pp, dp=run.dp, steps=sorted({sr.step for sr in runs}),
                      planned_bubble=planned_bubble, measured_bubble=measured_bubble, planned_makespan_s=m_plan,
                      measured_makespan_s=meas_ms, stragglers=stragglers, late_jobs=len(late_rows), verdict=verdict,
                      ok=ok, per_device=per_device, per_rank=per_rank, late=late_rows[:50], fit=fit_d,
                      closed_form=closed, malformed_lines=run.malformed, clock_alignment=run.alignment,
                      clock_offsets_s=run.offsets, warnings=warnings, late_by_job=late_by_job)
    rep.planned_runs = [(sr, prep) for sr in runs]
    return rep


SINGLE_CAUSE_LATE_SHARE = 0.75
"""a noisy run still has a single cause when its clear outliers cause at least this share of the late jobs ..."""
SINGLE_CAUSE_IMPACT = 4.0
"""... and each of them costs the step at least this many times what the median other rank costs"""


def _single_cause(outliers: list[int], impacts: dict[int, list[float]], cause_count: dict[int, int]) -> bool:
    """Whether the clear outliers of a run where most ranks cost time explain its spread on their own: they cause
    most of the late jobs that have a cause, and each costs the step several times what a typical other rank
    costs (one rank 10x slower on a noisy machine is a straggler, not an unsteady run)."""
    if not outliers:
        return False
    others = [max(v) for r, v in impacts.items() if r not in outliers]
    typical = statistics.median(others) if others else 0.0
    if any(max(impacts[r]) < SINGLE_CAUSE_IMPACT * typical for r in outliers):
        return False
    caused = sum(cause_count.values())
    return caused > 0 and sum(cause_count.get(r, 0) for r in outliers) >= SINGLE_CAUSE_LATE_SHARE * caused


# ------------------------------------------------------------------------------------ closed form
def _closed_form_applies(plan: Schedule) -> bool:
    if plan.name not in CLOSED_FORM_SCHEDULES:
        return False
    if any(j.kind in (Kind.B, Kind.W) for _, _, j in plan.jobs()):
        return False
    return plan.vpp == 1 or plan.microbatches % plan.pp == 0


def closed_form_bubbles(name: str, pp: int, t_f: float, t_b: float) -> list[dict]:
    """The closed form's idle time per stage: before the first job, in the middle, after the last job."""
    if name not in CLOSED_FORM_SCHEDULES:
        raise ValueError(f"no closed form for {name!r}: known for {', '.join(CLOSED_FORM_SCHEDULES)}")
    out = []
    for s in range(pp):
        out.append({"stage": s, "lead": s * t_f, "middle": (pp - s - 1) * t_f + (pp - s - 1) * t_b,
                    "tail": s * t_b})
    return out


def closed_form(plan: Schedule, fit: Fit, runs: list[StepRun]) -> list[dict]:
    t_f = statistics.median(fit.expected("F", c) for c in range(plan.num_chunks))
    t_b = statistics.median(fit.expected("BW", c) for c in range(plan.num_chunks))
    rows = closed_form_bubbles(plan.name, plan.pp, t_f, t_b)
    meas: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
    for sr in runs:
        durs = _durations(sr)
        for d in range(plan.pp):
            lead = sr.start[d][0] - sr.t0
            tail = sr.t1 - sr.end[d][-1]
            mid = (sr.t1 - sr.t0) - sum(durs[d]) - lead - tail
            meas[d].append((lead, mid, tail))
    for row in rows:
        v = meas[row["stage"]]
        row["measured_lead"] = statistics.mean(x[0] for x in v)
        row["measured_middle"] = statistics.mean(x[1] for x in v)
        row["measured_tail"] = statistics.mean(x[2] for x in v)
    return rows
