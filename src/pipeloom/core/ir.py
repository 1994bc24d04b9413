"""Schedule IR: a schedule is per device an ordered list of jobs. Pure data, no torch.

Pairing rules (the whole dependency structure, used by the validator, the simulator and
the runtime alike):

    chunk      = global stage id 0..pp*vpp-1; the forward goes 0 -> 1 -> ... -> pp*vpp-1
    F(m, k)    needs F(m, k-1)                       (activation from the previous chunk)
    B(m, k)    needs F(m, k) and the input grad of chunk k+1 (B(m, k+1) or BW(m, k+1));
               the last chunk's B needs only its own F (it computes the loss gradient)
    W(m, k)    needs B(m, k)                         (weight grad from what B kept)
    BW(m, k)   = B(m, k) and W(m, k) fused; needs what B needs
    Every (m, k) has exactly one F and either one BW or one B plus one W.
    An edge between jobs on different devices costs `comm`; on the same device nothing.

Placement (which device holds chunk k):
    interleaved: device k % pp
    v (zigzag):  device k % pp when k // pp is even, else pp-1 - k % pp
                 (chunk 0 runs down devices 0..pp-1, chunk 1 back up pp-1..0, chunk 2 down again...)

String form of a job: KIND MICROBATCH "." CHUNK, e.g. ``F3.1`` = forward of microbatch 3 on
chunk 1; ``BW0.7``. It round-trips through :meth:`Job.parse`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Iterator, NamedTuple, Sequence


class Kind(str, Enum):
    """Job kinds. B is the input-grad backward, W the weight-grad backward, BW both fused."""

    F = "F"
    B = "B"
    W = "W"
    BW = "BW"

    def __str__(self) -> str:  # "F", not "Kind.F"
        return self.value


class Placement(str, Enum):
    """How global chunks map onto devices."""

    INTERLEAVED = "interleaved"
    V = "v"

    def __str__(self) -> str:
        return self.value


def device_of(chunk: int, pp: int, placement: Placement | str) -> int:
    """Device that holds global chunk ``chunk`` (see the module docstring)."""
    if Placement(placement) is Placement.INTERLEAVED or (chunk // pp) % 2 == 0:
        return chunk % pp
    return pp - 1 - chunk % pp


def chunks_of(device: int, pp: int, vpp: int, placement: Placement | str) -> list[int]:
    """Global chunks held by ``device``, in increasing order (its local chunks 0..vpp-1)."""
    return [c for c in range(pp * vpp) if device_of(c, pp, placement) == device]


_JOB_RE = re.compile(r"^\s*(BW|F|B|W)\s*(\d+)\s*\.\s*(\d+)\s*$")


class Job(NamedTuple):
    """One unit of work: ``kind`` of microbatch ``mb`` on global chunk ``chunk``."""

    kind: Kind
    mb: int
    chunk: int

    def __str__(self) -> str:
        return f"{self[0]._value_}{self[1]}.{self[2]}"

    @classmethod
    def parse(cls, text: str) -> "Job":
        m = _JOB_RE.match(text)
        if not m:
            raise ValueError(
                f"cannot parse job {text!r}: expected KIND MICROBATCH.CHUNK with KIND in F, B, W, BW, e.g. 'F3.1'"
            )
        return cls(Kind(m.group(1)), int(m.group(2)), int(m.group(3)))


def F(mb: int, chunk: int) -> Job:
    return Job(Kind.F, mb, chunk)


def B(mb: int, chunk: int) -> Job:
    return Job(Kind.B, mb, chunk)


def W(mb: int, chunk: int) -> Job:
    return Job(Kind.W, mb, chunk)


def BW(mb: int, chunk: int) -> Job:
    return Job(Kind.BW, mb, chunk)


@dataclass(frozen=True, slots=True)
class Schedule:
    """Per device an ordered tuple of jobs, plus the shape it was made for.

    ``overlapped`` holds ``(device, index)`` pairs: the job at ``index`` and the one at
    ``index + 1`` on that device run as one overlapped pair (DualPipe's F&B overlap).
    ``meta`` carries free-form provenance (builder options, memory limit used, ...).
    ``witness`` (optional, from a builder; never saved to files) is, per device and job, the
    job's rank in one order of all jobs that respects every dependency and each device's
    order, e.g. the order in which a list scheduler placed them. It proves the schedule cannot
    deadlock; the validator checks it with a few vectorised comparisons instead of
    re-simulating. A wrong witness is never trusted: it only sends validation down the slow path.
    """

    name: str
    pp: int
    vpp: int
    microbatches: int
    placement: Placement
    devices: tuple[tuple[Job, ...], ...]
    overlapped: frozenset[tuple[int, int]] = frozenset()
    meta: dict = field(default_factory=dict, compare=False, hash=False)
    witness: tuple | None = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "placement", Placement(self.placement))
        object.__setattr__(self, "devices", tuple(tuple(d) for d in self.devices))
        object.__setattr__(self, "overlapped", frozenset(self.overlapped))

    @property
    def num_chunks(self) -> int:
        return self.pp * self.vpp

    @property
    def num_jobs(self) -> int:
        return sum(len(d) for d in self.devices)

    def device_of(self, chunk: int) -> int:
        return device_of(chunk, self.pp, self.placement)

    def chunks_of(self, device: int) -> list[int]:
        return chunks_of(device, self.pp, self.vpp, self.placement)

    def jobs(self) -> Iterator[tuple[int, int, Job]]:
        """Yield ``(device, index, job)`` for every job."""
        for d, seq in enumerate(self.devices):
            for i, job in enumerate(seq):
                yield d, i, job

    def to_text(self) -> str:
        """One line per device: ``d0: F0.0 F1.0 B0.0 ...``."""
        return "\n".join(f"d{d}: " + " ".join(job_strings(seq)) for d, seq in enumerate(self.devices))


def job_strings(seq: Iterable[Job]) -> list[str]:
    """``str(job)`` for each job (the hot path of writing 200k-job schedules)."""
    return [f"{k._value_}{mb}.{c}" for k, mb, c in seq]


def make_schedule(name: str, pp: int, vpp: int, microbatches: int, placement: Placement | str,
                  devices: Iterable[Iterable[Job]], *, witness: Sequence[Sequence[int]] | None = None,
                  **meta) -> Schedule:
    """Convenience constructor used by builders (``witness``: see :class:`Schedule`)."""
    return Schedule(name, pp, vpp, microbatches, Placement(placement), tuple(tuple(d) for d in devices), meta=meta,
                    witness=None if witness is None else tuple(witness))
