"""The size caps on every number pipeloom accepts, in one place (no torch).

A number above its cap is refused with a one-line error that names the cap, before any memory is
allocated or any search starts: an absurd input (``-m 10000000``, ``--layers 1000000000``,
``-O polish=1e9``) must not run for hours or exhaust memory and then fail or be killed. The caps
are far above any real pipeline (the largest published runs use pp <= 128, a few thousand
microbatches and ~200 layers); docs/robustness.md lists them.
"""
from __future__ import annotations

#: forward jobs in one schedule, pp * vpp * microbatches (the schedule has 2 or 3 times as many jobs in
#: all); a schedule file may describe no more either. Planning 10^6 of them takes about a minute.
MAX_JOBS = 10_000_000
#: pipeline degree (devices)
MAX_PP = 65_536
#: microbatches per step
MAX_MICROBATCHES = 1_000_000
#: chunks per device
MAX_VPP = 1_024
#: layers of a model (--layers, the rows or ``count`` of a layer-cost file)
MAX_LAYERS = 1_000_000
#: seconds (wall or CP-SAT deterministic) that one solver option may ask for: one day
MAX_SOLVER_SECONDS = 86_400.0
#: steps of a heuristic search budget (placements, re-timings): hours of work at most
MAX_SEARCH_BUDGET = 10_000_000_000
#: the largest duration or comm latency a cost may have (costs are relative; with this cap 10^7 jobs still
#: sum to a finite makespan, where 1e308 would overflow to infinity)
MAX_COST = 1e12
#: the largest finite memory limit, in units (one unit = one full-stage microbatch activation); "none" is no limit
MAX_MEM_UNITS = 1e12
#: the largest memory size in bytes (--gpu-memory, --reserve, --param-bytes, a --mem-limit in bytes): 1 EiB,
#: a million times today's largest device; larger sizes overflow the sums of the estimator and the tuner
MAX_BYTES = 2 ** 60
#: the largest dimension of a model (hidden, ffn, vocabulary, sequence, heads, experts): 2^31, thousands of
#: times today's largest; far larger ones (a config.json with 1e200) overflow the FLOP and byte counts
MAX_MODEL_DIM = 2 ** 31
#: evaluations of the makespan balance search (--max-evals)
MAX_EVALS = 1_000_000


class LimitError(ValueError):
    """A number is above its documented cap (the message names the cap)."""


def check_at_most(what: str, value, cap, hint: str = "") -> None:
    """Raise :class:`LimitError` when ``value > cap``: ``what = value is above the cap of N``."""
    if value > cap:
        shown = f"{value:,}" if isinstance(value, int) else f"{value:g}"
        raise LimitError(f"{what} = {shown} is above the cap of {cap:,}{'; ' + hint if hint else ''} "
                         f"(caps: docs/robustness.md)")


def check_shape(pp: int, vpp: int, microbatches: int) -> None:
    """Refuse a pipeline shape above the caps (before anything is built)."""
    check_at_most("pp", pp, MAX_PP)
    check_at_most("vpp", vpp, MAX_VPP)
    check_at_most("microbatches", microbatches, MAX_MICROBATCHES)
    check_at_most(f"the forward jobs pp*vpp*m of pp={pp} vpp={vpp} m={microbatches}", pp * vpp * microbatches,
                  MAX_JOBS, "use fewer microbatches or a smaller pipeline")


#: memory one local rank of ``pipeloom run`` needs at least (Python + torch + gloo + the tiny model: ~220 MiB
#: resident measured, rounded up), and the most ranks per CPU core that still make progress before the P2P
#: timeouts (the test suite runs 4 ranks on 2 cores)
RANK_MEMORY_BYTES = 300 * 2**20
MAX_RANKS_PER_CORE = 8


def machine_capacity() -> tuple[int, int | None]:
    """(usable CPU cores, available memory in bytes or None when unknown) of this machine."""
    import os

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    return cores, avail


def check_local_ranks(world: int, *, flag: str = "--allow-oversubscribe") -> None:
    """Refuse to start ``world`` local rank processes when this machine cannot hold them (cores x
    :data:`MAX_RANKS_PER_CORE`, memory / :data:`RANK_MEMORY_BYTES`); ``flag`` is how to insist."""
    cores, avail = machine_capacity()
    need_cores = -(-world // MAX_RANKS_PER_CORE)
    if world > cores * MAX_RANKS_PER_CORE:
        raise LimitError(f"{world} ranks need at least {need_cores} CPU cores here (at most {MAX_RANKS_PER_CORE} "
                         f"ranks per core) but this machine has {cores}; use a smaller pp x dp, torchrun on more "
                         f"machines, or {flag}")
    if avail is not None and world * RANK_MEMORY_BYTES > avail:
        raise LimitError(f"{world} ranks need about {world * RANK_MEMORY_BYTES / 2**30:.1f} GiB of memory "
                         f"({RANK_MEMORY_BYTES // 2**20} MiB each) but {avail / 2**30:.1f} GiB is available; use a "
                         f"smaller pp x dp, torchrun on more machines, or {flag}")


# ------------------------------------------------------------------------------------------ input files
_MiB = 2**20

#: the largest input file pipeloom reads, per kind (bytes; a .gz file's decompressed size): a larger file, or
#: one that is not a regular file (/dev/zero, a FIFO, a directory), is refused before it is read
#: (:func:`pipeloom.core.files.read_input`). Each is far above a real file of its kind and far below what
#: would exhaust memory: ``--model`` pointed at a weights file instead of its config.json is refused at once.
MAX_FILE_BYTES: dict[str, int] = {
    # a real config.json is a few KiB (with a vocabulary map inside, a few MiB)
    "model config": 16 * _MiB,
    # efficiency, link figures and per-layer times: a few KiB
    "calibration file": 16 * _MiB,
    # ``--config``: a pipeloom.toml / .json of a few sections
    "settings file": 16 * _MiB,
    # about 10 million jobs as CSV (~25 bytes a job): the MAX_JOBS forward jobs with their B and W
    "schedule file": 256 * _MiB,
    # NAME.csv.meta.json beside a torch CSV: the plan's name, shape and builder
    "schedule meta file": 16 * _MiB,
    # 256 characters per layer at MAX_LAYERS
    "layer-cost file": 256 * MAX_LAYERS,
    # a handful of sizes
    "op-trace meta file": 16 * _MiB,
    # a Kineto/Chrome JSON trace, decompressed (read whole: its parsed form takes several times this)
    "torch profiler trace": 512 * _MiB,
    # one rank's JSON-lines log (read line by line)
    "worker log": 8 * 2**30,
    # an op-level table (.csv/.parquet) as pyarrow reads it
    "op trace": 8 * 2**30,
    # the official generators' schedules (``bench/ --reference``): a few hundred KiB
    "reference file": 256 * _MiB,
    # ``run --data``: token ids, memory-mapped (never read whole)
    "token data": 16 * 2**40,
}

#: GPUs of one ``tune`` problem (``--gpus``): ~16 times the largest published training clusters
MAX_GPUS = 1_048_576
#: configurations ``tune`` ranks (``--top``): each one more keeps more of the space from being pruned
MAX_TOP = 1_000
#: processes ``tune`` starts to build plans (``--workers``)
MAX_WORKERS = 256
#: layers of a model ``tune`` searches (the search grows with the layer count: 1,000 layers take about a
#: minute on a loaded 2-core machine; published models have at most ~200)
MAX_TUNE_LAYERS = 1_024
#: tokens per sequence (``--seq``, ``--seq-len``): 16 M, far above any published context length
MAX_SEQ = 16_777_216
