"""A drawable timeline: rows of job bars plus a memory curve per row (no torch, no matplotlib).

Both a planned schedule (a :class:`~pipeloom.sim.simulate.SimResult`) and a measured run
(:class:`~pipeloom.trace.reader.RunLog`) become a :class:`Timeline`; the Gantt (PNG/SVG), the
HTML page and the Chrome trace all draw from it, so planned and measured pictures look alike.

Colours: one hue per job kind (F blue, B orange, W green, BW red); the local chunk of a
device is shown by shade (chunk 0 full colour, later chunks lighter).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..core import rules
from ..core.ir import Kind, Schedule
from ..core.costs import MemModel
from ..sim.simulate import SimResult

KIND_COLORS = {"F": "#3b6fb6", "B": "#e08a2c", "W": "#3f9b57", "BW": "#c0392b"}
KIND_NAMES = {"F": "forward", "B": "input-grad backward", "W": "weight-grad backward", "BW": "full backward"}
IDLE_COLOR = "#eeeeee"


def shade(hex_color: str, local_chunk: int, vpp: int) -> str:
    """Colour of ``local_chunk`` (0..vpp-1): chunk 0 full colour, the last one mixed 55% with white."""
    if vpp <= 1 or local_chunk <= 0:
        return hex_color
    f = 0.55 * min(local_chunk, vpp - 1) / (vpp - 1)
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    mix = [round(c + (255 - c) * f) for c in (r, g, b)]
    return "#" + "".join(f"{c:02x}" for c in mix)


@dataclass(slots=True)
class Bar:
    """One job interval on a row."""

    kind: str
    mb: int
    chunk: int
    """global chunk id (-1 when unknown)"""
    local: int
    """local chunk index on the device (0..vpp-1), drives the shade"""
    start: float
    end: float
    step: int | None = None
    lane: int = 0
    """0 = full height; 1/2 = top/bottom half (the two jobs of an overlapped pair)"""
    late: float = 0.0
    """how much later than planned it started (same unit as start), 0 if on time or unknown"""
    wait: float = 0.0
    """time before ``start`` that the log counted as part of the job but was spent waiting for its input"""

    @property
    def label(self) -> str:
        return str(self.mb)

    @property
    def name(self) -> str:
        return f"{self.kind}{self.mb}.{self.chunk}" if self.chunk >= 0 else f"{self.kind}{self.mb}"


@dataclass(slots=True)
class Row:
    label: str
    bars: list[Bar] = field(default_factory=list)
    memory: list[tuple[float, float]] = field(default_factory=list)
    """(time, units) points of the activation-memory curve; empty = no curve"""
    device: int = 0
    rank: int | None = None
    machine: int | None = None

    def busy(self, t0: float, t1: float) -> float:
        """Busy time inside [t0, t1], overlapped pairs counted once."""
        spans = sorted((max(b.start, t0), min(b.end, t1)) for b in self.bars if b.end > t0 and b.start < t1)
        tot, cur_s, cur_e = 0.0, None, None
        for s, e in spans:
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    tot += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        if cur_e is not None:
            tot += cur_e - cur_s
        return tot


@dataclass(slots=True)
class Timeline:
    title: str
    rows: list[Row]
    vpp: int = 1
    unit: str = "time units"
    """label of the time axis unit ("cost units", "ms", ...)"""
    t0: float = 0.0
    t1: float = 0.0
    steps: list[tuple[int, float, float]] = field(default_factory=list)
    """(step, start, end) of each step drawn (measured runs)"""
    mem_limit: float | None = None
    subtitle: str = ""
    dp_bands: list[list[tuple[float, float, str]]] = field(default_factory=list)
    """per row: (start, end, label) of the data-parallel gradient collectives (pipeloom.sim.dp), drawn as a
    thin band under the row; empty = none"""

    def bubble(self, row: Row) -> float:
        """Idle fraction of ``row`` over the whole window (or summed over the steps when given)."""
        windows = [(s, e) for _, s, e in self.steps] or [(self.t0, self.t1)]
        total = sum(e - s for s, e in windows)
        if total <= 0:
            return 0.0
        return 1.0 - sum(row.busy(s, e) for s, e in windows) / total

    def kinds(self) -> list[str]:
        seen = {b.kind for r in self.rows for b in r.bars}
        return [k for k in ("F", "B", "W", "BW") if k in seen]

    def peak_memory(self) -> float:
        return max((v for r in self.rows for _, v in r.memory), default=0.0)


def memory_curve(bars: list[Bar], deltas: list[float], start_value: float = 0.0) -> list[tuple[float, float]]:
    """Piecewise-linear memory: each job ramps from the level before it to the level after it."""
    pts: list[tuple[float, float]] = []
    cur = start_value
    for bar, dv in zip(bars, deltas):
        if not pts:
            pts.append((bar.start, cur))
        elif bar.start > pts[-1][0]:
            pts.append((bar.start, cur))
        cur += dv
        pts.append((bar.end, cur))
    return pts


def memory_deltas(kinds_chunks: list[tuple[str, int]], num_chunks: int, vpp: int,
                  mem: MemModel | None = None) -> list[float]:
    """Activation change of each job (kind "F", "B", "W" or "BW", chunk): :func:`pipeloom.core.rules.memory_delta`
    under the model of :mod:`pipeloom.core.costs`. A kind or chunk outside the schedule is a ValueError naming it."""
    a, b = (mem or MemModel()).per_chunk(num_chunks, vpp)
    table = rules.memory_deltas(num_chunks, a, b)
    out = []
    for kind, c in kinds_chunks:
        try:
            k = Kind(kind)
        except ValueError:
            raise ValueError(f"job kind {kind!r} is not one of F, B, W, BW") from None
        if not (isinstance(c, int) and 0 <= c < num_chunks):
            raise ValueError(f"{kind} job on chunk {c!r}: the schedule has chunks 0..{num_chunks - 1}")
        out.append(table[k][c])
    return out


def from_sim(res: SimResult, *, mem: MemModel | None = None, mem_limit: float | None = None,
             title: str | None = None, unit: str = "cost units") -> Timeline:
    """Timeline of a simulated (planned) schedule."""
    sched: Schedule = res.schedule
    rows = []
    for d, seq in enumerate(sched.devices):
        local = {c: i for i, c in enumerate(sched.chunks_of(d))}
        bars = []
        for i, job in enumerate(seq):
            lane = 0
            if (d, i) in sched.overlapped:
                lane = 1
            elif i > 0 and (d, i - 1) in sched.overlapped:
                lane = 2
            bars.append(Bar(job.kind.value, job.mb, job.chunk, local.get(job.chunk, 0),
                            res.start[d][i], res.end[d][i], lane=lane))
        deltas = memory_deltas([(b.kind, b.chunk) for b in bars], sched.num_chunks, sched.vpp, mem)
        rows.append(Row(label=f"dev {d}", bars=bars, memory=memory_curve(bars, deltas), device=d))
    head = title or (f"{sched.name}  pp={sched.pp} vpp={sched.vpp} m={sched.microbatches}  (planned)")
    sub = (f"makespan {res.makespan:.4g} {unit}   bubble {100 * res.bubble:.1f}%   "
           f"stage bubble {100 * res.stage_bubble:.1f}%   peak memory {max(res.peak_memory or [0]):.3g} units")
    if mem_limit is not None:
        sub += f" (limit {mem_limit:.3g})"
    return Timeline(title=head, rows=rows, vpp=sched.vpp, unit=unit, t0=0.0, t1=res.makespan,
                    mem_limit=mem_limit, subtitle=sub)
