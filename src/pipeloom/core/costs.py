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
    """fraction of the shorter job hidden when two jobs run as an overlapped pair (DualPipe), 0..1; used only
    when no all-to-all is given (``a2a_F``/``a2a_B``), which then price the pair by what it hides"""
    a2a_F: PerChunk = 0.0
    """of each F duration, the communication an overlapped pair can hide (MoE dispatch + combine all-to-all)"""
    a2a_B: PerChunk = 0.0
    """of each B (and BW) duration, the communication an overlapped pair can hide (their gradients' all-to-all)"""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.comm) and self.comm >= 0):
            raise ValueError(f"comm must be a finite number >= 0, got {self.comm}")
        _expand(self.comm, 1, "comm")
        if not (0.0 <= self.overlap <= 1.0):
            raise ValueError(f"overlap must lie in [0, 1], got {self.overlap}")
        for name in ("F", "B", "W", "a2a_F", "a2a_B"):
            v = getattr(self, name)
            if isinstance(v, (int, float)):
                _expand(v, 1, name)

    @property
    def hides_pairs(self) -> bool:
        """True when an overlapped pair takes less than its two jobs one after the other."""
        return self.overlap > 0 or any(x > 0 for n in ("a2a_F", "a2a_B") for x in
                                       (getattr(self, n) if not isinstance(getattr(self, n), (int, float))
                                        else (getattr(self, n),)))

    def a2a_per_chunk(self, num_chunks: int) -> tuple[list[float], list[float]]:
        """(hideable communication of F, of B) per global chunk (:func:`pair_hidden`)."""
        return _expand(self.a2a_F, num_chunks, "a2a_F"), _expand(self.a2a_B, num_chunks, "a2a_B")

    def per_chunk(self, num_chunks: int) -> tuple[list[float], list[float], list[float]]:
        """(F, B, W) durations as lists indexed by global chunk."""
        return (_expand(self.F, num_chunks, "F"), _expand(self.B, num_chunks, "B"),
                _expand(self.W, num_chunks, "W"))

    def is_uniform(self) -> bool:
        return all(isinstance(getattr(self, n), (int, float)) for n in ("F", "B", "W"))

    @classmethod
    def parse(cls, text: str | None) -> "Costs":
        """Parse ``F=1,B=1,W=1,comm=1[,overlap=0.5][,a2a=0.3]``; per-chunk lists as ``F=1:2:1:3``; ``a2a`` sets
        both ``a2a_F`` and ``a2a_B`` (the all-to-all inside each F and B), ``a2a_f``/``a2a_b`` one of them."""
        if text is None or not text.strip():
            return cls()
        kw: dict = {}
        zero: set[str] = set()  # durations given as all 0
        for part in text.split(","):
            if "=" not in part:
                raise ValueError(f"bad cost item {part!r}: expected KEY=VALUE with KEY in F, B, W, comm, overlap")
            k, v = (s.strip() for s in part.split("=", 1))
            key = {"f": "F", "b": "B", "w": "W", "comm": "comm", "overlap": "overlap", "a2a": "a2a",
                   "a2a_f": "a2a_F", "a2a_b": "a2a_B"}.get(k.lower())
            if key is None:
                raise ValueError(f"unknown cost key {k!r}: allowed are F, B, W, comm, overlap, a2a, a2a_F, a2a_B")
            if key in kw:
                raise ValueError(f"cost {key} is given twice in {text!r}; give each of F, B, W, comm, overlap once")
            try:
                if ":" in v and key in ("F", "B", "W", "a2a", "a2a_F", "a2a_B"):
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
        if "a2a" in kw:
            both = kw.pop("a2a")
            for k2 in ("a2a_F", "a2a_B"):
                if k2 in kw:
                    raise ValueError(f"costs {text!r}: give a2a or {k2}, not both")
                kw[k2] = both
        if zero == {"F", "B", "W"}:  # (the defaults are 1: a duration left out is not 0)
            raise ValueError(f"costs {text!r}: F, B and W are all 0, so every schedule takes no time; give F, B or "
                             f"W > 0 (W=0 alone is fine)")
        return cls(**kw)

    def to_dict(self) -> dict:
        out = {"F": self.F, "B": self.B, "W": self.W, "comm": self.comm, "overlap": self.overlap}
        for k in ("a2a_F", "a2a_B"):  # only when given (the JSON of runs without them is unchanged)
            v = getattr(self, k)
            if any(x != 0.0 for x in (v if isinstance(v, tuple) else (v,))):
                out[k] = v
        return out


def pair_hidden(d1: float, c1: float, d2: float, c2: float) -> float:
    """What an overlapped pair of two jobs hides: job 1 lasts ``d1`` of which ``c1`` is communication (the
    all-to-all), job 2 likewise. Each job's communication runs while the other computes (DualPipe's F&B
    overlap, DeepSeek-V3 report sec. 3.2.1, fig. 4; Megatron-Core's combined 1F1B EP overlap), so the pair
    hides ``min(c1, d2 - c2) + min(c2, d1 - c1)`` and takes at least ``max(compute sum, comm sum)``: nothing
    when neither communicates, all of the shorter side when one's communication equals the other's compute."""
    c1, c2 = min(max(c1, 0.0), d1), min(max(c2, 0.0), d2)
    return min(c1, d2 - c2) + min(c2, d1 - c1)


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


# ------------------------------------------------------------------------------------- sizes and limits
#: one decimal number as every size and limit is written: digits with an optional fraction and exponent
#: (``6``, ``0.75``, ``1e3``); no sign, no ``nan``/``inf`` spellings, no underscores
_NUMBER = r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?"
#: the longest number text read at all: longer ones are refused before any conversion (Python's int()
#: stops at 4300 digits with a message that names no option; no real size needs more than a few dozen)
MAX_NUMBER_CHARS = 64
_BYTE_UNITS = {"b": 1, "k": 1000, "kb": 1000, "ki": 1024, "kib": 1024, "m": 1000 ** 2, "mb": 1000 ** 2,
               "mi": 1024 ** 2, "mib": 1024 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3, "gi": 1024 ** 3,
               "gib": 1024 ** 3, "t": 1000 ** 4, "tb": 1000 ** 4, "ti": 1024 ** 4, "tib": 1024 ** 4}
_SIZE_RE = re.compile(rf"^\s*({_NUMBER})\s*([kmgt]i?b?|b)?\s*$", re.I)
_LIMIT_RE = re.compile(rf"^\s*({_NUMBER})\s*(p|[kmgt]i?b?|b)?\s*$", re.I)
#: the words that mean "no memory limit"
NO_LIMIT_WORDS = ("none", "unlimited", "inf")

SIZE_HELP = ("a number of bytes with an optional unit: B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB "
             "(powers of 1000), e.g. 80GiB")
MEM_LIMIT_HELP = ("none (no limit), a number of units (one unit = one full-stage microbatch activation, so 1F1B "
                  "peaks at pp units), Xp (X times pp units: 1p = 1F1B's peak, 0.75p, 1.5p, 2p) or, where a model "
                  "converts it (memory, tune), a size per device such as 80GiB")


class SizeError(ValueError):
    """A size or memory limit that is not understood, not positive, not finite or above its cap (one line
    naming the option and what is allowed)."""


def _label(what: str, text) -> str:
    """``--option 'text'`` for a message, a long text cut to its first characters and its length."""
    t = repr(text) if isinstance(text, str) else str(text)
    t = t if len(t) <= 40 else f"{t[:24]}...' ({len(str(text)):,} characters)"
    return f"{what} {t}" if what else t


def _too_long(text: str, what: str, allowed: str) -> None:
    if len(text.strip()) > MAX_NUMBER_CHARS:
        raise SizeError(f"{_label(what, text)} is too long: a number here has at most {MAX_NUMBER_CHARS} "
                        f"characters; allowed: {allowed}")


def _number(text: str, label: str, allowed: str) -> float:
    """The finite float of a number text matched by the grammar (its length checked before)."""
    v = float(text)
    if not math.isfinite(v):
        raise SizeError(f"{label} is too large to be a number; allowed: {allowed}")
    return v


def parse_size(text: str | int | float, *, what: str = "memory size", zero_ok: bool = True) -> int:
    """``80GiB``, ``80GB`` (10^9), ``512MiB``, ``1.5TiB`` or a plain number of bytes -> bytes (an int).

    Refuses (:class:`SizeError`, a ``ValueError``) what is not such a size, negative, non-finite, too long
    or above :data:`pipeloom.core.limits.MAX_BYTES`; ``what`` names the option in the message."""
    from .limits import MAX_BYTES

    label = _label(what, text)
    if isinstance(text, bool):
        raise SizeError(f"{label} is not a size; allowed: {SIZE_HELP}")
    if isinstance(text, (int, float)):
        if isinstance(text, float) and not math.isfinite(text):
            raise SizeError(f"{label} is not finite; allowed: {SIZE_HELP}")
        val = float(text) if isinstance(text, float) else text
    else:
        s = str(text)
        _too_long(s, what, SIZE_HELP)
        m = _SIZE_RE.match(s)
        if not m:
            if s.strip().startswith("-"):
                raise SizeError(f"{label} must be {'>= 0' if zero_ok else '> 0'} bytes; allowed: {SIZE_HELP}")
            raise SizeError(f"{label} not understood; allowed: {SIZE_HELP}")
        val = _number(m.group(1), label, SIZE_HELP) * _BYTE_UNITS[(m.group(2) or "b").lower()]
    if val < 0 or (val == 0 and not zero_ok):
        raise SizeError(f"{label} must be {'>= 0' if zero_ok else '> 0'} bytes; allowed: {SIZE_HELP}")
    if val > MAX_BYTES:
        raise SizeError(f"{label} = {float(val):.3g} bytes is above the cap of {MAX_BYTES:.3g} bytes (caps: "
                        f"docs/robustness.md)")
    return int(val)


@dataclass(frozen=True, slots=True)
class MemLimit:
    """A peak-memory limit per device, parsed once from ``none | units | Xp | bytes`` (:data:`MEM_LIMIT_HELP`).

    ``kind`` is ``'none'``, ``'units'`` (``value`` units), ``'p'`` (``value`` x pp units) or ``'bytes'``
    (``value`` bytes per device: only a model turns that into units, see
    :func:`pipeloom.memory.budget.limit_units`). ``text`` is the limit as given, for messages and output.
    Every command that takes ``--mem-limit`` parses it with :meth:`parse`, so the same string is accepted or
    refused the same way everywhere.
    """

    kind: str = "none"
    value: float = 0.0
    text: str = "none"

    @classmethod
    def parse(cls, limit: "MemLimit | str | float | int | None", *, what: str = "--mem-limit",
              bytes_ok: bool = True) -> "MemLimit":
        """The limit of ``limit`` (None or a no-limit word: no limit; a number: units); ``bytes_ok=False``
        refuses a size in bytes (where no model converts it)."""
        if isinstance(limit, MemLimit):
            out = limit
        elif limit is None:
            return cls()
        elif isinstance(limit, (int, float)) and not isinstance(limit, bool):
            if not math.isfinite(limit):  # (programmatic) inf = no limit, as the word
                if math.isnan(limit):
                    raise SizeError(f"{_label(what, limit)} is not a number; allowed: {MEM_LIMIT_HELP}")
                return cls()
            out = cls._checked("units", float(limit), f"{limit:g}", what)
        else:
            s = str(limit).strip()
            if s.lower() in NO_LIMIT_WORDS or not s:
                return cls()
            _too_long(s, what, MEM_LIMIT_HELP)
            m = _LIMIT_RE.match(s)
            label = _label(what, limit)
            if not m:
                if s.lower().lstrip("+-") == "nan":
                    raise SizeError(f"{label} is not a number; allowed: {MEM_LIMIT_HELP}")
                if s.startswith("-"):
                    raise SizeError(f"{label}: a memory limit must be > 0; allowed: {MEM_LIMIT_HELP}")
                raise SizeError(f"{label} not understood; allowed: {MEM_LIMIT_HELP}")
            val = _number(m.group(1), label, MEM_LIMIT_HELP)
            unit = (m.group(2) or "").lower()
            if unit == "p":
                out = cls._checked("p", val, s, what)
            elif unit:
                out = cls._checked("bytes", val * _BYTE_UNITS[unit], s, what)
            else:
                out = cls._checked("units", val, s, what)
        if out.kind == "bytes" and not bytes_ok:
            raise SizeError(f"{_label(what, out.text)}: a size in bytes needs a model to convert it into units (pipeloom "
                            f"memory --model, pipeloom tune); here give none, a number of units or Xp (e.g. 1p)")
        return out

    @classmethod
    def _checked(cls, kind: str, val: float, text: str, what: str) -> "MemLimit":
        from .limits import MAX_BYTES

        if val <= 0:
            raise SizeError(f"{_label(what, text)}: a memory limit must be > 0; allowed: {MEM_LIMIT_HELP}")
        cap, unit = (MAX_BYTES, "bytes") if kind == "bytes" else (MAX_MEM_UNITS, "units" if kind == "units" else "p")
        if val > cap:
            raise SizeError(f"{_label(what, text)} = {val:g} {unit} is above the cap of {cap:g} {unit} (caps: "
                            f"docs/robustness.md); give none for no limit")
        return cls(kind, float(val) if kind != "bytes" else float(int(val)), text)

    @property
    def is_none(self) -> bool:
        return self.kind == "none"

    @property
    def is_bytes(self) -> bool:
        return self.kind == "bytes"

    def units(self, pp: int) -> float | None:
        """The limit in units for ``pp`` devices (None: no limit). A size in bytes has no units without a
        model: :class:`SizeError` (convert it with :func:`pipeloom.memory.budget.limit_units`)."""
        if self.kind == "none":
            return None
        if self.kind == "units":
            return self.value
        if self.kind == "p":
            val = self.value * pp
            if val > MAX_MEM_UNITS:
                raise SizeError(f"memory limit {self.text} = {val:g} units at pp={pp} is above the cap of "
                                f"{MAX_MEM_UNITS:g} units (caps: docs/robustness.md); give none for no limit")
            return val
        raise SizeError(f"memory limit {self.text}: a size in bytes needs a model to convert it into units "
                        f"(pipeloom memory --model, pipeloom tune); give none, a number of units or Xp (e.g. 1p)")

    def __str__(self) -> str:
        return self.text


def parse_mem_limit(limit: "MemLimit | str | float | int | None", pp: int) -> float | None:
    """``none``/``Xp``/a number of units -> units for ``pp`` devices (None = unlimited): :meth:`MemLimit.parse`
    then :meth:`MemLimit.units` (a size in bytes is refused here: it needs a model)."""
    return MemLimit.parse(limit, what="memory limit", bytes_ok=False).units(pp)
