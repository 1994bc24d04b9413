"""Cost and memory models for planning and simulation (no torch).

Time: every job costs a duration per chunk pass (F, B, W; BW = B + W). A scalar applies to
every chunk; a sequence gives one value per global chunk (heterogeneous stages, e.g. from
:mod:`pipeloom.partition`). ``comm`` is added to every dependency edge between jobs on
different devices, nothing on the same device.

Memory, in units of one full-stage microbatch activation (so 1F1B's first device peaks at
``pp`` units): F allocates ``a`` (default ``1/vpp``), B frees ``b`` (default ``a/2``), W frees
``a - b``, BW frees ``a``. Limits: ``none`` (unlimited), ``1p`` = pp units, ``1.5p``, ``2p``,
any ``Xp``, or a plain number of units.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence, Union

from .limits import MAX_COST, MAX_MEM_UNITS  # the largest duration / comm latency, memory limit (core/limits.py)

Num = Union[float, int]
PerChunk = Union[Num, Sequence[Num]]



def _expand(value: PerChunk, num_chunks: int, what: str) -> list[float]:
    if isinstance(value, (int, float)):
        vals = [float(value)] * num_chunks
    else:
        vals = [float(v) for v in value]
        if len(vals) != num_chunks:
            raise ValueError(f"{what} has {len(vals)} per-chunk values but the pipeline has {num_chunks} chunks")
    for v in vals:
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{what} must be finite and >= 0, got {v}")
        if v > MAX_COST:
            raise ValueError(f"{what} = {v:g} is above {MAX_COST:g}; costs are relative, so scale them down "
                             f"(sums of larger ones can overflow)")
    return vals


@dataclass(frozen=True, slots=True, kw_only=True)
class Costs:
    """Durations per chunk pass. Scalars or one value per global chunk."""

    F: PerChunk = 1.0
    """forward time of one chunk pass"""
    B: PerChunk = 1.0
    """input-gradient backward time"""
    W: PerChunk = 1.0
    """weight-gradient backward time"""
    comm: float = 0.0
    """latency added to every dependency edge that crosses devices"""
    overlap: float = 0.0
    """fraction of the shorter job hidden when two jobs run as an overlapped pair (DualPipe), 0..1"""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.comm) and self.comm >= 0):
            raise ValueError(f"comm must be a finite number >= 0, got {self.comm}")
        _expand(self.comm, 1, "comm")
        if not (0.0 <= self.overlap <= 1.0):
            raise ValueError(f"overlap must lie in [0, 1], got {self.overlap}")
        for name in ("F", "B", "W"):
            v = getattr(self, name)
            if isinstance(v, (int, float)):
                _expand(v, 1, name)

    def per_chunk(self, num_chunks: int) -> tuple[list[float], list[float], list[float]]:
        """(F, B, W) durations as lists indexed by global chunk."""
        return (_expand(self.F, num_chunks, "F"), _expand(self.B, num_chunks, "B"),
                _expand(self.W, num_chunks, "W"))

    def is_uniform(self) -> bool:
        return all(isinstance(getattr(self, n), (int, float)) for n in ("F", "B", "W"))

    @classmethod
    def parse(cls, text: str | None) -> "Costs":
        """Parse ``F=1,B=1,W=1,comm=1[,overlap=0.5]``; per-chunk lists as ``F=1:2:1:3``."""
        if text is None or not text.strip():
            return cls()
        kw: dict = {}
        zero: set[str] = set()  # durations given as all 0
        for part in text.split(","):
            if "=" not in part:
                raise ValueError(f"bad cost item {part!r}: expected KEY=VALUE with KEY in F, B, W, comm, overlap")
            k, v = (s.strip() for s in part.split("=", 1))
            key = {"f": "F", "b": "B", "w": "W", "comm": "comm", "overlap": "overlap"}.get(k.lower())
            if key is None:
                raise ValueError(f"unknown cost key {k!r}: allowed are F, B, W, comm, overlap")
            if key in kw:
                raise ValueError(f"cost {key} is given twice in {text!r}; give each of F, B, W, comm, overlap once")
            try:
                if ":" in v and key in ("F", "B", "W"):
                    kw[key] = tuple(float(x) for x in v.split(":"))
                else:
                    kw[key] = float(v)
            except ValueError:
                raise ValueError(f"cost {k}={v!r} is not a number") from None
            vals = kw[key] if isinstance(kw[key], tuple) else (kw[key],)
            if any(x < 0 or not math.isfinite(x) for x in vals):
                raise ValueError(f"cost {k} must be finite and >= 0, got {v}")
            if key != "overlap":
                _expand(vals, len(vals), f"cost {k}")
            if key in ("F", "B", "W") and not any(vals):
                zero.add(key)
        if zero == {"F", "B", "W"}:  # (the defaults are 1: a duration left out is not 0)
            raise ValueError(f"costs {text!r}: F, B and W are all 0, so every schedule takes no time; give F, B or "
                             f"W > 0 (W=0 alone is fine)")
        return cls(**kw)

    def to_dict(self) -> dict:
        return {"F": self.F, "B": self.B, "W": self.W, "comm": self.comm, "overlap": self.overlap}


@dataclass(frozen=True, slots=True, kw_only=True)
class MemModel:
    """Activation memory per chunk pass, in full-stage microbatch activations.

    ``a`` is what F allocates (default 1/vpp), ``b`` what B frees (default a/2); W frees a-b.
    """

    a: PerChunk | None = None
    b: PerChunk | None = None

    def per_chunk(self, num_chunks: int, vpp: int) -> tuple[list[float], list[float]]:
        a = _expand(1.0 / vpp if self.a is None else self.a, num_chunks, "memory a")
        if self.b is None:
            b = [x / 2 for x in a]
        else:
            b = _expand(self.b, num_chunks, "memory b")
        for x, y in zip(a, b):
            if y > x + 1e-12:
                raise ValueError(f"memory b (freed by B) = {y} exceeds a (allocated by F) = {x}")
        return a, b

    @classmethod
    def parse(cls, text: str | None) -> "MemModel":
        """Parse ``a=0.5,b=0.25`` (per-chunk lists with ':')."""
        if text is None or not text.strip():
            return cls()
        kw: dict = {}
        for part in text.split(","):
            if "=" not in part:
                raise ValueError(f"bad memory item {part!r}: expected a=..,b=..")
            k, v = (s.strip() for s in part.split("=", 1))
            if k not in ("a", "b"):
                raise ValueError(f"unknown memory key {k!r}: allowed are a (F allocates) and b (B frees)")
            if k in kw:
                raise ValueError(f"memory {k} is given twice in {text!r}; give each of a, b once")
            try:
                kw[k] = tuple(float(x) for x in v.split(":")) if ":" in v else float(v)
            except ValueError:
                raise ValueError(f"memory {k}={v!r} is not a number") from None
        return cls(**kw)


#: the memory model of each runtime that can execute a plan: pipeloom's own executor frees the input-gradient
#: part at B (half, by default); torch.distributed.pipelining keeps a chunk's whole autograd graph until W (its
#: ``I`` frees nothing, and stage 0's ``I`` is a no-op whose ``W`` runs the full backward), so B frees 0 there.
RUNTIMES = ("pipeloom", "torch")


def runtime_mem_model(runtime: str, a: PerChunk | None = None) -> "MemModel":
    """The :class:`MemModel` of plans that ``runtime`` (one of :data:`RUNTIMES`) will execute."""
    if runtime == "pipeloom":
        return MemModel(a=a)
    if runtime == "torch":
        return MemModel(a=a, b=0.0)
    raise ValueError(f"unknown runtime {runtime!r}; choose one of: {', '.join(RUNTIMES)}")


_LIMIT_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*p\s*$", re.I)


def parse_mem_limit(limit: str | float | int | None, pp: int) -> float | None:
    """Turn ``none``/``1p``/``1.5p``/``2p``/``Xp``/a number into units (None = unlimited)."""
    if limit is None:
        return None
    if isinstance(limit, (int, float)):
        val = float(limit)
    else:
        s = str(limit).strip().lower()
        if s in ("", "none", "inf", "unlimited"):
            return None
        m = _LIMIT_RE.match(s)
        if s.startswith("-"):
            raise ValueError(f"memory limit must be > 0, got {limit!r}: use none, 1p, 1.5p, 2p, Xp or a number of "
                             f"units > 0")
        if m:
            val = float(m.group(1)) * pp
        else:
            try:
                val = float(s)
            except ValueError:
                raise ValueError(
                    f"memory limit {limit!r} not understood: use none, 1p, 1.5p, 2p, Xp (multiples of 1F1B's peak "
                    f"= pp units) or a plain number of units"
                ) from None
    if math.isnan(val):
        raise ValueError(f"memory limit {limit!r} is not a number: use none, 1p, 1.5p, 2p, Xp or a number of units > 0")
    if val <= 0:
        raise ValueError(f"memory limit must be > 0, got {limit!r}")
    if math.isinf(val):
        return None
    if val > MAX_MEM_UNITS:
        raise ValueError(f"memory limit {limit!r} = {val:g} units is above the cap of {MAX_MEM_UNITS:g} units "
                         f"(caps: docs/robustness.md); give none for no limit")
    return val
