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

import csv
import io
import json
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


class ScheduleFormatError(ValueError):
    """A schedule file or value is malformed."""


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

    def with_name(self, name: str) -> "Schedule":
        return Schedule(name, self.pp, self.vpp, self.microbatches, self.placement, self.devices,
                        self.overlapped, dict(self.meta), self.witness)

    # ------------------------------------------------------------------ text forms
    def to_text(self) -> str:
        """One line per device: ``d0: F0.0 F1.0 B0.0 ...``."""
        return "\n".join(f"d{d}: " + " ".join(_job_strs(seq)) for d, seq in enumerate(self.devices))

    def to_dict(self) -> dict:
        return {
            "format": "pipeloom-schedule/1",
            "name": self.name,
            "pp": self.pp,
            "vpp": self.vpp,
            "microbatches": self.microbatches,
            "placement": self.placement.value,
            "devices": [_job_strs(seq) for seq in self.devices],
            "overlapped": sorted([list(p) for p in self.overlapped]),
            "meta": self.meta,
        }

    def to_json(self, indent: int | None = 1) -> str:
        """JSON text; with ``indent`` each device's job list is one line (and written by json's C encoder)."""
        d = self.to_dict()
        if indent is None:
            return json.dumps(d)
        devices = d.pop("devices")
        overlapped = d.pop("overlapped")
        head = json.dumps(d, indent=indent)
        pad = " " * indent
        rows = ",\n".join(pad * 2 + json.dumps(seq) for seq in devices)
        return (f'{head[:-2]},\n{pad}"overlapped": {json.dumps(overlapped)},\n'
                f'{pad}"devices": [\n{rows}\n{pad}]\n}}')

    @classmethod
    def from_dict(cls, data: dict) -> "Schedule":
        devs = data.get("devices", [])
        if not isinstance(devs, list) or not all(isinstance(d, list) for d in devs):
            raise ScheduleFormatError("schedule JSON: 'devices' must be a list with one list of jobs per device, "
                                      "e.g. [[\"F0.0\", \"BW0.0\"], [\"F0.1\", \"BW0.1\"]]")
        try:
            devices = [[Job.parse(s) for s in seq] for seq in data["devices"]]
        except KeyError as e:
            raise ScheduleFormatError(f"schedule JSON lacks the key {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ScheduleFormatError(f"schedule JSON has a bad job list: {e}") from None
        pp = _count(data.get("pp", len(devices)), "pp")
        inferred = _infer_shape(devices, pp)
        placement = data.get("placement", inferred[2])
        if placement not in [p.value for p in Placement]:
            raise ScheduleFormatError(f"schedule JSON: placement must be one of "
                                      f"{', '.join(p.value for p in Placement)}, got {placement!r}")
        overlapped = data.get("overlapped", [])
        if not isinstance(overlapped, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(_is_int(x) and x >= 0 for x in p) for p in overlapped):
            raise ScheduleFormatError("schedule JSON: overlapped must be a list of [device, index] pairs of "
                                      "integers >= 0")
        meta = data.get("meta", {})
        if not isinstance(meta, dict):
            raise ScheduleFormatError(f"schedule JSON: meta must be an object, got {type(meta).__name__}")
        return cls(
            name=str(data.get("name", "custom")),
            pp=pp,
            vpp=_count(data.get("vpp", inferred[0]), "vpp"),
            microbatches=_count(data.get("microbatches", inferred[1]), "microbatches"),
            placement=Placement(placement),
            devices=tuple(tuple(s) for s in devices),
            overlapped=frozenset(tuple(p) for p in overlapped),
            meta=dict(meta),
        )

    @classmethod
    def from_json(cls, text: str) -> "Schedule":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ScheduleFormatError(f"not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ScheduleFormatError("schedule JSON must be an object with a 'devices' list")
        return cls.from_dict(data)

    def to_csv(self) -> str:
        """CSV with a ``# pipeloom`` header line of key=value pairs, then ``device,step,job,overlap`` rows."""
        buf = io.StringIO()
        buf.write(
            f"# pipeloom schedule name={self.name} pp={self.pp} vpp={self.vpp} "
            f"microbatches={self.microbatches} placement={self.placement.value}\n"
        )
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["device", "step", "job", "overlap"])
        ov = self.overlapped
        for d, seq in enumerate(self.devices):
            w.writerows([(d, i, job, 1 if (d, i) in ov else 0) for i, job in enumerate(_job_strs(seq))])
        return buf.getvalue()

    @classmethod
    def from_csv(cls, text: str) -> "Schedule":
        """Parse :meth:`to_csv` output, or a hand-written ``device,step,job`` file.

        The header comment is optional: without it pp, vpp, microbatches and placement are
        inferred from the jobs. Rows are ordered by (device, step).
        """
        header: dict[str, str] = {}
        rows: list[tuple[int, int, Job, bool]] = []
        body = []
        for n, line in enumerate(text.splitlines(), 1):
            s = line.strip()
            if not s:
                continue
            if s.startswith("#"):
                for tok in s.lstrip("#").split():
                    if "=" in tok:
                        k, v = tok.split("=", 1)
                        header[k] = v
                continue
            body.append((n, line))
        if not body:
            raise ScheduleFormatError("CSV has no rows; expected a 'device,step,job' header then one row per job")
        reader = csv.reader([b for _, b in body])
        cols = [c.strip().lower() for c in next(reader)]
        need = ("device", "step", "job")
        if not all(c in cols for c in need):
            raise ScheduleFormatError(
                f"CSV header is {','.join(cols)!r}; it must name the columns device,step,job (overlap optional)"
            )
        idx = {c: cols.index(c) for c in cols}
        for (n, _), row in zip(body[1:], reader):
            try:
                d = int(row[idx["device"]])
                st = int(row[idx["step"]])
                job = Job.parse(row[idx["job"]])
                ov = "overlap" in idx and len(row) > idx["overlap"] and row[idx["overlap"]].strip() not in ("", "0")
            except (IndexError, ValueError) as e:
                raise ScheduleFormatError(f"CSV line {n}: {e if str(e) else 'too few columns'}") from None
            if d < 0 or st < 0:
                raise ScheduleFormatError(f"CSV line {n}: device and step must be >= 0")
            rows.append((d, st, job, ov))
        pp = _count(header.get("pp", max(r[0] for r in rows) + 1), "CSV header: pp")
        if any(r[0] >= pp for r in rows):
            raise ScheduleFormatError(f"CSV names a device >= pp={pp}")
        per: list[list[tuple[int, Job, bool]]] = [[] for _ in range(pp)]
        for d, st, job, ov in rows:
            per[d].append((st, job, ov))
        devices, overlapped = [], set()
        for d, lst in enumerate(per):
            lst.sort(key=lambda t: t[0])
            steps = [t[0] for t in lst]
            if len(set(steps)) != len(steps):
                raise ScheduleFormatError(f"CSV gives device {d} two jobs at the same step")
            devices.append([t[1] for t in lst])
            overlapped |= {(d, i) for i, t in enumerate(lst) if t[2]}
        inferred = _infer_shape(devices, pp)
        try:
            return cls(
                name=header.get("name", "custom"),
                pp=pp,
                vpp=_count(header.get("vpp", inferred[0]), "CSV header: vpp"),
                microbatches=_count(header.get("microbatches", inferred[1]), "CSV header: microbatches"),
                placement=Placement(header.get("placement", inferred[2])),
                devices=tuple(tuple(s) for s in devices),
                overlapped=frozenset(overlapped),
            )
        except ScheduleFormatError:
            raise
        except ValueError as e:
            raise ScheduleFormatError(f"CSV header: {e}") from None

    # ------------------------------------------------------------------ files
    def save(self, path: str) -> None:
        text = self.to_csv() if str(path).lower().endswith(".csv") else self.to_json()
        with open(path, "w") as f:
            f.write(text)

    @classmethod
    def load(cls, path: str) -> "Schedule":
        """Read a .json or .csv schedule (other names: JSON if the text starts with '{', else CSV).
        Every error names the file."""
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise ScheduleFormatError(f"cannot read {path}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise ScheduleFormatError(f"cannot read {path}: not a text file (expected a schedule as UTF-8 JSON "
                                      f"or CSV, as written by 'pipeloom plan -o')") from None
        try:
            if str(path).lower().endswith(".csv"):
                return cls.from_csv(text)
            if str(path).lower().endswith(".json"):
                return cls.from_json(text)
            return cls.from_json(text) if text.lstrip().startswith("{") else cls.from_csv(text)
        except ScheduleFormatError as e:
            raise ScheduleFormatError(f"{path}: {e}") from None


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _count(x, name: str) -> int:
    """A shape field of a schedule file: an integer >= 1."""
    if isinstance(x, str) and x.strip().isdigit():
        x = int(x)
    if not _is_int(x) or x < 1:
        raise ScheduleFormatError(f"{name} must be an integer >= 1, got {x!r}")
    return x


def _job_strs(seq: Iterable[Job]) -> list[str]:
    """``str(job)`` for each job (the hot path of writing 200k-job schedules)."""
    return [f"{k._value_}{mb}.{c}" for k, mb, c in seq]


def _infer_shape(devices: Sequence[Sequence[Job]], pp: int) -> tuple[int, int, str]:
    """Infer (vpp, microbatches, placement) from jobs when a file does not say."""
    jobs = [j for seq in devices for j in seq]
    if not jobs:
        return 1, 0, Placement.INTERLEAVED.value
    nc = max(j.chunk for j in jobs) + 1
    vpp = max(1, -(-nc // max(pp, 1)))
    mbs = max(j.mb for j in jobs) + 1
    placement = Placement.INTERLEAVED.value
    for d, seq in enumerate(devices):
        for j in seq:
            if device_of(j.chunk, pp, Placement.INTERLEAVED) != d:
                placement = Placement.V.value
    return vpp, mbs, placement


def make_schedule(name: str, pp: int, vpp: int, microbatches: int, placement: Placement | str,
                  devices: Iterable[Iterable[Job]], *, witness: Sequence[Sequence[int]] | None = None,
                  **meta) -> Schedule:
    """Convenience constructor used by builders (``witness``: see :class:`Schedule`)."""
    return Schedule(name, pp, vpp, microbatches, Placement(placement), tuple(tuple(d) for d in devices), meta=meta,
                    witness=None if witness is None else tuple(witness))
