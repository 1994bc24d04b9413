"""Tensor-parallel communication and its overlap with the backward's GEMMs (needs torch).

Every collective of a tensor-parallel layer (:mod:`pipeloom.models.tp`) goes through :func:`start` /
:func:`run` here, so that one switch (:func:`set_link`) can put all of them on an *emulated link*: a
collective runs on a communication thread after a delay (``time.sleep``: no CPU used), and its result
lands only then; the link carries one collective at a time (one started while another is in flight lands
its delay after that one: the pieces of a chunked collective share the link as bandwidth would). A read of a result before its wait therefore sees the unreduced values: with random
delays per collective (``jitter``) a run that is bitwise equal to the undelayed run has no such race
(``tests/runtime/test_tp_overlap.py``). Without a link the collectives are torch's own asynchronous
ones (``async_op=True`` work handles; gloo runs all_reduce, reduce_scatter and all_gather asynchronously).

The column-parallel GEMMs that share one input (q, k, v; w1, w3; the head) are ONE autograd function,
:func:`column_parallel`, which owns their input gradient's collective (Megatron's ``f``: all-reduce; with
sequence parallelism the all-gather before and the reduce-scatter of the input gradient)::

    forward   x_full = x (or all-gather of the sequence shards);  y_i = x_full W_i^T
              keep for dW: x_full, or with sequence parallelism the shard x (a Shard, gathered again)
    backward  [sequence parallel, fused: start the re-gather of x]   -- before the dgrad, as Megatron
              dx = sum_i dy_i W_i  (in K token pieces: chunked:K)   -- each piece's collective starts at once
              overlapped work (below)                    <- a fused dW waits for the re-gather first
              wait for every piece; return dx            <- nothing reads dx before its wait

The overlapped work is chosen by the executor per job through :data:`STATE` (``mode``, ``fuse``):

    fuse (a BW job, or in async/chunked/fill a B whose own W is the next job)   the GEMMs' weight gradients
          dW_i += dy_i^T x_full, with the executor's W arithmetic (STATE.wgrad), into the gradient buffer
    fill  (a split B)     queued weight-gradient work of an EARLIER microbatch (STATE.fill), one GEMM at a
          time while the collective is in flight
    otherwise             nothing: the weight gradients wait for W (off: the collective is blocking)

The weight gradients of these GEMMs never pass through autograd when their module's split backward
defers them (``module.split_stash``, set by :class:`pipeloom.autograd.splitgrad.SplitGrad`): the
function stashes ``[module, x_full, dy]`` entries exactly as the split backward's hooks do, and
whatever computes them (W, the fused overlap, fill) runs the same ``weight_grads`` arithmetic, so every
mode gives bitwise the same gradients. Whatever consumes a weight gradient (the DP reduction, the
optimizer) runs after the step's last job, after every GEMM: the two ordering rules of the overlap hold
by construction. Without a split backward (a plain ``loss.backward()``) the function returns the weight
gradients to autograd like ``F.linear``.

Sequence parallelism (Megatron's behaviour, brought under the zero-bubble split): the forward all-gathers the
shards and frees the gathered input after its GEMMs; the group keeps only this rank's shard (:class:`Shard`)
and whoever computes its weight gradients gathers it again first: a fused backward starts that gather before
the dgrad and waits for it before the wgrad GEMMs; W (:func:`regather_wgrad`) runs its entries in stash
order, group k+1's gather started before group k's GEMMs (a double buffer: at most two gathered inputs
alive). ``fill`` takes only entries whose input is local (row-parallel GEMMs), so every TP rank issues the same
gathers in the same order whatever the timing. :func:`set_regather` (``False``: ``pipeloom run
--keep-gathered-input``) keeps the gathered input from F instead.
"""
from __future__ import annotations

import queue
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .tp_modes import OVERLAP_MODES, parse_overlap  # noqa: F401  (re-exported)

__all__ = ["set_link", "link_delay", "start", "run", "Handle", "STATE", "OverlapState", "parse_overlap",
           "column_parallel", "ColumnSpec", "comm_stats", "OVERLAP_MODES", "TPPeerError", "Shard", "set_regather",
           "regather_wgrad"]


class TPPeerError(RuntimeError):
    """A tensor-parallel collective did not complete within the timeout: names the collective and the peer."""

# torch 2.13 renamed the single-tensor collectives (the old names warn); older torch has only the old ones
_all_gather_1 = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_1 = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# ------------------------------------------------------------------------------------------ the link
class _Wire(threading.Thread):
    """The emulated link: one thread runs the collectives in submission order (the order every TP rank issues
    them), each not before its ``ready_at``."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="pipeloom-tp-link")
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.start()

    def run(self) -> None:
        while True:
            item = self.q.get()
            gap = item.ready_at - time.perf_counter()
            if gap > 0:
                time.sleep(gap)
            try:
                item.fn()
            except BaseException as e:  # reported by the waiter
                item.error = e
            item.event.set()
            item = None  # not kept (with its result buffer) until the next collective arrives


class _Pending:
    __slots__ = ("fn", "ready_at", "event", "error")

    def __init__(self, fn, ready_at: float) -> None:
        self.fn, self.ready_at, self.event, self.error = fn, ready_at, threading.Event(), None


_LINK: dict = {"delay_s": 0.0, "rng": None, "wire": None, "timeout_s": None, "regather": True}


@dataclass(slots=True)
class _Stats:
    exposed_s: float = 0.0   # time the compute thread waited for TP collectives
    count: int = 0           # collectives started
    fused: int = 0           # weight-gradient GEMMs run under their own layer's collective (async)
    filled: int = 0          # queued weight-gradient GEMMs of an earlier microbatch run under a collective (fill)
    pieces: int = 0          # input-gradient collectives started as one piece of a chunked dgrad
    regathers: int = 0       # all-gathers of a sequence-parallel column group's input for its weight gradients
    prefetched: int = 0      # of those, started before the previous group's weight-gradient GEMMs (double buffer)


_STATS = _Stats()


def comm_stats() -> _Stats:
    """This process's running totals: ``exposed_s`` (seconds waited for TP collectives), ``count`` (collectives
    started), ``fused`` / ``filled`` (weight-gradient GEMMs run under a collective by async / fill), ``pieces``
    (collectives of chunked input gradients), ``regathers`` (sequence-parallel inputs gathered again for their
    weight gradients) and ``prefetched`` (of those, started under the previous group's weight-gradient GEMMs)."""
    return _STATS


def set_link(delay_s: float = 0.0, *, jitter_seed: int | None = None, timeout_s: float | None = None) -> None:
    """Put this process's TP collectives on the emulated link: each is held ``delay_s`` seconds (a piece of a
    chunked collective its share), or, with ``jitter_seed``, a random ``uniform(0, delay_s)`` drawn per
    collective. ``delay_s = 0``: torch's own asynchronous collectives (the default). ``timeout_s``: a wait
    that fails raises :class:`TPPeerError` naming the collective and the peers (gloo gives up after the
    group's timeout; the emulated link after ``timeout_s``)."""
    if not delay_s >= 0:
        raise ValueError(f"tensor-parallel link delay must be >= 0 seconds, got {delay_s}")
    _LINK["delay_s"], _LINK["timeout_s"] = float(delay_s), timeout_s
    _LINK["rng"] = random.Random(jitter_seed) if jitter_seed is not None else None
    if delay_s > 0 and _LINK["wire"] is None:
        _LINK["wire"] = _Wire()


def link_delay() -> float:
    """The emulated link's delay per collective in seconds (0: no emulated link)."""
    return _LINK["delay_s"]


class Handle:
    """A started collective: :meth:`wait` once before reading its result; :meth:`done` polls."""

    __slots__ = ("_work", "_pending", "what", "finish", "group")

    def __init__(self, work=None, pending: _Pending | None = None, what: str = "", finish=None, group=None) -> None:
        self._work, self._pending, self.what, self.finish, self.group = work, pending, what, finish, group

    def done(self) -> bool:
        if self._pending is not None:
            return self._pending.event.is_set()
        return self._work is None or self._work.is_completed()

    def wait(self):
        t0 = time.perf_counter()
        if self._pending is not None:
            if not self._pending.event.wait(_LINK["timeout_s"]):
                self._fail("timed out")
            if self._pending.error is not None:
                self._fail(self._pending.error)
        elif self._work is not None:
            try:
                self._work.wait()
            except Exception as e:  # gloo: the group's timeout, or a peer that closed its connection
                self._fail(e)
        _STATS.exposed_s += time.perf_counter() - t0
        out = self.finish() if self.finish is not None else None
        self.finish = None
        return out


    def _fail(self, err) -> None:
        """Raise one line: this rank, the collective, and the peers of its group that did not complete it."""
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        me = dist.get_rank()
        peers = [r for r in dist.get_process_group_ranks(self.group or dist.group.WORLD) if r != me]
        who = (f"rank {peers[0]} did not arrive" if len(peers) == 1
               else f"one of ranks {', '.join(map(str, peers))} did not arrive")
        timed = "imeout" in text or "imed out" in text
        after = f" after {_LINK['timeout_s']:g}s" if timed and _LINK["timeout_s"] else ""
        raise TPPeerError(f"rank {me}: tensor-parallel {self.what}: {'timed out' if timed else 'failed'}{after}: {who}"
                          + ("" if timed else f" ({text})"))


def _op(kind: str, out: torch.Tensor, inp: torch.Tensor | None, group, async_op: bool):
    if kind == "all_reduce":
        return dist.all_reduce(out, group=group, async_op=async_op)
    if kind == "all_reduce_max":
        return dist.all_reduce(out, op=dist.ReduceOp.MAX, group=group, async_op=async_op)
    if kind == "all_gather":
        return _all_gather_1(out, inp, group=group, async_op=async_op)
    if kind == "reduce_scatter":
        return _reduce_scatter_1(out, inp, group=group, async_op=async_op)
    raise ValueError(f"unknown collective {kind!r}")


def start(kind: str, out: torch.Tensor, inp: torch.Tensor | None = None, group=None, *, share: float = 1.0,
          what: str = "") -> Handle:
    """Start collective ``kind`` (all_reduce, all_reduce_max: in place on ``out``; all_gather, reduce_scatter:
    ``inp`` -> ``out``) over ``group``; ``out`` holds the result after the handle's wait."""
    _STATS.count += 1
    delay = _LINK["delay_s"]
    if delay > 0:
        rng = _LINK["rng"]
        d = (rng.uniform(0.0, delay) if rng is not None else delay) * share
        ready = max(time.perf_counter(), _LINK.get("busy_until", 0.0)) + d  # one collective at a time on the link
        _LINK["busy_until"] = ready
        p = _Pending(lambda: _op(kind, out, inp, group, False), ready)
        _LINK["wire"].q.put(p)
        return Handle(pending=p, what=what, group=group)
    return Handle(work=_op(kind, out, inp, group, True), what=what, group=group)


def run(kind: str, out: torch.Tensor, inp: torch.Tensor | None = None, group=None, *, what: str = "") -> torch.Tensor:
    """:func:`start` and wait: ``out`` with the result."""
    start(kind, out, inp, group, what=what).wait()
    return out


# ------------------------------------------------------------------------------------------ overlap state
@dataclass(slots=True)
class OverlapState:
    """What the executor asks of the column-parallel backwards of the job it runs (defaults: nothing)."""

    mode: str = "off"
    """off, async, chunked or fill"""
    chunks: int = 1
    """chunked: token pieces of the input gradient"""
    fuse: bool = False
    """compute the GEMMs' weight gradients in the backward, while the collective is in flight"""
    wgrad: Callable[[list], None] | None = None
    """the executor's W arithmetic on a list of stash entries (``weight_grads`` with its gradient buffer)"""
    fill: Callable[[Callable[[], bool]], None] | None = None
    """run queued weight-gradient work of an earlier microbatch until the argument returns True"""


STATE = OverlapState()


def _seq_first(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1).contiguous()  # (batch, seq, ...) -> (seq, batch, ...): shards are contiguous


def gather_seq_raw(x: torch.Tensor, group, what: str = "") -> torch.Tensor:
    """(batch, seq/t, ...) -> (batch, seq, ...) without autograd (the ranks' shards in rank order)."""
    t = dist.get_world_size(group)
    xs = _seq_first(x)
    out = xs.new_empty((xs.shape[0] * t, *xs.shape[1:]))
    run("all_gather", out, xs, group, what=what)
    return out.transpose(0, 1)


@dataclass(frozen=True, eq=False)
class ColumnSpec:
    """One group of column-parallel GEMMs sharing an input (autograd's non-tensor argument)."""

    modules: tuple
    group: object
    sequence_parallel: bool
    what: str


class Shard:
    """A sequence-parallel column group's input as its backward keeps it (Megatron's accounting): this rank's
    sequence shard ``x`` (batch, seq/t, in), all-gathered again by :meth:`start` right before the group's
    weight gradients. The group's stash entries share one ``Shard`` as their input (``[module, shard, dy]``):
    :func:`regather_wgrad` (or the fused backward) gathers it once for all of them."""

    __slots__ = ("x", "spec")

    def __init__(self, x: torch.Tensor, spec: "ColumnSpec") -> None:
        self.x, self.spec = x, spec

    def start(self) -> Handle:
        """Start the all-gather; the handle's :meth:`Handle.wait` returns the gathered (batch, seq, in) input,
        laid out as the forward's (so every weight gradient is bitwise the one from a kept input)."""
        t = dist.get_world_size(self.spec.group)
        xs = _seq_first(self.x)
        out = xs.new_empty((xs.shape[0] * t, *xs.shape[1:]))
        h = start("all_gather", out, xs, self.spec.group, what=f"re-gather of {self.spec.what} input")
        h.finish = lambda: out.transpose(0, 1)
        _STATS.regathers += 1
        return h


def set_regather(on: bool = True) -> None:
    """With sequence parallelism: ``True`` (the default) a column group keeps only its input's sequence shard for
    its weight gradients and gathers it again before them (:class:`Shard`); ``False`` keeps the all-gathered input
    from the forward (``pipeloom run --keep-gathered-input``). Read by each forward: set it before a step."""
    _LINK["regather"] = bool(on)


def regather_wgrad(stash: list, wgrad: Callable[[list], None], *, prefetch: bool = True) -> None:
    """Compute a split backward's ``stash`` in order with ``wgrad`` (the executor's W arithmetic on a list of
    entries), gathering each sequence-parallel column group's input (:class:`Shard`) first, then empty it.

    ``prefetch`` (double buffer): group k+1's all-gather starts before group k's weight-gradient GEMMs (and the
    row-parallel GEMMs between the two groups), so each gather runs under the GEMMs before it and at most two
    gathered inputs are alive (k's, in use, and k+1's, in flight). Exposed: the first gather and
    ``max(0, gather_k - gemm_{k-1})`` per later one (:func:`pipeloom.tune.comm_terms.regather_exposed`). Without
    it each gather is started and waited right before its group (serial). Every TP rank issues the same gathers
    in the same order: one per group with pending entries, in stash order (fill never takes a group's entries,
    a fused backward takes all of them). Entries are computed in stash order, so each parameter accumulates as
    :func:`pipeloom.autograd.splitgrad.weight_grads` on the whole stash would."""
    items: list[tuple[Shard | None, list]] = []
    for e in stash:
        if e[2] is None:
            continue  # done already, or its output never reached the loss
        sh = e[1] if isinstance(e[1], Shard) else None
        if sh is not None and items and items[-1][0] is sh:
            items[-1][1].append(e)
        else:
            items.append((sh, [e]))
    order = iter([k for k, (sh, _) in enumerate(items) if sh is not None])
    inflight: dict[int, Handle] = {}

    def launch(under_gemms: bool) -> None:
        k = next(order, None)
        if k is not None:
            inflight[k] = items[k][0].start()
            _STATS.prefetched += under_gemms

    if prefetch:
        launch(False)
    for k, (sh, es) in enumerate(items):
        if sh is not None:
            if k not in inflight:
                launch(False)
            x_full = inflight.pop(k).wait()
            if prefetch:
                launch(True)  # the next group's gather under this group's GEMMs
            for e in es:
                e[1] = x_full
            del x_full
        wgrad(list(es))
        for e in es:
            e[1] = e[2] = None
    stash.clear()


class _ColumnGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, spec: ColumnSpec, *weights):
        x_full = gather_seq_raw(x, spec.group, f"all-gather of {spec.what} input") if spec.sequence_parallel else x
        ys = tuple(F.linear(x_full, w) for w in weights)
        stash = getattr(spec.modules[0], "split_stash", None)
        ctx.spec = spec
        ctx.regather = spec.sequence_parallel and _LINK["regather"]  # keep the shard, gather again for dW
        if stash is not None:  # the split backward defers these weight gradients: entries as its hooks make
            held = Shard(x.detach(), spec) if ctx.regather else x_full.detach()
            ctx.entries = [[m, held, None] for m in spec.modules]
            stash.extend(ctx.entries)
            ctx.save_for_backward(*weights)
        else:
            ctx.entries = None
            ctx.save_for_backward(x if ctx.regather else x_full, *weights)
        return ys

    @staticmethod
    def backward(ctx, *dys):
        spec, st = ctx.spec, STATE
        gather = None
        if ctx.entries is None:
            held, *weights = ctx.saved_tensors
            if ctx.regather and any(_wanted(ctx, 1 + i) for i in range(len(weights))):
                gather = Shard(held, spec).start()  # Megatron: the re-gather before the dgrad, waited before dW
        else:
            weights = ctx.saved_tensors
            for e, dy in zip(ctx.entries, dys):
                e[2] = dy
        fuse = ctx.entries is not None and st.fuse and st.mode != "off" and st.wgrad is not None
        todo = [e for e in ctx.entries if e[2] is not None] if fuse else []
        if todo and isinstance(todo[0][1], Shard):
            gather = todo[0][1].start()
        pieces = st.chunks if st.mode == "chunked" and not st.fuse and ctx.entries is not None else 1
        handles, finish = _dgrad_start(dys, weights, spec, pieces)
        if fuse:
            if gather is not None:
                x_full = gather.wait()
                for e in todo:
                    e[1] = x_full
                del x_full
            st.wgrad(todo)  # Megatron's fused BW: the weight-gradient GEMMs under the collective
            _STATS.fused += len(todo)
            for e in ctx.entries:
                e[1] = e[2] = None  # done: W skips it
        elif ctx.entries is not None and st.mode == "fill" and st.fill is not None:
            st.fill(lambda: all(h.done() for h in handles))
        for h in handles:
            h.wait()
        dx = finish()
        dws = [None] * len(weights)
        if ctx.entries is None:
            x_full = gather.wait() if gather is not None else held
            for i, (w, dy) in enumerate(zip(weights, dys)):
                if _wanted(ctx, 1 + i):
                    dws[i] = dy.reshape(-1, dy.shape[-1]).t().mm(x_full.reshape(-1, x_full.shape[-1])).to(w.dtype)
        return (dx, None, *dws)


def _wanted(ctx, edge: int) -> bool:
    """Does the engine run the gradient edge ``edge`` (B with ``inputs=`` prunes deferred weights)?"""
    if not ctx.needs_input_grad[edge + 1 if edge else 0]:
        return False
    try:
        node = ctx.next_functions[edge][0]
        return node is not None and torch._C._will_engine_execute_node(node)
    except (RuntimeError, AttributeError, IndexError):  # autograd.grad of leaves: cannot tell; compute it
        return True


def _dgrad_start(dys, weights, spec: ColumnSpec, pieces: int):
    """dx = sum_i dy_i W_i in ``pieces`` token pieces, each piece's collective started as soon as it is
    computed. Returns (handles, finish) where ``finish()`` gives dx (batch, seq[/t], in). Every mode runs the
    same per-token products (a piece is a block of rows of the same GEMMs), so the pieces change no bit."""
    if spec.sequence_parallel:
        return _dgrad_start_sp(dys, weights, spec, pieces)
    group, what = spec.group, f"all-reduce of {spec.what} input gradient"
    rows = [dy.reshape(-1, dy.shape[-1]) for dy in dys]       # (tokens, out_i): a view when dy is contiguous
    n = rows[0].shape[0]
    dx = rows[0].new_empty((n, weights[0].shape[1]))
    handles = []
    for blk in torch.arange(n).tensor_split(min(pieces, n)):
        lo, hi = int(blk[0]), int(blk[-1]) + 1
        out = dx[lo:hi]                                       # contiguous rows: all-reduced in place
        torch.mm(rows[0][lo:hi], weights[0], out=out)
        for r, w in zip(rows[1:], weights[1:]):
            out.addmm_(r[lo:hi], w)
        if pieces > 1:
            _STATS.pieces += 1
        handles.append(start("all_reduce", out, None, group, share=(hi - lo) / n, what=what))
    return handles, lambda: dx.view(*dys[0].shape[:-1], dx.shape[-1])


def _dgrad_start_sp(dys, weights, spec: ColumnSpec, pieces: int):
    """Sequence parallel: the pieces are token blocks of every rank's shard (seq-first), each reduce-scattered."""
    group = spec.group
    t = dist.get_world_size(group)
    dsf = [_seq_first(dy) for dy in dys]                      # (s, b, out_i)
    s = dsf[0].shape[0]
    if s % t:
        raise ValueError(f"sequence parallel: sequence length {s} is not a multiple of tp={t}")
    dsf = [d.view(t, s // t, *d.shape[1:]) for d in dsf]      # rank r's tokens: [r]
    n = dsf[0].shape[1]
    parts = [list(d.tensor_split(min(pieces, n), dim=1)) for d in dsf]
    outs, handles = [], []
    for c in range(len(parts[0])):
        dx = torch.matmul(parts[0][c], weights[0])
        for i in range(1, len(weights)):
            dx += torch.matmul(parts[i][c], weights[i])
        if pieces > 1:
            _STATS.pieces += 1
        out = dx.new_empty(dx.shape[1:])
        handles.append(start("reduce_scatter", out, dx.reshape(-1, *dx.shape[2:]), group, share=dx.shape[1] / n,
                             what=f"reduce-scatter of {spec.what} input gradient"))
        outs.append(out)

    def finish() -> torch.Tensor:
        full = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
        return full.transpose(0, 1).contiguous()

    return handles, finish


def column_parallel(x: torch.Tensor, modules: Sequence, group, *, sequence_parallel: bool = False,
                    what: str = "column-parallel") -> tuple[torch.Tensor, ...]:
    """``y_i = f(x) W_i^T`` for the column-parallel linears ``modules`` sharing input ``x`` (one input-gradient
    collective for all of them; with ``sequence_parallel`` ``x`` is this rank's sequence shard, all-gathered)."""
    spec = ColumnSpec(tuple(modules), group, bool(sequence_parallel), what)
    return _ColumnGroup.apply(x, spec, *(m.weight for m in modules))
