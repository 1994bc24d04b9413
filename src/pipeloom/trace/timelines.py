"""A measured run and its plan as timelines to draw (ms from the first job; no torch).

:func:`measured_timeline` draws the logged jobs (late parts and waits marked), :func:`planned_timeline` the plan
replayed with the durations :func:`~pipeloom.trace.check.check_run` fitted, placed at each measured step's start;
:mod:`pipeloom.viz` renders either as a Gantt picture, HTML or a Perfetto trace.
"""
from __future__ import annotations

from collections import defaultdict

from ..viz.timeline import Bar, Row, Timeline, memory_curve, memory_deltas
from .check import CheckReport
from .run import LogJob, RunLog


def _row_label(run: RunLog, r) -> str:
    lab = f"rank {r.rank}"
    if len(run.machines) > 1:
        lab = f"m{r.machine} " + lab
    if run.dp > 1:
        lab += f" (pp{r.pp_rank} dp{r.dp_rank})"
    return lab


def measured_timeline(run: RunLog, *, step: int | None = None, late: dict | None = None,
                      title: str | None = None) -> Timeline:
    """Timeline of the measured run in milliseconds from the first job (optionally one step)."""
    t0 = min((j.start for j in run.jobs() if step is None or j.step == step), default=0.0)
    plan = run.schedule
    rows, steps = [], {}
    for r in sorted(run.ranks, key=lambda r: (r.dp_rank, r.pp_rank, r.rank)):
        local = {c: i for i, c in enumerate(plan.chunks_of(r.pp_rank))} if plan else {}
        bars: list[Bar] = []
        mem: list = []
        by_step: dict[int, list[LogJob]] = defaultdict(list)
        for j in r.jobs:
            if step is None or j.step == step:
                by_step[j.step].append(j)
        for s, js in sorted(by_step.items()):
            sb = []
            for j in sorted(js, key=lambda j: j.start):
                lt = (late or {}).get((r.rank, j.step, f"{j.kind}{j.mb}.{j.chunk}"), 0.0)
                sb.append(Bar(j.kind, j.mb, j.chunk, local.get(j.chunk, 0), (j.start - t0) * 1e3,
                              (j.end - t0) * 1e3, step=j.step, late=lt * 1e3, wait=j.wait * 1e3))
            if plan:
                deltas = memory_deltas([(b.kind, b.chunk) for b in sb], plan.num_chunks, plan.vpp)
                mem += memory_curve(sb, deltas)
            bars += sb
            a, b = sb[0].start, sb[-1].end
            lo, hi = steps.get(s, (a, b))
            steps[s] = (min(lo, a), max(hi, b))
        rows.append(Row(label=_row_label(run, r), bars=bars, memory=mem, device=r.pp_rank or 0, rank=r.rank,
                        machine=r.machine))
    step_list = [(s, a, b) for s, (a, b) in sorted(steps.items())]
    t1 = max((b for _, _, b in step_list), default=1.0)
    name = plan.name if plan else "run"
    head = title or (f"{name}  pp={run.pp} dp={run.dp}  measured" + (f", step {step}" if step is not None else
                                                                     f", steps {', '.join(map(str, sorted(steps)))}"))
    sub = (f"{len(run.ranks)} ranks on {len(run.machines)} machine(s); clocks aligned by {run.alignment}; "
           f"{run.malformed} malformed line(s) skipped")
    return Timeline(title=head, rows=rows, vpp=plan.vpp if plan else 1, unit="ms", t0=0.0, t1=t1,
                    steps=step_list, subtitle=sub)


def planned_timeline(run: RunLog, report: CheckReport, *, step: int | None = None) -> Timeline:
    """The plan replayed with the fitted durations, placed at each measured step's start (ms)."""
    plan = run.schedule
    t0 = min((j.start for j in run.jobs() if step is None or j.step == step), default=0.0)
    rows: dict[int, Row] = {}
    steps = {}
    for sr, prep in report.planned_runs:
        if step is not None and sr.step != step:
            continue
        base = (sr.t0 - t0) * 1e3
        for d, seq in enumerate(plan.devices):
            rank = sr.ranks[d]
            row = rows.get(rank)
            if row is None:
                row = rows[rank] = Row(label=f"plan rank {rank}", device=d, rank=rank)
            local = {c: i for i, c in enumerate(plan.chunks_of(d))}
            sb = [Bar(j.kind.value, j.mb, j.chunk, local.get(j.chunk, 0), base + prep.start[d][i] * 1e3,
                      base + prep.end[d][i] * 1e3, step=sr.step) for i, j in enumerate(seq)]
            row.memory += memory_curve(sb, memory_deltas([(b.kind, b.chunk) for b in sb], plan.num_chunks, plan.vpp))
            row.bars += sb
        steps[sr.step] = (base, base + prep.makespan * 1e3)
    step_list = [(s, a, b) for s, (a, b) in sorted(steps.items())]
    return Timeline(title=f"{plan.name}  planned (fitted durations)", rows=[rows[k] for k in sorted(rows)],
                    vpp=plan.vpp, unit="ms", t0=0.0, t1=max((b for _, _, b in step_list), default=1.0),
                    steps=step_list)
