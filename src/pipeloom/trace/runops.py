"""Run logs as op traces: one input model for the what-if analysis (no torch).

:func:`optrace_of_run` turns a :class:`~pipeloom.trace.run.RunLog` (pipeloom's job logs, worker-log
text lines, torch profiler traces: whatever :func:`~pipeloom.trace.reader.read_logs` read, clocks
aligned and waits clipped) into the :class:`~pipeloom.trace.ops.optrace.OpTrace` that op-trace files are
read into, so :mod:`.ops.whatif`, :mod:`.ops.verdicts` and :mod:`.ops.opcheck` have one input whatever wrote
the run; :func:`check_run_whatif` runs that analysis on a run log (with what only a run log tells: the layers
each rank held, its machines, :func:`handoff_waits`).

Mapping, one op row per logged job:

=========  ==========================================================================================
column     from the log
=========  ==========================================================================================
optype     F -> ``forward-compute``; B (input-grad half of a split backward) and BW (whole backward)
           -> ``backward-compute``; W (weight-grad half) -> ``backward-weight-compute`` (a compute op of
           its worker without pipeline edges: no other stage waits for a W)
dp_rank    the rank's data-parallel coordinate (meta line ``dp_rank``; 0 for text logs, torch traces)
stage      the rank's pipeline rank (meta ``pp_rank``; text logs and torch traces: the rank order)
rank       the global rank
step       the logged step
start_ts   job start in ms after the run's first job (aligned clocks), ``duration`` end - start in ms
seq_id     n-th job of that optype of the rank in the step (start order)
gmc        the job's global chunk: the model-order index, whatever the placement (a V placement's
           rank 0 holds chunks 0 and 2pp-1), so the what-if pipeline edges F(mb, g-1) -> F(mb, g) and
           B(mb, g+1) -> B(mb, g) follow the model, not the rank order
mc         the chunk's position among its rank's chunks (``Schedule.chunks_of``)
mb_id      the microbatch
=========  ==========================================================================================

pipeloom's CPU logs also carry each job's ``done`` (its outputs handed to the transport, the receives they
unblock posted): the time from the job's end to ``done`` (at most to the next job's start, none after a
rank's last job of a step) becomes a ``forward-send`` (after an F) or ``backward-send`` (after a B, BW
or W) op of the worker, with the job's mb and chunk; nothing pairs these with receives (there are no recv
rows), so they are the worker's own time, like an opaque op.

The logs carry no P2P or collective records (the job lines bracket the compute only); the transfer
and waiting time between jobs becomes the launch gap of the what-if model (replayed for the replay
error, left out of ``T_base`` and ``T_ideal``). Jobs of one rank logged over one shared interval (an
overlapped pair: DualPipe's F & B in the simulator's logs, torch's ``OVERLAP_F_B`` span) get one ``pair`` id:
the what-if model replays them as one unit that starts when both are ready and takes the longer of the two;
any other overlap on a rank starts the later job when the earlier one ends (counted in the warnings),
since the what-if model runs the ops of a worker one at a time.
"""
from __future__ import annotations

import statistics
from collections import defaultdict

import numpy as np

from ..sim.replay import dependencies, produces
from .ops.opcheck import check_ops, default_out_dir
from .ops.optrace import OpTrace
from .ops.whatif import WEIGHT_GRAD_OP
from .run import RunLog

OPTYPE_OF_KIND = {"F": "forward-compute", "B": "backward-compute", "BW": "backward-compute", "W": WEIGHT_GRAD_OP}
"""the op type of each pipeloom job kind"""
VARIANT_OF_KIND = {"F": 0, "B": 0, "BW": 1, "W": 0}
"""B and BW are both backward-compute, with a typical duration each (a BW also computes the weight grads)"""


def optrace_of_run(run: RunLog) -> OpTrace:
    """The jobs of ``run`` as op-trace rows (see the module docstring); times in ms."""
    optypes = list(dict.fromkeys(OPTYPE_OF_KIND.values())) + ["forward-send", "backward-send"]
    code = {k: optypes.index(v) for k, v in OPTYPE_OF_KIND.items()} | {"send-F": len(optypes) - 2,
                                                                       "send-B": len(optypes) - 1}
    sched = run.schedule
    pp = run.pp
    t0 = run.t0()
    cols: dict[str, list] = defaultdict(list)
    shared = clamped = npair = 0
    for r in run.ranks:
        stage = r.pp_rank if r.pp_rank is not None else r.rank % pp
        local = {c: i for i, c in enumerate(sched.chunks_of(stage))} if sched is not None else {}
        by_step: dict[int, list] = defaultdict(list)
        for j in r.jobs:
            by_step[j.step].append(j)
        for step, jobs in sorted(by_step.items()):
            jobs.sort(key=lambda j: (j.start, j.end))
            spans, pairs, sh, cl = _serialise([(j.start, j.end) for j in jobs])
            shared, clamped = shared + sh, clamped + cl
            seen: dict[int, int] = defaultdict(int)

            def row(c: int, j, s: float, e: float, pair: int, variant: int) -> None:
                cols["pair"].append(pair)
                cols["dp"].append(r.dp_rank)
                cols["stage"].append(stage)
                cols["rank"].append(r.rank)
                cols["step"].append(step)
                cols["op"].append(c)
                cols["start"].append((s - t0) * 1e3)
                cols["dur"].append((e - s) * 1e3)
                cols["seq"].append(seen[c])
                seen[c] += 1
                cols["mc"].append(local.get(j.chunk, -1))
                cols["gmc"].append(j.chunk)
                cols["mb"].append(j.mb)
                cols["variant"].append(variant)

            for i, (j, (s, e), pr) in enumerate(zip(jobs, spans, pairs)):
                row(code[j.kind], j, s, e, pr + npair if pr >= 0 else -1, VARIANT_OF_KIND[j.kind])
                if j.done is not None and pr < 0 and i + 1 < len(jobs):  # handing the outputs over: a send
                    send_end = min(j.done, spans[i + 1][0])
                    if send_end > e:
                        row(code["send-" + ("F" if j.kind == "F" else "B")], j, e, send_end, -1, 0)
            npair += max(pairs, default=-1) + 1
    i64 = {k: np.asarray(cols[k], dtype=np.int64) for k in ("dp", "stage", "rank", "step", "op", "seq", "mc", "gmc",
                                                            "mb", "pair", "variant")}
    dp_size = max(run.dp, int(i64["dp"].max()) + 1 if len(i64["dp"]) else 1)
    vpp = sched.vpp if sched is not None else 1
    sizes = {"dp_size": dp_size, "pp_size": pp, "tp_size": 1, "vpp_size": vpp, "world_size": dp_size * pp}
    warnings = []
    have = set(zip(i64["dp"].tolist(), i64["stage"].tolist()))
    missing = [(d, st) for d in range(dp_size) for st in range(pp) if (d, st) not in have]
    if missing:
        warnings.append(f"no jobs of worker(s) {', '.join(f'dp {d} / pp {st}' for d, st in missing[:4])}"
                        f"{' ...' if len(missing) > 4 else ''} (log missing?): the ops that wait for them are "
                        f"replayed with their measured waits as launch gaps")
    if shared:
        warnings.append(f"{shared} job(s) shared one logged interval with another job of their rank (overlapped "
                        f"pairs): each pair is replayed as one unit that takes the longer of its two jobs")
    if clamped:
        warnings.append(f"{clamped} job(s) started before the previous job of their rank ended; the what-if model "
                        f"starts them when it ended")
    return OpTrace(path=run.root, dp=i64["dp"], stage=i64["stage"], rank=i64["rank"], step=i64["step"], op=i64["op"],
                   optypes=optypes, start=np.asarray(cols["start"], dtype=np.float64),
                   dur=np.asarray(cols["dur"], dtype=np.float64), seq=i64["seq"], mc=i64["mc"], gmc=i64["gmc"],
                   mb=i64["mb"], sizes=sizes, inferred=[], malformed=0, examples=[], warnings=warnings,
                   time_unit="ms", rows=len(cols["dur"]), pair=i64["pair"] if shared else None,
                   variant=i64["variant"])


def _serialise(spans: list[tuple[float, float]]) -> tuple[list[tuple[float, float]], list[int], int, int]:
    """Make one rank's job intervals (sorted by start) run one after another: a run of identical intervals is
    one overlapped pair (same pair number, interval kept), any other overlap starts at the previous end.
    Returns (intervals, pair number or -1 per job, jobs in pairs, jobs clamped)."""
    out: list[tuple[float, float]] = []
    pairs: list[int] = []
    shared = clamped = npair = 0
    i = 0
    while i < len(spans):
        k = i + 1
        while k < len(spans) and spans[k] == spans[i]:
            k += 1
        a, b = spans[i]
        if out and a < out[-1][1]:
            clamped += k - i
            a = out[-1][1]
            b = max(a, b)
        out += [(a, b)] * (k - i)
        if k - i > 1:
            shared += k - i
            pairs += [npair] * (k - i)
            npair += 1
        else:
            pairs.append(-1)
        i = k
    return out, pairs, shared, clamped


def check_run_whatif(run, *, steps: str | None = None, threshold: float = 0.05, layers: int | None = None,
                     out_dir: str | None = None, pictures: bool = True, progress=None) -> dict:
    """The same analysis of a run log (:class:`~pipeloom.trace.run.RunLog`: pipeloom's job logs, worker-log text
    logs, torch profiler traces), through :func:`~pipeloom.trace.runops.optrace_of_run`; pictures go to
    ``out_dir`` (default ``LOGDIR.whatif/`` beside the log directory)."""
    tr = optrace_of_run(run)
    machines = {(rk.dp_rank, rk.pp_rank if rk.pp_rank is not None else rk.rank % run.pp): rk.machine
                for rk in run.ranks}
    d = check_ops(tr, steps=steps, threshold=threshold, layers=layers, out_dir=out_dir or default_out_dir(run.root),
                  pictures=pictures, progress=progress, layers_per_stage=run_layers_per_stage(run), machines=machines,
                  handoffs=handoff_waits(run))
    d["source"] = "run logs"
    return d


def handoff_waits(run) -> dict[tuple[int, int, str], float]:
    """Who waited for whom at each hand-off between ranks: ``(dp rank, stage, "forward" | "backward")`` -> the share
    of that worker's outputs (of F jobs; of B, BW, W jobs) whose consumer on another rank sat idle until they came
    (its start after the end of its previous job, ``done`` when logged, by more than a tenth of the median job).
    A slow link keeps its consumers waiting (share near 1); a sender that only waits for a late receiver to take
    its output does not (share near 0): the verdicts tell the two apart with it."""
    sched = run.schedule
    if sched is None:
        return {}
    nc = sched.num_chunks
    durs = [j.end - j.start for j in run.jobs()]
    tol = 0.1 * statistics.median(durs) if durs else 0.0
    prod: dict[tuple, tuple] = {}
    for r in run.ranks:
        for j in r.jobs:
            for ev in produces(j.job()):
                prod[(r.dp_rank, j.step) + ev] = (r, j)
    counts: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for r in run.ranks:
        jobs = sorted(r.jobs, key=lambda j: (j.start, j.end))
        for prev, c in zip(jobs, jobs[1:]):
            if prev.step != c.step or c.chunk >= nc:
                continue
            srcs = [prod.get((r.dp_rank, c.step) + ev) for ev in dependencies(c.job(), nc)]
            srcs = [x for x in srcs if x is not None and x[0] is not r]
            if not srcs:
                continue
            pr, pj = max(srcs, key=lambda x: x[1].done if x[1].done is not None else x[1].end)
            free = prev.done if prev.done is not None else prev.end
            key = (pr.dp_rank, pr.pp_rank if pr.pp_rank is not None else pr.rank % run.pp,
                   "forward" if pj.kind == "F" else "backward")
            counts[key][0] += int(c.start - c.wait - free > tol)
            counts[key][1] += 1
    return {k: w / n for k, (w, n) in counts.items() if n}


def run_layers_per_stage(run) -> list[int] | None:
    """The decoder layers each pipeline rank held in the run (pipeloom's logs: the meta line's ``model``
    entry, ``layers_per_chunk`` summed over the rank's chunks), or None when the logs do not say."""
    meta = next((rk.meta for rk in run.ranks if rk.meta), None) or {}
    per_chunk = (meta.get("model") or {}).get("layers_per_chunk") if isinstance(meta.get("model"), dict) else None
    sched = run.schedule
    if (sched is None or not isinstance(per_chunk, list) or len(per_chunk) != sched.num_chunks
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in per_chunk)):
        return None
    return [sum(per_chunk[c] for c in sched.chunks_of(p)) for p in range(sched.pp)]
