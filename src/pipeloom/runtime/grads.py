"""A rank's gradients for one step: one flat fp32 buffer and the reducer that syncs it (needs torch).

:class:`GradBuffer` holds every parameter's gradient of the step as a view of one flat fp32
tensor (bf16 parameters get fp32 "master" grads; fp32 parameters lend their ``.grad`` to the
views during the step so that autograd accumulates straight into the buffer).

A :class:`GradReducer` makes the buffer's data-parallel replicas agree. The executor calls it at
fixed points of every step::

    start(buffer)      before the first job (the buffer is zeroed, nothing accumulated yet)
    chunk_done(k)      right after the LAST W or BW of chunk k on this rank: chunk k's gradients
                       are complete (except those of a parameter another chunk shares)
    finish()           after the last job, before the gradients are installed as ``.grad``
                       (and so before the optimizer step): every reduction must be complete

:class:`AllReduceAfterAccumulation` (the default, ``reducer="allreduce"``) does nothing until
``finish`` and then all-reduces the whole buffer once over the data-parallel group and divides
by its size (reduce after accumulation: one collective per step).

The buffer is laid out in chunk segments (:func:`chunk_segments`), so a chunk's gradients are one
contiguous slice. :class:`OverlappedAllReduce` (``"overlap"``) starts an asynchronous all-reduce of a
chunk's slice as soon as the chunk's last W/BW of the step has run on this rank, so the reduction
runs while the rank drains the pipeline; ``finish`` only waits. :class:`ZeroReduceScatter`
(``"zero1"``) reduce-scatters each slice instead (each dp rank keeps the mean of its 1/dp shard) and
:class:`~pipeloom.runtime.zero1.Zero1Optimizer` keeps the optimizer states (and, with bf16 parameters, the fp32 master
weights) for those shards only, then all-gathers the parameters. Every wait honours a timeout and names the dp peers that never reached
the collective (:class:`Arrivals`).
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence, runtime_checkable

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True, slots=True)
class Segment:
    """One chunk's contiguous slice ``[start, end)`` of a :class:`GradBuffer`: ``n`` gradient elements
    then zero padding up to ``end``. ``waits``: the chunks whose last W/BW must have run before the
    slice is final (the chunk itself, plus any chunk sharing one of its parameters)."""

    chunk: int | None
    start: int
    n: int
    end: int
    waits: frozenset
    params: tuple = field(compare=False)


def _local(p: torch.Tensor) -> torch.Tensor:
    """A DTensor parameter's local shard (torch ``parallelize_module``); any other tensor itself."""
    return p.to_local() if hasattr(p, "device_mesh") and hasattr(p, "to_local") else p


def chunk_segments(params: Sequence[nn.Parameter], chunks: dict[int, Sequence[nn.Parameter]],
                   multiple: int = 1) -> list[Segment]:
    """Group ``params`` (each once) by the first chunk listing them, in chunk order; pad every group to a
    multiple of ``multiple`` elements. Parameters no chunk lists go last and wait for every chunk."""
    owner: dict[int, int | None] = {}
    users: dict[int, set] = {}
    for k, ps in chunks.items():
        for p in ps:
            owner.setdefault(id(p), k)
            users.setdefault(id(p), set()).add(k)
    order = list(chunks) + [None]
    groups: dict = {k: [] for k in order}
    for p in params:
        groups[owner.get(id(p))].append(p)
    out, off = [], 0
    for k in order:
        ps = groups[k]
        if not ps:
            continue
        n = sum(_local(p).numel() for p in ps)
        waits = frozenset(c for p in ps for c in users.get(id(p), chunks))
        end = off + -(-n // multiple) * multiple
        out.append(Segment(k, off, n, end, waits, tuple(ps)))
        off = end
    return out


class GradBuffer:
    """One zeroed flat fp32 tensor and a view of it per parameter (in ``params`` order).

    Args:
        params: the rank's trainable parameters, each once (a parameter two chunks share too).
        chunks: chunk id -> that chunk's parameters (for reducers that work per chunk).
        device: where the buffer lives.
    """

    def __init__(self, params: Sequence[nn.Parameter], chunks: dict[int, Sequence[nn.Parameter]],
                 device: torch.device) -> None:
        self.params = list(params)
        self.chunks = {k: list(ps) for k, ps in chunks.items()}
        self.device = device
        self.keep = False  # True: :meth:`install` leaves .grad alone (a sharded optimizer owns the reduced grads)
        self.segments = chunk_segments(self.params, self.chunks, 1)
        self._new()

    def align(self, multiple: int) -> None:
        """Lay the buffer out again with every chunk segment padded to a multiple of ``multiple``
        elements (zero padding), so that a segment splits into equal shards; contents are reset."""
        segs = chunk_segments(self.params, self.chunks, multiple)
        if segs != self.segments:
            self.segments = segs
            self._new()

    def _new(self) -> None:
        size = self.segments[-1].end if self.segments else 0
        self.flat = torch.zeros(size, dtype=torch.float32, device=self.device)
        self.given = False  # True once views of it were installed as .grad (then it is the user's)
        self.views: dict[nn.Parameter, torch.Tensor] = {}
        for seg in self.segments:
            off = seg.start
            for p in seg.params:
                loc = _local(p)
                view = self.flat[off:off + loc.numel()].view(loc.shape)
                if loc is not p:  # a DTensor parameter: its gradient is a DTensor whose local shard is the view
                    from torch.distributed.tensor import DTensor
                    view = DTensor.from_local(view, p.device_mesh, p.placements, run_check=False)
                self.views[p] = view
                off += loc.numel()

    def __getitem__(self, p: nn.Parameter) -> torch.Tensor:
        return self.views[p]

    def reset(self) -> None:
        """Zero for a new step (a new tensor if the last one was handed out as ``.grad``)."""
        if self.given:
            self._new()
        else:
            self.flat.zero_()

    def lend(self) -> list:
        """Point every parameter's ``.grad`` at its view, so autograd accumulates into the buffer;
        return the grads the parameters had before (for :meth:`restore`)."""
        before = [p.grad for p in self.params]
        for p in self.params:
            p.grad = self.views[p]
        return before

    def restore(self, before: list) -> None:
        """Give the parameters back the grads :meth:`lend` returned."""
        for p, g in zip(self.params, before):
            p.grad = g

    @torch.no_grad()
    def install(self, master: dict[nn.Parameter, nn.Parameter]) -> None:
        """Leave the step's gradients in ``.grad`` of each parameter (or of its fp32 master copy).
        A parameter without a grad gets the view itself (no copy; the next step then accumulates
        into a new buffer, so grads handed out are never overwritten); an existing grad is added to.
        Nothing when ``keep`` is set (ZeRO-1: the reduced gradients are the optimizer's shards)."""
        if self.keep:
            return
        for p in self.params:
            target = master.get(p, p)
            g = self.views[p]
            if target.grad is None:
                if target.dtype == g.dtype:
                    target.grad = g
                    self.given = True
                else:
                    target.grad = g.to(target.dtype, copy=True)
            else:
                target.grad.add_(g.to(target.grad.dtype))


@runtime_checkable
class GradReducer(Protocol):
    """Makes the data-parallel replicas of a :class:`GradBuffer` agree (see the module docstring)."""

    def start(self, buffer: GradBuffer) -> None:
        """A step begins; ``buffer`` is zeroed and will accumulate this step's gradients."""

    def chunk_done(self, chunk: int) -> None:
        """Chunk ``chunk``'s last W/BW of the step on this rank has run."""

    def finish(self) -> None:
        """Every job has run; return only when the buffer holds the reduced gradients."""


def _collective(name: str) -> Callable:
    """torch >= 2.13 names the flat collectives ``*_single`` (the ``*_tensor`` names are deprecated)."""
    new = {"reduce_scatter": "reduce_scatter_single", "all_gather": "all_gather_single"}[name]
    old = {"reduce_scatter": "reduce_scatter_tensor", "all_gather": "all_gather_into_tensor"}[name]
    return getattr(dist, new, None) or getattr(dist, old)


class Arrivals:
    """Who reached which collective: every rank records its count of data-parallel collectives in the
    process group's key-value store before it joins one, so that a rank whose wait times out can name
    the peers that never arrived (a timed-out collective itself names nobody)."""

    _made: dict[str, int] = {}  # instances per name: every rank makes them in the same order

    def __init__(self, group, name: str) -> None:
        self.group = group
        n = Arrivals._made[name] = Arrivals._made.get(name, 0) + 1
        self.name = f"{name}{n}"  # a new key space per instance: counts of earlier runs do not mix in
        self.peers = dist.get_process_group_ranks(group) if group is not None else [dist.get_rank()]
        self.me = dist.get_rank()
        self.seq = 0
        try:
            from torch.distributed.distributed_c10d import _get_default_store
            self.store = _get_default_store()
        except Exception:  # no store (a custom init): errors then name the group, not the rank
            self.store = None

    def arrive(self) -> None:
        self.seq += 1
        if self.store is not None:
            self.store.set(f"pipeloom/{self.name}/{self.me}", str(self.seq))

    def missing(self) -> list[int]:
        """Peers whose count is behind this rank's (they did not reach this collective)."""
        if self.store is None:
            return []
        out = []
        for r in self.peers:
            if r == self.me:
                continue
            key = f"pipeloom/{self.name}/{r}"
            try:
                seen = int(self.store.get(key)) if self.store.check([key]) else 0
            except Exception:
                continue
            if seen < self.seq:
                out.append(r)
        return out


def wait_named(work, timeout_s: float | None, what: str, arrivals: Arrivals | None = None) -> None:
    """Wait for ``work`` at most ``timeout_s``; on a timeout or failure raise a one-line
    :class:`~pipeloom.runtime.p2p.PeerError` naming this rank, ``what``, and the peers that did not arrive."""
    from .p2p import PeerError

    try:
        ok = work.wait(_dt.timedelta(seconds=timeout_s)) if timeout_s is not None else work.wait()
        err = None if ok is not False else "timed out"
    except Exception as e:  # DistBackendError / RuntimeError from the backend
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        err = f"timed out ({text})" if ("imeout" in text or "imed out" in text) else f"failed ({text})"
    if err is None:
        return
    gone = arrivals.missing() if arrivals is not None else []
    who = (f": rank{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))} did not arrive" if gone
           else f" (group ranks {', '.join(map(str, arrivals.peers))})" if arrivals is not None else "")
    after = f" after {timeout_s:g}s" if timeout_s is not None and err.startswith("timed out") else ""
    raise PeerError(f"rank {dist.get_rank()}: {what}: {err.split(' (')[0]}{after}{who}"
                    + (f" ({err.split(' (', 1)[1]}" if " (" in err and not gone else ""))


def barrier(group=None, timeout_s: float | None = None, what: str = "barrier") -> None:
    """A barrier over ``group`` that gives up after ``timeout_s`` naming the ranks that did not arrive
    (gloo: :func:`torch.distributed.monitored_barrier`, which names them itself; other backends: an
    asynchronous barrier and the key-value store's arrival counts)."""
    from .p2p import PeerError

    if timeout_s is None:
        dist.barrier(group=group)
        return
    if dist.get_backend(group) == "gloo":
        try:
            dist.monitored_barrier(group=group, timeout=_dt.timedelta(seconds=timeout_s), wait_all_ranks=True)
        except Exception as e:
            text = " ".join(str(e).split())[:300] or type(e).__name__
            raise PeerError(f"rank {dist.get_rank()}: {what}: not passed within {timeout_s:g}s ({text})") from None
        return
    arrivals = Arrivals(group, "barrier")
    arrivals.arrive()
    wait_named(dist.barrier(group=group, async_op=True), timeout_s, what, arrivals)


class AllReduceAfterAccumulation:
    """Today's reducer: one all-reduce (mean) of the whole buffer over ``group`` at ``finish``.

    Args:
        group: the data-parallel process group of this pipeline stage (None or size 1: no-op).
        timeout_s: longest wait for the all-reduce (None: the process group's timeout).
    """

    def __init__(self, group=None, *, timeout_s: float | None = None) -> None:
        self.group = group
        self.size = dist.get_world_size(group) if group is not None else 1
        self.timeout_s = timeout_s
        self.buffer: GradBuffer | None = None
        self.arrivals = Arrivals(group, "dp") if self.size > 1 else None
        self.steps = 0

    def start(self, buffer: GradBuffer) -> None:
        self.buffer = buffer

    def chunk_done(self, chunk: int) -> None:
        pass

    def finish(self) -> None:
        if self.size > 1 and self.buffer is not None:
            self.arrivals.arrive()
            w = dist.all_reduce(self.buffer.flat, group=self.group, async_op=True)
            wait_named(w, self.timeout_s, f"step {self.steps}: data-parallel all-reduce of the gradients",
                       self.arrivals)
            self.buffer.flat.div_(self.size)
        self.steps += 1


class _PerChunk:
    """Base of the per-chunk reducers: one collective per chunk segment of the buffer, started
    asynchronously as soon as the segment is final (``overlap``: at ``chunk_done`` of every chunk in
    its ``waits``; else all at ``finish``), all waited for (at most ``timeout_s`` each) in ``finish``.
    Each segment is reduced exactly once per step; segments of a dp group start in the same order on
    every replica (they share the pp stage and so the job list)."""

    align_to_size = False
    what = "collective"

    def __init__(self, group=None, *, overlap: bool = True, timeout_s: float | None = None) -> None:
        self.group = group
        self.size = dist.get_world_size(group) if group is not None else 1
        self.rank = dist.get_rank(group) if group is not None else 0
        self.overlap = overlap
        self.timeout_s = timeout_s
        self.buffer: GradBuffer | None = None
        self.arrivals = Arrivals(group, "dp") if self.size > 1 else None
        self.steps = 0
        self.launched: list[int] = []  # segment indices in start order (tests and benchmarks read it)

    def start(self, buffer: GradBuffer) -> None:
        if self.size > 1 and self.align_to_size:
            buffer.align(self.size)
        self.buffer = buffer
        self._done: set = set()
        self._todo = list(range(len(buffer.segments)))
        self._works: list[tuple[int, object]] = []
        self.launched = []

    def chunk_done(self, chunk: int) -> None:
        if not self.overlap or self.size == 1:
            return
        self._done.add(chunk)
        ready = [i for i in self._todo if self.buffer.segments[i].waits <= self._done]
        for i in ready:
            self._todo.remove(i)
            self._launch(i)

    def finish(self) -> None:
        if self.size == 1 or self.buffer is None:
            self.steps += 1
            return
        for i in self._todo:
            self._launch(i)
        self._todo = []
        for i, w in self._works:
            seg = self.buffer.segments[i]
            wait_named(w, self.timeout_s, f"step {self.steps}: data-parallel {self.what} of chunk {seg.chunk}",
                       self.arrivals)
        self._works = []
        self._after()
        self.steps += 1

    def _launch(self, i: int) -> None:
        self.arrivals.arrive()
        self.launched.append(i)
        self._works.append((i, self._collective(self.buffer.segments[i])))

    def _collective(self, seg: Segment):
        raise NotImplementedError

    def _after(self) -> None:
        raise NotImplementedError


class OverlappedAllReduce(_PerChunk):
    """All-reduce (mean) of each chunk's segment, started right after the chunk's last W/BW on this
    rank (``dist.all_reduce(..., async_op=True)``) while the rank runs on; ``finish`` waits for all."""

    what = "all-reduce"

    def _collective(self, seg: Segment):
        return dist.all_reduce(self.buffer.flat[seg.start:seg.end], group=self.group, async_op=True)

    def _after(self) -> None:
        self.buffer.flat.div_(self.size)


class ZeroReduceScatter(_PerChunk):
    """ZeRO-1 gradients: reduce-scatter (mean) of each chunk segment over the dp group, in place: this
    rank's shard (``1/size`` of the padded segment) of the buffer holds the reduced gradient, the rest
    is left as it was. :class:`~pipeloom.runtime.zero1.Zero1Optimizer` updates the shards and all-gathers the parameters.
    The buffer is not installed as ``.grad`` (``keep``): the gradients live in the optimizer's shards."""

    align_to_size = True
    what = "reduce-scatter"

    def start(self, buffer: GradBuffer) -> None:
        super().start(buffer)
        buffer.keep = True

    def shard(self, seg: Segment) -> tuple[int, int]:
        """[lo, hi) of this rank's shard of ``seg`` in the buffer."""
        L = (seg.end - seg.start) // self.size
        return seg.start + self.rank * L, seg.start + (self.rank + 1) * L

    def _collective(self, seg: Segment):
        lo, hi = self.shard(seg)
        flat = self.buffer.flat
        return _collective("reduce_scatter")(flat[lo:hi], flat[seg.start:seg.end], group=self.group, async_op=True)

    def _after(self) -> None:
        for seg in self.buffer.segments:
            lo, hi = self.shard(seg)
            self.buffer.flat[lo:hi].div_(self.size)

    def shard_grads(self) -> list[torch.Tensor]:
        """This rank's reduced gradient shard of every segment (views of the buffer)."""
        return [self.buffer.flat[slice(*self.shard(seg))] for seg in self.buffer.segments]


REDUCERS = {"allreduce": AllReduceAfterAccumulation, "overlap": OverlappedAllReduce, "zero1": ZeroReduceScatter}


def make_reducer(reducer: str | GradReducer, group=None) -> GradReducer:
    """The reducer named ``reducer`` (one of :data:`REDUCERS`) for ``group``, or ``reducer`` itself."""
    if isinstance(reducer, str):
        cls = REDUCERS.get(reducer)
        if cls is None:
            raise ValueError(f"unknown gradient reducer {reducer!r}; choose one of: {', '.join(REDUCERS)}")
        return cls(group)
    if not isinstance(reducer, GradReducer):
        raise TypeError(f"reducer must be a name ({', '.join(REDUCERS)}) or have start/chunk_done/finish, "
                        f"got {type(reducer).__name__}")
    return reducer


__all__ = ["AllReduceAfterAccumulation", "Arrivals", "GradBuffer", "GradReducer", "OverlappedAllReduce", "REDUCERS",
           "Segment", "ZeroReduceScatter", "barrier", "chunk_segments", "make_reducer",
           "wait_named"]
