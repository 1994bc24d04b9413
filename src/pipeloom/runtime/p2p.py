"""Point-to-point transport for one pipeline rank: isend/irecv posted early, in link order.

The order of ops on every link comes from :func:`pipeloom.runtime.commplan.build_comm_plan`.
NCCL (strict mode): on each link a cursor walks that order: receives are posted as soon as the cursor reaches them
(with a buffer of the negotiated shape, so data lands while this rank computes), a send is
posted as soon as its tensor exists and the cursor reaches it. All ops that become ready
together go out in one ``dist.batch_isend_irecv`` call (one NCCL group on GPU). gloo (relaxed
mode; the ops go one by one straight to the process group, in the same order): the two
directions of a link are independent, so each keeps its own order (the sender's job order) and
receives are posted up to ``recv_lookahead`` ahead per peer, regardless of this
rank's pending sends; a receive that a job needs is always posted at once. A rank only
blocks in :meth:`P2P.recv`, with a timeout, and the error names the job that waited, the
message and the peer rank.
"""
from __future__ import annotations

import datetime as _dt
import time

import torch
import torch.distributed as dist

from .commplan import Msg, Op


class PeerError(RuntimeError):
    """A peer died, hung past the timeout, or a transfer failed."""


_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32]


def _dtype_code(dt: torch.dtype) -> int:
    try:
        return _DTYPES.index(dt)
    except ValueError:
        raise TypeError(f"cannot send tensors of dtype {dt} between stages; use one of {_DTYPES}") from None


class P2P:
    """Link-ordered P2P for one rank.

    ``links``: peer pp-rank -> ordered ops (from the comm plan); ``global_rank``: pp-rank ->
    global rank; ``shape_of``: Msg -> (shape, dtype) of a message this rank receives.
    """

    def __init__(self, links: dict[int, tuple[Op, ...]], global_rank: list[int], me: int, *,
                 device: torch.device, timeout_s: float, group=None, strict: bool | None = None,
                 recv_lookahead: int = 4) -> None:
        self.links = links
        # strict: one op order per link, both directions (NCCL pairs P2P in issue order on one
        # stream per pair). Relaxed (gloo): each direction keeps its own order, so receives can
        # be posted ahead of this rank's own pending sends, up to ``recv_lookahead`` per peer.
        self.strict = (dist.get_backend(group) == "nccl") if strict is None else strict
        self.lookahead = max(1, int(recv_lookahead))
        self._sends_of = {p: tuple(op for op in seq if op.send) for p, seq in links.items()}
        self._recvs_of = {p: tuple(op for op in seq if not op.send) for p, seq in links.items()}
        self.global_rank = global_rank
        self.me = me
        self.device = device
        self.timeout = _dt.timedelta(seconds=float(timeout_s))
        self.timeout_s = float(timeout_s)
        # the one-time shape negotiation runs every chunk once (first calls are slow): be generous
        self.setup_timeout_s = max(self.timeout_s, 120.0)
        self.group = group
        # relaxed mode issues each op straight on the process group (one C++ call per op): the
        # Python layers of batch_isend_irecv/isend/irecv (P2POp objects, argument checks, group
        # look-ups) cost about as much as a small gloo call itself, on every job
        self._pg = group if group is not None else dist.distributed_c10d._get_default_group()
        self._peer_rank = [dist.get_group_rank(self._pg, g) for g in global_rank]
        self.shape_of = None
        self.reset()

    # ---------------------------------------------------------------- per step
    def reset(self) -> None:
        self.cursor = {p: 0 for p in self.links}
        self.scur = {p: 0 for p in self.links}
        self.rcur = {p: 0 for p in self.links}
        self.ready: dict[Msg, torch.Tensor] = {}
        self.posted: dict[Msg, tuple[object, torch.Tensor, int]] = {}
        self.sends: list[tuple[object, torch.Tensor, Msg, int]] = []
        self.wait_s = 0.0  # time spent blocked in recv this step

    def send(self, msg: Msg, tensor: torch.Tensor, *, post: bool = True) -> None:
        """Queue ``tensor`` for its peer; it goes out as soon as the link order allows (with
        ``post=False`` at the next :meth:`advance`, so several ops can share one batched call)."""
        self.ready[msg] = tensor
        if post:
            self.advance()

    def _recv_op(self, op: Op, ops: list, meta: list) -> None:
        shape, dtype = self.shape_of(op.msg)
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        ops.append((False, buf, op.peer))
        meta.append((op, buf))

    def _advance_relaxed(self, ops: list, meta: list, force: Msg | None) -> None:
        for peer in self.links:
            sends, c = self._sends_of[peer], self.scur[peer]
            while c < len(sends) and sends[c].msg in self.ready:
                t = self.ready.pop(sends[c].msg)
                ops.append((True, t, peer))
                meta.append((sends[c], t))
                c += 1
            self.scur[peer] = c
            recvs, c = self._recvs_of[peer], self.rcur[peer]
            waiting = sum(1 for m in self.posted.values() if m[2] == peer)
            forced = force is not None and any(op.msg == force for op in recvs[c:])
            while c < len(recvs) and (waiting < self.lookahead or forced):
                self._recv_op(recvs[c], ops, meta)
                waiting += 1
                c += 1
                if forced and recvs[c - 1].msg == force:
                    forced = False
            self.rcur[peer] = c

    def advance(self, force: Msg | None = None, where: object = None) -> None:
        """Post every op the cursors can reach now, in one batched call (``force``: post receives
        up to this message even beyond the lookahead; ``where``: what this rank is doing, for
        errors, e.g. the job just run; formatted only on failure)."""
        ops: list[tuple[bool, torch.Tensor, int]] = []  # (send?, tensor, peer pp rank)
        meta: list[tuple[Op, torch.Tensor]] = []
        if not self.strict:
            self._advance_relaxed(ops, meta, force)
            self._post(ops, meta, where)
            return
        for peer, seq in self.links.items():
            c = self.cursor[peer]
            while c < len(seq):
                op = seq[c]
                if op.send:
                    t = self.ready.pop(op.msg, None)
                    if t is None:
                        break  # its data does not exist yet; later ops on this link wait
                    ops.append((True, t, peer))
                    meta.append((op, t))
                else:
                    self._recv_op(op, ops, meta)
                c += 1
            self.cursor[peer] = c
        self._post(ops, meta, where)

    def _post(self, ops: list, meta: list, where: object = None) -> None:
        if not ops:
            return
        works = []
        try:
            if self.strict:  # NCCL: one coalesced group, in link order
                works = dist.batch_isend_irecv([dist.P2POp(dist.isend if send else dist.irecv, t, self.global_rank[peer],
                                                           self.group) for send, t, peer in ops])
            else:  # gloo: every op on its own, in the same order (tag 0, as isend/irecv use)
                pg, rk = self._pg, self._peer_rank
                for send, t, peer in ops:
                    works.append(pg.send([t], rk[peer], 0) if send else pg.recv([t], rk[peer], 0))
        except Exception as e:  # a peer that died closes the connection: posting fails at once
            op = meta[0 if self.strict else len(works)][0]
            text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise PeerError(f"rank {dist.get_rank()}: {where if where is not None else 'posting transfers'}: "
                            f"{'sending' if op.send else 'receiving'} {op.msg} {'to' if op.send else 'from'} "
                            f"rank {self.global_rank[op.peer]} (pp stage {op.peer}) failed ({text})") from None
        for i, (op, t) in enumerate(meta):
            w = works[i] if len(works) == len(ops) else works[-1]  # NCCL coalesces into one work
            if op.send:
                self.sends.append((w, t, op.msg, op.peer))
            else:
                self.posted[op.msg] = (w, t, op.peer)

    def recv(self, msg: Msg, waiter: str) -> torch.Tensor:
        """Block (at most the timeout) until ``msg`` has arrived; ``waiter`` names the job for errors."""
        if msg not in self.posted:
            self.advance(force=msg, where=f"job {waiter}")
        if msg not in self.posted:  # cannot happen for a valid plan (see commplan's proof)
            raise PeerError(f"rank {dist.get_rank()}: job {waiter} needs {msg}, which the link plan never posts")
        w, buf, peer = self.posted.pop(msg)
        t0 = time.perf_counter()
        self._wait(w, f"job {waiter} waited for {msg} from rank {self.global_rank[peer]} (pp stage {peer})")
        self.wait_s += time.perf_counter() - t0
        return buf

    def poll_sends(self) -> None:
        """Drop finished sends, oldest first, so their buffers can be freed. Stops at the first
        unfinished one (O(1) per call: gloo reports a P2P send complete only once waited on)."""
        i = 0
        while i < len(self.sends) and self.sends[i][0].is_completed():
            i += 1
        if i:
            del self.sends[:i]

    def finish(self, step: int) -> None:
        """Wait for every outstanding send of this step (with the timeout)."""
        self.advance(where=f"end of step {step}")
        for w, _t, msg, peer in self.sends:
            self._wait(w, f"step {step}: sending {msg} to rank {self.global_rank[peer]} (pp stage {peer}) "
                          "did not complete")
        self.sends = []
        if self.strict:
            left = [str(op.msg) for p, seq in self.links.items() for op in seq[self.cursor[p]:]]
        else:
            left = [str(op.msg) for p in self.links for op in self._sends_of[p][self.scur[p]:]]
            left += [str(op.msg) for p in self.links for op in self._recvs_of[p][self.rcur[p]:]]
        if left or self.posted or self.ready:
            raise PeerError(f"rank {dist.get_rank()}: step {step} ended with unmatched messages: "
                            f"{left[:3] or list(map(str, self.posted))[:3] or list(map(str, self.ready))[:3]}")

    def _wait(self, work, what: str, timeout_s: float | None = None) -> None:
        timeout = self.timeout if timeout_s is None else _dt.timedelta(seconds=timeout_s)
        shown = self.timeout_s if timeout_s is None else timeout_s
        try:
            ok = work.wait(timeout)
        except Exception as e:  # DistBackendError, RuntimeError from gloo
            text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            kind = f"timed out after {shown:g}s" if ("imeout" in text or "imed out" in text) else "failed"
            raise PeerError(f"rank {dist.get_rank()}: {what}: {kind} ({text})") from None
        if ok is False:
            raise PeerError(f"rank {dist.get_rank()}: {what}: timed out after {shown:g}s")

    # ---------------------------------------------------------------- shapes (once)
    def send_header(self, peer: int, shape: torch.Size, dtype: torch.dtype) -> None:
        h = torch.zeros(10, dtype=torch.int64, device=self.device)
        if len(shape) > 8:
            raise ValueError(f"stage outputs may have at most 8 dimensions, got shape {tuple(shape)}")
        h[0], h[1] = len(shape), _dtype_code(dtype)
        h[2:2 + len(shape)] = torch.tensor(list(shape), dtype=torch.int64)
        w = dist.isend(h, self.global_rank[peer], self.group)
        self._wait(w, f"shape negotiation: sending a header to pp stage {peer}", self.setup_timeout_s)

    def recv_header(self, peer: int, what: str) -> tuple[torch.Size, torch.dtype]:
        h = torch.zeros(10, dtype=torch.int64, device=self.device)
        w = dist.irecv(h, self.global_rank[peer], self.group)
        self._wait(w, f"shape negotiation: {what} waited for a header from rank {self.global_rank[peer]} "
                      f"(pp stage {peer})", self.setup_timeout_s)
        h = h.cpu().tolist()
        return torch.Size(h[2:2 + h[0]]), _DTYPES[h[1]]
