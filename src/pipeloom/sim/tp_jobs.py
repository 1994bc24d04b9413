"""Per-job durations of a plan under a tensor-parallel overlap mode (``pipeloom simulate --tp-overlap``; no torch).

The TP collective that the modes overlap is the column-parallel input-gradient collective of a B (the dgrad
all-reduce, or reduce-scatter with sequence parallelism: :func:`pipeloom.tune.comm_terms.tp_dgrad_reduce`).
What hides it depends on the job, exactly as the runtime chooses (:mod:`pipeloom.runtime.tp_overlap`):

    mode     BW job / a B whose own W is the next job     any other B (the split's B)
    off      collective in full                            collective in full
    async    max(0, comm - column wgrad GEMMs)             collective in full
    chunked  as async                                      c + (K-1) max(0, c - dgrad/K), c = comm/K
    fill     as async                                      collective in full, but the pending W work of an
                                                           earlier microbatch (eligible as the runtime takes
                                                           it) runs under it: that W job gets shorter

``comm`` is the collective of one chunk pass (in the units of the plan's costs); ``col_share`` the share of a
pass's GEMM time in the column-parallel groups (QKV and fc1/gate+up of a Llama layer:
:func:`pipeloom.tune.comm_terms.column_wgrad_flops` / :func:`~pipeloom.tune.comm_terms.gemm_flops`), so the
column wgrad GEMMs of a W take ``col_share x W`` and the column dgrad GEMMs of a B ``col_share x B``. The other
TP collectives (the forward's, the output-gradient all-gathers) are the same in every mode: fold them into the
F and B costs. Fill moves W work into the B (never removes it), from the earliest W jobs after the B on the
device whose B has run, not the B's own, with no BW of the same chunk in between, as the runtime does.

With sequence parallelism the column groups' inputs are gathered again for their weight gradients (``regather``:
the gathers of one chunk pass, in ``regather_groups`` equal groups; 0 when the gathered inputs are kept):

    mode     W job                                          BW job / a B whose own W is the next job
    off      + regather in full                             + regather in full
    others   + double-buffered: c + (n-1) max(0, c - W'/n)  + max(0, regather - column dgrad GEMMs)
             c = regather/n, W' = what is left of the W     (each gather started before its group's dgrad)

(:func:`pipeloom.tune.comm_terms.regather_exposed` with equal groups and the W's GEMMs spread evenly over
them), and fill takes only the row-parallel share ``1 - col_share`` of a W (the runtime never moves a GEMM
whose input must be gathered: the ranks must issue the same gathers).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..core.ir import Kind, Schedule

__all__ = ["TPJobTerms", "chunked_exposed", "exposed_dgrad", "fill_work", "fused_pairs", "tp_job_durations"]


def chunked_exposed(comm: float, gemm: float, k: int) -> float:
    """Micro-pipelined dgrad in ``k`` token chunks: the collective of chunk i runs during the GEMM of chunk i+1;
    exposed beyond the GEMMs: ``c + (k-1) max(0, c - gemm/k)``, ``c = comm/k``."""
    c = comm / k
    return c + (k - 1) * max(0.0, c - gemm / k)


def exposed_dgrad(mode: str, chunks: int, comm: float, g_dgrad: float, g_wcol: float, *, fused: bool) -> float:
    """Exposed seconds of the input-gradient collective ``comm`` of a B (``fused``: a BW, or a B the runtime
    fuses with its W) under ``mode`` (off, async, chunked with ``chunks`` pieces, fill); ``g_dgrad`` / ``g_wcol``:
    seconds of the column groups' dgrad / wgrad GEMMs. ``fill`` here assumes at least ``g_wcol`` of pending W
    (:func:`tp_job_durations` looks per job)."""
    if mode == "off":
        return comm
    if fused or mode == "fill":
        return max(0.0, comm - g_wcol)
    if mode == "chunked":
        return chunked_exposed(comm, g_dgrad, chunks)
    return comm  # async in a split B: nothing independent of the reduced gradient is left in B


@dataclass(frozen=True, slots=True)
class TPJobTerms:
    """The TP collective of one chunk pass and what can hide it (see the module docstring)."""

    comm: float | tuple[float, ...]
    """the column-parallel input-gradient collective of one B, in cost units (one value, or one per chunk)"""
    col_share: float = 0.5
    """share of a B's / W's GEMM time in the column-parallel groups, 0..1"""
    mode: str = "async"
    """off, async, chunked or fill"""
    chunks: int = 1
    """token pieces of ``chunked``"""
    regather: float | tuple[float, ...] = 0.0
    """sequence parallelism: the all-gathers of one chunk pass's column-parallel inputs for their weight
    gradients, in cost units (one value, or one per chunk); 0: none (no SP, or the gathered inputs kept)"""
    regather_groups: int = 2
    """column groups per chunk pass whose gathers W double-buffers (two per decoder layer)"""

    def __post_init__(self) -> None:
        for v in ((self.comm if isinstance(self.comm, tuple) else (self.comm,))
                  + (self.regather if isinstance(self.regather, tuple) else (self.regather,))):
            if not (v >= 0 and v < float("inf")):
                raise ValueError(f"tp comm must be a finite number >= 0, got {v}")
        if not isinstance(self.regather_groups, int) or self.regather_groups < 1:
            raise ValueError(f"tp re-gather groups must be an integer >= 1, got {self.regather_groups!r}")
        if not 0.0 <= self.col_share <= 1.0:
            raise ValueError(f"tp column share must lie in [0, 1], got {self.col_share}")
        if self.mode not in ("off", "async", "chunked", "fill"):
            raise ValueError(f"tp overlap {self.mode!r}: choose off, async, chunked:K or fill")


def fused_pairs(devices: Sequence[Sequence]) -> set[tuple[int, int]]:
    """``(device, index)`` of every B whose own W is the next job on its device (the runtime fuses them)."""
    out = set()
    for d, jobs in enumerate(devices):
        for i in range(len(jobs) - 1):
            j, n = jobs[i], jobs[i + 1]
            if j.kind is Kind.B and n.kind is Kind.W and (n.mb, n.chunk) == (j.mb, j.chunk):
                out.add((d, i))
    return out


def tp_job_durations(schedule: Schedule, dF: Sequence[float], dB: Sequence[float], dW: Sequence[float],
                     terms: TPJobTerms) -> tuple[list[list[float]], dict]:
    """``(durations[d][i], detail)``: each job's duration with the exposed TP collective of ``terms.mode``;
    ``detail``: exposed collective seconds in total (the re-gathers' also apart), W seconds moved into B by fill,
    B jobs run fused."""
    mode, share = terms.mode, terms.col_share
    nc = schedule.num_chunks
    comms = _per_chunk(terms.comm, nc, "tp comm")
    regs = _per_chunk(terms.regather, nc, "tp re-gather")
    fused = fused_pairs(schedule.devices) if mode != "off" else set()
    out: list[list[float]] = []
    exposed_total = moved_total = regather_total = 0.0
    for d, jobs in enumerate(schedule.devices):
        dur = [0.0] * len(jobs)
        moved = [0.0] * len(jobs)          # W work already run inside an earlier B (fill)
        pos = {(j.kind, j.mb, j.chunk): i for i, j in enumerate(jobs)}
        for i, j in enumerate(jobs):
            c = j.chunk
            comm = comms[c]
            reg, n = regs[c], terms.regather_groups
            fused_reg = reg if mode == "off" else max(0.0, reg - share * dB[c])  # each under its group's dgrad
            if j.kind is Kind.F:
                dur[i] = dF[c]
            elif j.kind is Kind.W:
                left = max(0.0, dW[c] - moved[i])
                if (d, i - 1) in fused:
                    e = 0.0  # its B (fused) gathered the column groups' inputs
                else:
                    e = reg if mode == "off" else chunked_exposed(reg, left, n)  # double-buffered re-gathers
                dur[i] = left + e
                exposed_total += e
                regather_total += e
            elif j.kind is Kind.BW:
                e = exposed_dgrad(mode, terms.chunks, comm, share * dB[c], share * dW[c], fused=True) + fused_reg
                dur[i] = dB[c] + dW[c] + e
                exposed_total += e
                regather_total += fused_reg
            elif j.kind is Kind.B:
                if (d, i) in fused:
                    e = exposed_dgrad(mode, terms.chunks, comm, share * dB[c], share * dW[c], fused=True) + fused_reg
                    regather_total += fused_reg
                elif mode == "fill":
                    movable = [w * (1.0 - share) if r > 0 else w for w, r in zip(dW, regs)]
                    took = fill_work(jobs, i, pos, movable, moved, comm)
                    e = max(0.0, comm - took)
                    moved_total += took
                else:
                    e = exposed_dgrad(mode, terms.chunks, comm, share * dB[c], share * dW[c], fused=False)
                # fill: the moved W work runs under the collective, B lasts B + max(comm, moved) = B + comm
                dur[i] = dB[c] + (comm if mode == "fill" and (d, i) not in fused else e)
                exposed_total += e
            else:
                dur[i] = 0.0
        out.append(dur)
    return out, {"tp_exposed": exposed_total, "tp_fill_moved": moved_total, "tp_fused_b": len(fused),
                 "tp_regather_exposed": regather_total}


def _per_chunk(v, nc: int, what: str) -> list[float]:
    if isinstance(v, tuple):
        if len(v) != nc:
            raise ValueError(f"{what} has {len(v)} values, the plan has {nc} chunks")
        return [float(x) for x in v]
    return [float(v)] * nc


def fill_work(jobs, i: int, pos: dict, dW: Sequence[float], moved: list[float], budget: float) -> float:
    """W work (seconds) the B at ``i`` runs while its collective (``budget``) is in flight: the runtime's rule
    (:meth:`pipeloom.runtime.tp_overlap.TPOverlap._fill`), written once for the simulator and the tuner's fill
    pricing (:func:`pipeloom.tune.comm_terms.fill_pricing`). ``moved[k]``: W work of job k already taken by an
    earlier B (updated)."""
    cur = (jobs[i].mb, jobs[i].chunk)
    took = 0.0
    for k in range(i + 1, len(jobs)):
        if took >= budget:
            break
        w = jobs[k]
        if w.kind is not Kind.W:
            continue
        key = (w.mb, w.chunk)
        b = pos.get((Kind.B, w.mb, w.chunk))
        if key == cur or b is None or b > i:  # the current pair's, or its B has not run
            break
        if any(jobs[x].kind is Kind.BW and jobs[x].chunk == w.chunk for x in range(i + 1, k)):
            break  # a BW of that chunk adds to the same gradients first
        left = dW[w.chunk] - moved[k]
        t = min(left, budget - took)
        moved[k] += t
        took += t
    return took
