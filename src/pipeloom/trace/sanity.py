"""What cannot happen in real worker logs: detected and said, never turned into a verdict (no torch).

``pipeloom check`` compares measured times with a plan; on logs whose times cannot be real (every
timestamp equal, one rank's clock hours off on a single machine, two unrelated runs in one directory)
that comparison produces confident nonsense ("both ranks are stragglers", "step +97,710,639%"). The
checks here run first and raise a one-line :class:`~pipeloom.trace.run.LogError` naming what is
impossible, so no verdict is printed:

- files that are binary data, not text logs;
- a plan in the meta lines that is not a schedule, or not a valid one;
- jobs that take no time: most jobs with ``end == start`` (a clock that does not advance);
- in a step, a rank whose jobs lie far away from the other ranks' (after clock alignment): ranks of
  one step run between the same barriers, so their windows overlap; a gap of more than
  :data:`GAP_STEPS` step lengths (and :data:`MIN_GAP_S`) is a clock that is off, or logs of two runs;
- ``sync`` events of one step (taken right after a barrier) that disagree by more than the step;
- a job or step lasting longer than :data:`MAX_STEP_S` (a timestamp that is not a time).
"""
from __future__ import annotations

import statistics
from collections import defaultdict

from ..core.files import check_input
from .run import LogError, RunLog

#: a rank's step window may start at most this many median step lengths away from the others' (and at
#: least MIN_GAP_S seconds are always tolerated: launch jitter, a slow first step)
GAP_STEPS = 10.0
MIN_GAP_S = 1.0
#: share of the jobs that may last exactly 0 s before the times are called not real
MAX_ZERO_SHARE = 0.5
#: no profiled step of a real run lasts a day
MAX_STEP_S = 86_400.0
#: bytes read from the start of a log to tell text from binary data
SNIFF_BYTES = 8192


def check_files(paths: list[str]) -> None:
    """Refuse a 'worker log' that is binary data (NUL bytes, or mostly not UTF-8)."""
    for p in paths:
        check_input(p, "worker log")  # a regular file under the cap, before it is opened (core/files.py)
        try:
            with open(p, "rb") as f:
                head = f.read(SNIFF_BYTES)
        except OSError:
            continue  # the reader reports unreadable files itself
        if not head:
            continue
        try:
            head.decode("utf-8")
            text = True
        except UnicodeDecodeError as e:
            text = e.start >= len(head) - 4  # a multi-byte character cut at the end of the sample
        if b"\x00" in head or not text:
            raise LogError(f"{p} is binary data, not a worker log (JSON lines written by 'pipeloom run "
                           f"--log-dir', or 'Profiler Info' text lines)")


def check_plan(schedule, *, where: str) -> None:
    """Refuse a plan from the logs that is not a valid schedule (``where``: which file it came from)."""
    from ..schedule.validate import summary, validate

    v = [x for x in validate(schedule) if x.kind != "memory"]
    if v:
        raise LogError(f"the plan in the logs is invalid ({where}): {summary(v)}")


def check_times(run: RunLog) -> None:
    """Raise :class:`LogError` when the logged times cannot be real (module docstring)."""
    jobs = [j for r in run.ranks for j in r.jobs]
    if not jobs:
        return
    zero = sum(1 for j in jobs if j.end - j.start <= 0.0)
    if zero > MAX_ZERO_SHARE * len(jobs):
        raise LogError(f"{run.root}: {zero} of {len(jobs)} jobs last 0 s (end == start): these timestamps cannot "
                       f"be real (a clock that does not advance, or edited logs); no verdict")
    longest = max(jobs, key=lambda j: j.end - j.start)
    if longest.end - longest.start > MAX_STEP_S:
        raise LogError(f"{run.root}: job {longest.kind}{longest.mb}.{longest.chunk} of rank {longest.rank} in step "
                       f"{longest.step} lasts {longest.end - longest.start:.3g} s: not a real time; no verdict")
    one_clock = len({r.domain for r in run.ranks}) == 1
    how = ("all ranks are on one machine, so they share one clock" if one_clock
           else f"after clock alignment ({run.alignment})")
    windows: dict[int, dict[int, tuple[float, float]]] = defaultdict(dict)  # step -> rank -> (first, last)
    for r in run.ranks:
        for j in r.jobs:
            a, b = windows[j.step].get(r.rank, (j.start, j.end))
            windows[j.step][r.rank] = (min(a, j.start), max(b, j.end))
    for step, by_rank in sorted(windows.items()):
        spans = [b - a for a, b in by_rank.values()]
        length = statistics.median(spans)
        if max(spans) > MAX_STEP_S:
            rank = max(by_rank, key=lambda k: by_rank[k][1] - by_rank[k][0])
            raise LogError(f"{run.root}: rank {rank}'s step {step} spans {max(spans):.3g} s: not a real time; "
                           f"no verdict")
        if len(by_rank) < 2:
            continue
        order = sorted(by_rank, key=lambda k: by_rank[k][0])
        gap, i = max((by_rank[order[i + 1]][0] - by_rank[order[i]][0], i) for i in range(len(order) - 1))
        if gap > max(GAP_STEPS * length, MIN_GAP_S):
            early, late = sorted(order[:i + 1]), sorted(order[i + 1:])
            raise LogError(f"{run.root}: in step {step} rank(s) {_ranks(late)} start {_dur(gap)} after rank(s) "
                           f"{_ranks(early)}, but a step lasts about {_dur(length)}; {how}, and the ranks of one "
                           f"step run between the same barriers: a clock that is off, or the logs of different "
                           f"runs (give each run its own directory); no verdict")
    syncs: dict[int, dict[int, float]] = defaultdict(dict)
    for r in run.ranks:
        for s, t in r.syncs.items():
            syncs[s][r.rank] = t
    for s, by_rank in sorted(syncs.items()):
        if len(by_rank) < 2 or s not in windows:
            continue
        length = statistics.median(b - a for a, b in windows[s].values())
        spread = max(by_rank.values()) - min(by_rank.values())
        if spread > max(length, MIN_GAP_S):
            lo, hi = min(by_rank, key=by_rank.get), max(by_rank, key=by_rank.get)
            raise LogError(f"{run.root}: the sync events of step {s} (taken right after a barrier) disagree by "
                           f"{_dur(spread)} (ranks {lo} and {hi}), more than the step lasts ({_dur(length)}); "
                           f"{how}: these clocks cannot be trusted; no verdict")


def _dur(seconds: float) -> str:
    s = abs(seconds)
    if s >= 3600:
        return f"{s / 3600:.3g} h"
    if s >= 60:
        return f"{s / 60:.3g} min"
    if s >= 1:
        return f"{s:.3g} s"
    return f"{s * 1e3:.3g} ms"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (f" (+{len(ranks) - 8} more)" if len(ranks) > 8 else "")
