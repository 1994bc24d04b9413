"""Read torch profiler traces of a torch.distributed.pipelining run as a pipeloom run (no torch needed).

torch's pipelining runtime wraps every action in ``record_function("PP:<action>")`` (``PP:1F0`` =
forward of microbatch 0 on stage 1, ``PP:0I3``, ``PP:(0F3;3B1)OVERLAP_F_B``); the single-stage
``ScheduleGPipe`` and ``Schedule1F1B`` label theirs ``Forward {i}`` / ``Backward {i}`` (stage = the
rank's pipeline rank). A torch profiler run writes one Chrome/Kineto trace JSON per rank per profiled
step (torchtitan: ``profile_trace/iteration_<N>/rank<R>_trace.json``), plain or ``.gz``.

:func:`find_traces` finds them under a directory: the rank comes from the trace's
``distributedInfo.rank``, else from ``rank<R>`` in the file name; the step from an ``iteration_<N>``
folder, else from the job order (a step starts at stage 0's forward of microbatch 0 once a backward
was seen, the worker-log rule). :func:`read_trace` turns one file into a :class:`~pipeloom.trace.reader.RankLog`
of jobs in pipeloom's vocabulary (torch ``I`` = pipeloom ``B``, ``B`` = ``BW``), so that
:func:`pipeloom.trace.reader.read_logs` gives the same run model, pictures and checks as for
pipeloom's own logs. torch's ``PP:<stage>RECV_F<mb>`` / ``RECV_B`` actions only post a receive; the action
that needs the data waits for it inside its own span, so the arrival (the end of the ``gloo:recv`` /
``nccl:recv`` event the RECV action started) is cut off the front of that action (``LogJob.wait``). Other
events are ignored.

GPU runs: with CUDA activities profiled, every ``record_function`` span appears twice, on the CPU (category
``user_annotation``: when the kernels were launched) and on the GPU stream (``gpu_user_annotation``: from the
first to the last kernel the action ran, the device time). When a trace has the GPU spans, the jobs are
those (nothing waits inside a GPU span: the stream starts the action's kernels once its input is there) and
the CPU ones are dropped, so a job is never counted twice.

Data parallelism (torchtitan's FSDP x PP, any dp x pp run): stages are global, so the ranks that ran the
same stages form one pipeline rank (``pp_rank`` = the lowest stage they ran) and are its dp replicas
(``dp_rank`` = their order by global rank); :func:`infer_schedule` reads the plan from the dp-0 replica.
"""
from __future__ import annotations

import bisect
import json
import os
import re

from ..core.files import read_input
from ..core.ir import Placement, Schedule, device_of
from .run import LogError, LogJob, RankLog

PP_COMPUTE = re.compile(r"^PP:(\d{1,9})(F|I|W|B)(\d{1,9})$")
"""a compute action's span: ``PP:<stage><F|I|W|B><microbatch>`` (numbers of at most 9 digits: every key fits an
index; a longer one is no action)"""
_RECV = re.compile(r"^PP:(\d{1,9})RECV_(F|B)(\d{1,9})$")
_PP_OVERLAP = re.compile(r"^PP:\((.*)\)OVERLAP_F_B$")
_SINGLE = re.compile(r"^(Forward|Backward) (\d{1,9})$")
_KIND = {"F": "F", "I": "B", "W": "W", "B": "BW"}
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d{1,9})(?!\d)", re.I)
_ITERATION = re.compile(r"^iteration_(\d{1,9})$")
_TRACE_NAME = re.compile(r"\.json(\.gz)?$", re.I)


def load_trace(path: str) -> dict:
    """One torch profiler trace (Chrome/Kineto JSON, plain or .gz) as a dict; a one-line LogError otherwise."""
    text = read_input(path, "torch profiler trace", gzip_ok=True)  # bounded, regular files only (core/files.py)
    try:
        data = json.loads(text)
    except (OSError, EOFError) as e:
        raise LogError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise LogError(f"{path} is not a torch profiler trace (not JSON: {str(e)[:60]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise LogError(f"{path} is not a torch profiler trace (no traceEvents list)")
    return data


def find_traces(root: str) -> list[tuple[str, int | None]]:
    """``(path, step or None)`` of every ``*.json``/``*.json.gz`` file under ``root`` (and its ``iteration_<N>``
    folders) that looks like a trace; an empty list when there is none."""
    if os.path.isfile(root):
        return [(root, None)] if _TRACE_NAME.search(root) else []
    out = []
    for dirpath, dirnames, files in os.walk(root):
        depth = os.path.relpath(dirpath, root).count(os.sep)
        if depth >= 2:
            dirnames[:] = []
        m = _ITERATION.match(os.path.basename(dirpath))
        step = int(m.group(1)) if m else None
        out += [(os.path.join(dirpath, f), step) for f in sorted(files) if _TRACE_NAME.search(f)]
    return sorted(out)


def complete_events(events: list):
    """``(name, start, duration, event)`` of every complete (``ph: X``) event with a name and numeric times, in
    the trace's units (microseconds); anything else is skipped."""
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X" or not isinstance(ev.get("name"), str):
            continue
        try:
            t0, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            continue
        yield ev["name"], t0, dur, ev


def trace_rank(data: dict, path: str, order: int) -> int:
    """A trace's rank: its ``distributedInfo.rank``, else ``rank<R>`` in the file name, else ``order``."""
    info = data.get("distributedInfo") or {}
    if isinstance(info.get("rank"), int) and not isinstance(info["rank"], bool) and 0 <= info["rank"] < 1 << 31:
        return info["rank"]
    m = _RANK_IN_NAME.search(os.path.basename(path))
    return int(m.group(1)) if m else order


def _arrivals(events: list) -> dict[tuple[int, str, int], float]:
    """(stage, "F" | "B", mb) -> when the input that ``PP:<stage>RECV_<F|B><mb>`` posted arrived (µs): the latest
    end of a recv event (``gloo:recv``, ``nccl:recv`` ...) that starts inside the RECV action's span."""
    posts, recvs = [], []
    for name, t0, dur, _ in complete_events(events):
        m = _RECV.match(name)
        if m:
            posts.append((t0, t0 + dur, (int(m.group(1)), m.group(2), int(m.group(3)))))
        elif not name.startswith("PP:") and "recv" in name.lower():
            recvs.append((t0, t0 + dur))
    if not posts or not recvs:
        return {}
    recvs.sort()
    starts = [a for a, _ in recvs]
    out = {}
    for a, b, key in posts:
        i = bisect.bisect_left(starts, a)
        ends = [e for s, e in recvs[i: bisect.bisect_right(starts, b)]]
        if ends:
            out[key] = max(ends)
    return out


GPU_SPAN = "gpu_user_annotation"
"""the category of a ``record_function`` span on a GPU stream (Kineto)"""


def _is_action(name: str) -> bool:
    return name.startswith("PP:") or bool(_SINGLE.match(name))


def _jobs(events: list, pp_rank: int) -> list[tuple[str, int, int, float, float, float]]:
    """(kind, mb, chunk, start s, end s, wait s) of the pipeline actions among ``events``: an action that
    started before the input its RECV action posted arrived waited inside its span; that wait is cut off
    its start (``LogJob.wait``), as the job-log format asks for compute-only intervals. A GPU trace's actions
    are its GPU spans (module docstring)."""
    gpu = any(ev.get("cat") == GPU_SPAN and _is_action(name) for name, _, _, ev in complete_events(events))
    arrived = {} if gpu else _arrivals(events)
    out = []
    for name, t0, dur, ev in complete_events(events):
        if gpu and ev.get("cat") != GPU_SPAN:
            continue
        t0, dur = t0 * 1e-6, dur * 1e-6
        parts = []
        m = _PP_OVERLAP.match(name)
        if m:  # one span for the pair: both jobs share it
            parts = [PP_COMPUTE.match("PP:" + p.strip()) for p in m.group(1).split(";")]
        elif PP_COMPUTE.match(name):
            parts = [PP_COMPUTE.match(name)]
        else:
            s = _SINGLE.match(name)
            if s:
                kind = "F" if s.group(1) == "Forward" else "BW"
                out.append((kind, int(s.group(2)), pp_rank, t0, t0 + dur, 0.0))
            continue
        acts = []
        for p in parts:
            if p:
                kind, mb, stage = _KIND[p.group(2)], int(p.group(3)), int(p.group(1))
                arr = arrived.get((stage, "F" if kind == "F" else "B", mb))
                acts.append((kind, mb, stage, 0.0 if arr is None or kind == "W" else
                             min(max(0.0, arr * 1e-6 - t0), dur)))
        cut = min((a[3] for a in acts), default=0.0)  # an overlapped pair keeps one shared interval
        for kind, mb, stage, wait in acts:
            w = cut if len(acts) > 1 else wait
            out.append((kind, mb, stage, t0 + w, t0 + dur, w))
    return out


def read_trace(path: str, step: int | None, order: int) -> RankLog:
    """One rank's trace as a :class:`RankLog` (``order``: its position among the files, the rank of last resort)."""
    data = load_trace(path)
    rank = trace_rank(data, path, order)
    base = data.get("baseTimeNanoseconds")
    offset = float(base) * 1e-9 if isinstance(base, (int, float)) else 0.0  # ts are microseconds after it
    host = str(data.get("host_name") or data.get("hostname") or "")
    log = RankLog(path=path, rank=rank, machine=0, local_rank=rank, host=host)
    jobs = [(k, mb, c, s + offset, e + offset, w) for k, mb, c, s, e, w in _jobs(data["traceEvents"], rank)]
    if not jobs:
        raise LogError(f"{path} holds no pipeline actions (no 'PP:<action>' spans, nor 'Forward i'/'Backward i'); "
                       f"profile the step of a torch.distributed.pipelining schedule")
    jobs.sort(key=lambda t: t[3])
    if step is not None:
        log.jobs = [LogJob(k, mb, c, s, e, step, rank, wait=w) for k, mb, c, s, e, w in jobs]
    else:  # steps from the order: a new one at stage 0's F of microbatch 0 once a backward was seen
        cur, seen_backward = -1, True
        for k, mb, c, s, e, w in jobs:
            if k == "F" and mb == 0 and seen_backward and c == min(j[2] for j in jobs):
                cur += 1
                seen_backward = False
            if k != "F":
                seen_backward = True
            log.jobs.append(LogJob(k, mb, c, s, e, max(cur, 0), rank, wait=w))
    return log


def read_traces(root: str) -> list[RankLog]:
    """Every rank's jobs from the traces under ``root``; files of one rank (one per profiled step) are merged."""
    found = find_traces(root)
    if not found:
        raise LogError(f"no torch profiler traces (*.json, *.json.gz) under {root}")
    by_rank: dict[int, RankLog] = {}
    for i, (path, step) in enumerate(found):
        log = read_trace(path, step, i)
        if log.rank in by_rank:
            prev = by_rank[log.rank]
            if step is None:
                raise LogError(f"{root} holds two traces of rank {log.rank} outside iteration_<N> folders: "
                               f"{prev.path} and {path}")
            prev.jobs += log.jobs
        else:
            by_rank[log.rank] = log
    ranks = sorted(by_rank.values(), key=lambda r: r.rank)
    hosts = sorted({r.host for r in ranks})
    for r in ranks:
        r.machine = hosts.index(r.host)
        r.jobs.sort(key=lambda j: (j.start, j.end))
    return ranks


def infer_schedule(ranks: list[RankLog]) -> Schedule:
    """The plan a torch run followed: each pipeline rank's job order in its first profiled step (stages are
    global, so the placement and the stages per rank are read from where each stage ran). Ranks that ran the
    same stages are dp replicas of one pipeline rank (module docstring); their ``pp_rank``/``dp_rank`` are set."""
    groups: dict[frozenset, list[RankLog]] = {}
    for r in sorted(ranks, key=lambda r: r.rank):
        groups.setdefault(frozenset(j.chunk for j in r.jobs), []).append(r)
    stage_sets = sorted(groups, key=lambda g: min(g, default=0))
    pp = len(stage_sets)
    if pp > 1 and any(a & b for i, a in enumerate(stage_sets) for b in stage_sets[i + 1:]):
        a, b = next((a, b) for i, a in enumerate(stage_sets) for b in stage_sets[i + 1:] if a & b)
        raise LogError(f"the traces' ranks ran overlapping stage sets {sorted(a)} and {sorted(b)}: neither one "
                       f"pipeline rank nor two; pipeloom cannot tell the pipeline from the data-parallel ranks")
    sizes = {len(groups[g]) for g in stage_sets}
    if len(sizes) > 1:
        raise LogError(f"the traces hold {', '.join(str(len(groups[g])) for g in stage_sets)} rank(s) per pipeline "
                       f"rank (stages {', '.join(str(sorted(g)) for g in stage_sets)}): a trace is missing")
    for i, g in enumerate(stage_sets):
        for d, r in enumerate(groups[g]):
            r.pp_rank, r.dp_rank = i, d
    devices = []
    for g in stage_sets:
        r = groups[g][0]
        first = min((j.step for j in r.jobs), default=0)
        devices.append([j.job() for j in r.jobs if j.step == first])
    home = {j.chunk: d for d, seq in enumerate(devices) for j in seq}
    nc = max(home) + 1
    placement = next((p for p in (Placement.INTERLEAVED, Placement.V)
                      if all(device_of(c, pp, p) == d for c, d in home.items())), None)
    if placement is None or nc % pp:
        raise LogError(f"the traces place stages {sorted(home)} on {pp} ranks neither interleaved nor in a V; "
                       f"pipeloom cannot replay that plan")
    m = 1 + max((j.mb for r in ranks for j in r.jobs), default=0)
    return Schedule("torch-measured-order", pp, nc // pp, m, placement, devices,
                    meta={"inferred": "from the first profiled step of torch profiler traces"})
