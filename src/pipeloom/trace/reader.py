"""Read per-rank job logs and keep the profiled steps (no torch; clock alignment is :mod:`.clocks`).

Layouts (worker logs): ``LOGDIR/workerlog.<rank>`` (what ``pipeloom run --log-dir`` writes) or
``LOGDIR/machine<k>/workerlog.<rank>`` (logs copied from several machines). Each line is a
JSON object (``meta``, ``profile_start``, ``sync``, ``job``, ``step_end``, ``profile_stop``;
see docs/visualise.md) or the worker-log text form
``Profiler Info: Job (3), type = F, micro_batch_id = 3, job_start_time = S, job_end_time = E[, chunk = 1]``.
Malformed or truncated lines are counted and reported, never fatal; other text is ignored.

Clocks are aligned across machines and waits the timers covered are clipped by :mod:`.clocks`.
"""
from __future__ import annotations

import json
import math
import os
import re

from ..core.files import check_input
from ..core.ir import Placement, Schedule
from ..core.errors import ScheduleFormatError
from ..core.costs import Costs
from ..schedule import io as schedule_io
from . import sanity, torch_profile
from .clocks import align_clocks, clip_waits
from .run import LogError, LogJob, RankLog, RunLog
from .writer import LOG_NAME, PARTIAL_SUFFIX

_TEXT_RE = re.compile(
    r"Profiler Info:\s*Job\s*\((?P<id>-?\d+)\)\s*,\s*type\s*=\s*(?P<type>\w+)\s*,\s*micro_batch_id\s*=\s*(?P<mb>-?\d+)"
    r"\s*,\s*job_start_time\s*=\s*(?P<s>[-+0-9.eE]+)\s*,\s*job_end_time\s*=\s*(?P<e>[-+0-9.eE]+)"
    r"(?:\s*,\s*chunk\s*=\s*(?P<chunk>\d+))?")
_TYPE_MAP = {"f": "F", "forward": "F", "b": "B", "backward_b": "B", "w": "W", "backward_w": "W",
             "bw": "BW", "backward": "BW"}
_FILE_RE = re.compile("^" + re.escape(LOG_NAME.format(rank="@")).replace("@", r"(\d{1,9})")
                      + "(" + re.escape(PARTIAL_SUFFIX) + ")?$")
_MACHINE_RE = re.compile(r"^machine(\d+)$")
MAX_EXAMPLES = 5


# ---------------------------------------------------------------------------------------- files
def find_worker_logs(root: str) -> list[tuple[int | None, int, str]]:
    """``(machine or None, rank from the file name, path)`` for every worker log under ``root``."""
    if os.path.isfile(root):
        m = _FILE_RE.match(os.path.basename(root))
        return [(None, int(m.group(1)) if m else 0, root)]
    if not os.path.isdir(root):
        raise LogError(f"{root} is neither a directory nor a file; give the --log-dir of 'pipeloom run' or a "
                       f"directory of machine<k>/workerlog.<rank> files")
    out = []
    for name in sorted(os.listdir(root)):
        p = os.path.join(root, name)
        fm, mm = _FILE_RE.match(name), _MACHINE_RE.match(name)
        if fm and os.path.isfile(p):
            out.append((None, int(fm.group(1)), p))
        elif mm and os.path.isdir(p):
            for sub in sorted(os.listdir(p)):
                f2 = _FILE_RE.match(sub)
                if f2 and os.path.isfile(os.path.join(p, sub)):
                    out.append((int(mm.group(1)), int(f2.group(1)), os.path.join(p, sub)))
    # a rank's log and its .partial: keep the newer (a killed rank of a rerun leaves only a .partial)
    best: dict[tuple, tuple[int | None, int, str]] = {}
    for item in out:
        key = (item[0], item[1])
        if key not in best or os.path.getmtime(item[2]) > os.path.getmtime(best[key][2]):
            best[key] = item
    out = [best[k] for k in sorted(best, key=lambda k: (k[0] or 0, k[1]))]
    if not out:
        raise LogError(f"no worker logs in {root}: expected files workerlog.<rank> or machine<k>/workerlog.<rank> "
                       f"(pipeloom run --log-dir), or torch profiler traces (*.json, *.json.gz)")
    return out


def _num(x) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise ValueError("not a finite number")
    return float(x)


MAX_INDEX = (1 << 31) - 1
"""the largest rank, step, microbatch or chunk a log line may hold (larger is a malformed line: no key overflows)"""


def _int(x) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < 0 or x > MAX_INDEX:
        raise ValueError(f"not an integer in 0..{MAX_INDEX}")
    return x


def parse_file(path: str, machine: int | None, file_rank: int) -> RankLog:
    """Parse one worker log (both forms); never raises on bad lines."""
    log = RankLog(path=path, rank=file_rank, machine=machine or 0, local_rank=file_rank)
    starts, stops = [], []
    text_jobs: list[tuple[str, int, int | None, float, float]] = []
    check_input(path, "worker log")  # a regular file under the cap (core/files.py)
    try:
        fh = open(path, "rb")
    except OSError as e:
        raise LogError(f"cannot read {path}: {e.strerror}") from None
    with fh:
        for lineno, raw in enumerate(fh, 1):
            line = raw.decode("utf-8", errors="replace").strip()
            if not line:
                continue
            if line[0] == "[":  # '[INFO] ...' is framework text; a JSON array is a malformed record
                try:
                    json.loads(line)
                except ValueError:
                    continue
            if line[0] in "{[":
                try:
                    ev = json.loads(line)
                    if not isinstance(ev, dict) or not isinstance(ev.get("event"), str):
                        raise ValueError("no 'event' field")
                    _apply_event(log, ev, starts, stops)
                except (ValueError, TypeError, KeyError) as e:
                    log.malformed += 1
                    if len(log.examples) < MAX_EXAMPLES:
                        log.examples.append(f"{os.path.basename(path)}:{lineno}: {str(e)[:60]}: {line[:80]}")
                continue
            if "Profiler Info" in line:
                m = _TEXT_RE.search(line)
                kind = _TYPE_MAP.get(m.group("type").lower()) if m else None
                try:
                    if not m:
                        raise ValueError("unrecognised Profiler Info line")
                    s, e = float(m.group("s")), float(m.group("e"))
                    if not (math.isfinite(s) and math.isfinite(e)) or e < s or not 0 <= int(m.group("mb")) <= MAX_INDEX \
                            or int(m.group("chunk") or 0) > MAX_INDEX:
                        raise ValueError("bad times, micro batch or chunk")
                except ValueError as err:
                    log.malformed += 1
                    if len(log.examples) < MAX_EXAMPLES:
                        log.examples.append(f"{os.path.basename(path)}:{lineno}: {err}: {line[:80]}")
                    continue
                if kind is None:  # optimizer and other job types: not pipeline jobs
                    log.unknown_events[m.group("type")] += 1
                    continue
                ch = m.group("chunk")
                text_jobs.append((kind, int(m.group("mb")), int(ch) if ch is not None else None, s, e))
            # any other text (framework output) is ignored
    if machine is not None:  # the machine<k> directory wins over the meta line
        log.machine = machine
    if text_jobs:
        log.text_form = True
        _steps_from_text(log, text_jobs)
    # profiled window: meta profile_steps, else the profile_start/stop events
    if log.window is None and starts:
        log.window = (min(starts), max(stops) if stops else 1 << 60)
    if log.window is not None:
        a, b = log.window
        keep = [j for j in log.jobs if a <= j.step < b]
        log.dropped_jobs += len(log.jobs) - len(keep)
        log.jobs = keep
        log.syncs = {s: t for s, t in log.syncs.items() if a <= s < b}
    log.jobs.sort(key=lambda j: (j.start, j.end))
    return log


def _apply_event(log: RankLog, ev: dict, starts: list, stops: list) -> None:
    kind = ev["event"]
    if kind == "meta":
        log.meta = ev
        log.rank = _int(ev.get("rank", log.rank))
        log.local_rank = _int(ev.get("local_rank", log.local_rank))
        if ev.get("machine") is not None:
            log.machine = _int(ev["machine"])
        log.pp_rank = _int(ev["pp_rank"]) if ev.get("pp_rank") is not None else None
        log.dp_rank = _int(ev.get("dp_rank", 0) or 0)
        log.host = str(ev.get("host", ""))
        ps = ev.get("profile_steps")
        if ps is not None:
            if not (isinstance(ps, (list, tuple)) and len(ps) == 2):
                raise ValueError("profile_steps must be [start, stop]")
            log.window = (int(ps[0]), int(ps[1]))
    elif kind == "job":
        k = ev["kind"]
        if k not in ("F", "B", "W", "BW"):
            raise ValueError(f"job kind {k!r} is not F, B, W or BW")
        s, e = _num(ev["start"]), _num(ev["end"])
        if e < s:
            raise ValueError("job ends before it starts")
        done = ev.get("done")  # optional (CPU logs): ignored unless a time at or after the end
        ok = isinstance(done, (int, float)) and not isinstance(done, bool) and math.isfinite(done) and done >= e
        log.jobs.append(LogJob(k, _int(ev["mb"]), _int(ev["chunk"]), s, e, _int(ev["step"]), log.rank,
                               done=float(done) if ok else None))
    elif kind == "sync":
        log.syncs[_int(ev["step"])] = _num(ev["t"])
    elif kind == "step_end":
        log.step_ends[_int(ev["step"])] = _num(ev["t"])
    elif kind == "profile_start":
        starts.append(_int(ev["step"]))
    elif kind == "profile_stop":
        stops.append(_int(ev["step"]))
    else:
        log.unknown_events[kind] += 1


def _steps_from_text(log: RankLog, jobs: list[tuple[str, int, int | None, float, float]]) -> None:
    """Seed-003 rule: a step starts at forward micro_batch 0 (once a backward was seen since the last start)."""
    jobs.sort(key=lambda t: t[3])
    step, seen_backward = -1, True
    for kind, mb, ch, s, e in jobs:
        if kind == "F" and mb == 0 and seen_backward:
            step += 1
            seen_backward = False
        if kind != "F":
            seen_backward = True
        log.jobs.append(LogJob(kind, mb, ch if ch is not None else 0, s, e, max(step, 0), log.rank))


# ---------------------------------------------------------------------------------------- run
def read_logs(root: str, *, align: bool = True, source: str | None = None) -> RunLog:
    """Read every worker log under ``root`` into a :class:`RunLog` with aligned clocks. ``source``: "pipeloom"
    (job logs, "Profiler Info" text lines), "torch" (torch profiler traces) or None (whichever ``root`` holds)."""
    if source == "torch":
        ranks = torch_profile.read_traces(root)
    elif source == "pipeloom":
        ranks = [parse_file(p, mach, r) for mach, r, p in find_worker_logs(root)]
    else:
        ranks, source = _read_ranks(root)
    return run_of_ranks(ranks, root, source=source, align=align)


def run_of_ranks(ranks: list[RankLog], root: str, *, source: str = "pipeloom", align: bool = True) -> RunLog:
    """The :class:`RunLog` of per-rank logs however they were read (any trace format's reader ends here): one
    run checked, ranks numbered, the plan from the meta lines or inferred from the job order (``source``
    "torch": stages are global, as torch names them), clocks aligned and waits clipped."""
    sanity.check_files([r.path for r in ranks if source == "pipeloom"])
    _check_one_run(ranks, root)
    warnings: list[str] = [f"{r.path}: rank {r.rank}'s log is incomplete (the rank stopped before closing it)"
                           for r in ranks if r.path.endswith(PARTIAL_SUFFIX)]
    # global ranks: from meta; text logs without meta get (machine, file rank) order
    if len({r.rank for r in ranks}) != len(ranks):
        for i, r in enumerate(sorted(ranks, key=lambda r: (r.machine, r.local_rank))):
            r.rank = i
        warnings.append("rank numbers repeat across machines; ranks renumbered in (machine, file) order")
    ranks.sort(key=lambda r: r.rank)
    for r in ranks:
        for j in r.jobs:
            j.rank = r.rank
    if not any(r.jobs for r in ranks):
        bad = sum(r.malformed for r in ranks)
        raise LogError(f"no job records in the profiled steps of {len(ranks)} worker log(s) under {root}"
                       + (f" ({bad} malformed lines)" if bad else "")
                       + "; run with profiling on (pipeloom run --log-dir DIR --profile-steps A:B)")
    schedule, costs, inferred = _plan_from_meta(ranks, warnings)
    if schedule is None:
        schedule = torch_profile.infer_schedule(ranks) if source == "torch" else _infer_schedule(ranks)
        inferred = True
    sanity.check_plan(schedule, where="inferred from the job order: the logs have no meta line" if inferred
                      else f"meta line of {next(r.path for r in ranks if r.meta and r.meta.get('schedule'))}")
    pp = schedule.pp
    for r in ranks:
        if r.pp_rank is None:
            r.pp_rank = r.rank % pp
    dp = max(1, len({r.dp_rank for r in ranks}))
    steps = sorted({j.step for j in (j for r in ranks for j in r.jobs)})
    run = RunLog(root=root, ranks=ranks, schedule=schedule, costs=costs, pp=pp, dp=dp, steps=steps,
                 offsets={}, alignment="none", warnings=warnings, schedule_inferred=inferred)
    if align:
        align_clocks(run)
        clip_waits(run)
    for r in ranks:
        if r.malformed:
            warnings.append(f"{r.path}: {r.malformed} malformed line(s) skipped")
    return run


def _read_ranks(root: str) -> tuple[list[RankLog], str]:
    """Every rank's log under ``root`` and where they came from: "pipeloom" (job logs and worker-log text
    lines) or "torch" (torch profiler traces, when there are no worker logs)."""
    if os.path.isfile(root) and torch_profile.find_traces(root):
        return torch_profile.read_traces(root), "torch"
    try:
        files = find_worker_logs(root)
    except LogError:
        if os.path.isdir(root) and torch_profile.find_traces(root):
            return torch_profile.read_traces(root), "torch"
        raise
    return [parse_file(p, mach, r) for mach, r, p in files], "pipeloom"


def _run_of(r: RankLog) -> tuple:
    """What every rank of one run shares in its meta line: world size, pp, dp and the schedule."""
    m = r.meta
    sched = m.get("schedule") if isinstance(m.get("schedule"), dict) else {}
    return (m.get("world_size"), m.get("pp"), m.get("dp"), sched.get("name"), sched.get("microbatches"),
            sched.get("devices"))


def _describe(r: RankLog) -> str:
    ws, pp, dp, name, m, _ = _run_of(r)
    return f"{name} pp={pp} dp={dp} m={m}, world size {ws}"


def _check_one_run(ranks: list[RankLog], root: str) -> None:
    """Logs with meta lines must come from one run: the same run shape and each global rank once
    (mixing the logs of two runs would report a wrong plan, wrong bubbles and bogus stragglers)."""
    metas = [r for r in ranks if r.meta]
    for r in metas[1:]:
        if _run_of(r) != _run_of(metas[0]):
            raise LogError(f"{root} mixes the logs of different runs: {metas[0].path} ({_describe(metas[0])}) and "
                           f"{r.path} ({_describe(r)}); give the log directory of one run")
    ids = {r.meta.get("run_id") for r in metas} - {None}  # logs written before run ids have none
    if len(ids) > 1:
        a = next(r for r in metas if r.meta.get("run_id"))
        b = next(r for r in metas if r.meta.get("run_id") not in (None, a.meta["run_id"]))
        raise LogError(f"{root} mixes the logs of different runs of the same shape: {a.path} (run "
                       f"{a.meta['run_id']}) and {b.path} (run {b.meta['run_id']}); give the log directory of one run")
    seen: dict[int, str] = {}
    for r in metas:
        if r.rank in seen:
            raise LogError(f"{root} holds two logs of rank {r.rank}: {seen[r.rank]} and {r.path} (two runs mixed, "
                           f"or one log copied twice); keep one log per rank")
        seen[r.rank] = r.path
    ws = metas[0].meta.get("world_size") if metas else None
    if isinstance(ws, int) and any(r.rank >= ws for r in metas):
        bad = next(r for r in metas if r.rank >= ws)
        raise LogError(f"{bad.path} is the log of rank {bad.rank}, but the run's world size is {ws}")


def _plan_from_meta(ranks: list[RankLog], warnings: list[str]) -> tuple[Schedule | None, Costs | None, bool]:
    metas = [r.meta for r in ranks if r.meta and r.meta.get("schedule")]
    if not metas:
        return None, None, False
    try:
        if not isinstance(metas[0]["schedule"], dict):
            raise ScheduleFormatError(f"'schedule' is a {type(metas[0]['schedule']).__name__}, not a schedule object")
        sched = schedule_io.from_dict(metas[0]["schedule"])
    except (ScheduleFormatError, ValueError, TypeError, AttributeError, KeyError) as e:
        path = next(r.path for r in ranks if r.meta and r.meta.get("schedule"))
        raise LogError(f"the plan in the logs is invalid (meta line of {path}): {e}") from None
    if any(m["schedule"].get("devices") != metas[0]["schedule"].get("devices") for m in metas[1:]):
        warnings.append("ranks disagree on the schedule in their meta lines; using rank "
                        f"{ranks[0].rank}'s")
    costs = None
    cd = metas[0].get("costs")
    if isinstance(cd, dict):
        try:
            costs = Costs(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in cd.items()
                             if k in ("F", "B", "W", "comm", "overlap")})
        except (TypeError, ValueError) as e:
            warnings.append(f"meta costs unreadable ({e}); durations fitted from the jobs")
    return sched, costs, False


def _infer_schedule(ranks: list[RankLog]) -> Schedule:
    """Text logs carry no plan: take each rank as one pipeline stage and its first profiled step's order."""
    pp = len(ranks)
    for i, r in enumerate(sorted(ranks, key=lambda r: r.rank)):
        r.pp_rank = i
    vpp = 1 + max((j.chunk for r in ranks for j in r.jobs), default=0)
    devices = []
    for r in sorted(ranks, key=lambda r: r.pp_rank):
        for j in r.jobs:  # local chunk -> global chunk (interleaved placement)
            j.chunk = j.chunk * pp + r.pp_rank
        first = min((j.step for j in r.jobs), default=0)
        devices.append([j.job() for j in r.jobs if j.step == first])
    m = 1 + max((j.mb for r in ranks for j in r.jobs), default=0)
    return Schedule("measured-order", pp, vpp, m, Placement.INTERLEAVED, devices,
                    meta={"inferred": "from the first profiled step of text logs"})


# ---------------------------------------------------------------------------------------- views
def step_windows(run: RunLog, dp_rank: int | None = None) -> dict[int, tuple[float, float]]:
    """Per step: (first job start, last job end) over the ranks (of one pipeline when dp_rank is given)."""
    out: dict[int, tuple[float, float]] = {}
    for r in run.ranks:
        if dp_rank is not None and r.dp_rank != dp_rank:
            continue
        for j in r.jobs:
            a, b = out.get(j.step, (j.start, j.end))
            out[j.step] = (min(a, j.start), max(b, j.end))
    return dict(sorted(out.items()))
