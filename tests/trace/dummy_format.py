"""A made-up trace format, to show that a new format is this one file plus one ``register`` line.

``*.jobs.tsv``: a first line ``# dummy jobs``, then one job per line, tab-separated:
``rank kind mb chunk start end step`` (times in seconds, ``chunk`` the rank's own chunk index 0, 1, ...). Rank r
is pipeline rank r (dp 1); the plan is inferred from the job order, the way pipeloom reads logs without a meta line.
"""
from __future__ import annotations

import os

from pipeloom.trace.formats import TraceFormat, head
from pipeloom.trace.reader import run_of_ranks
from pipeloom.trace.run import LogError, LogJob, RankLog

MAGIC = b"# dummy jobs"


def sniff(path: str) -> bool:
    return path.endswith(".jobs.tsv") and head(path, len(MAGIC)) == MAGIC


def read(path: str, meta: str | None = None):
    ranks: dict[int, RankLog] = {}
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.startswith("#") or not line.strip():
                continue
            try:
                r, kind, mb, chunk, s, e, step = line.split("\t")
                job = LogJob(kind, int(mb), int(chunk), float(s), float(e), int(step), int(r))
            except ValueError:
                raise LogError(f"{path}:{n}: want rank, kind, mb, chunk, start, end, step (tab-separated)") from None
            ranks.setdefault(job.rank, RankLog(path=path, rank=job.rank, machine=0, local_rank=job.rank)).jobs.append(job)
    for rk in ranks.values():
        rk.jobs.sort(key=lambda j: (j.start, j.end))
    return run_of_ranks(sorted(ranks.values(), key=lambda rk: rk.rank), path)


DUMMY = TraceFormat("dummy-jobs", "a dummy job table (*.jobs.tsv)", sniff=sniff, read=read, level="jobs")


def write(path: str, events: dict[int, list[dict]]) -> str:
    """Write the job events of :func:`pipeloom.trace.synth.generate` in this format."""
    rows = [MAGIC.decode()]
    for rank, evs in sorted(events.items()):
        jobs = [e for e in evs if e["event"] == "job"]
        local = sorted({e["chunk"] for e in jobs})  # a rank's chunks in model order are its chunks 0, 1, ...
        rows += [f"{rank}\t{e['kind']}\t{e['mb']}\t{local.index(e['chunk'])}\t{e['start']}\t{e['end']}\t{e['step']}"
                 for e in jobs]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(rows) + "\n")
    return os.path.abspath(path)
