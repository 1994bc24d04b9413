"""Layers -> chunks -> devices (no torch).

A :class:`Partition` assigns the ``L`` transformer layers of a model to the ``pp * vpp`` global
chunks of a pipeline. Chunks hold *contiguous* layer ranges in global chunk order (the forward
goes chunk 0 -> 1 -> ... -> pp*vpp-1, so chunk k holds the layers right before chunk k+1's).
The embedding runs with chunk 0 and the head (final norm + vocabulary projection + loss) with
the last chunk; which device that is follows from the placement
(:func:`pipeloom.core.ir.device_of`).

Three ways to make one:

``uniform(L, pp, vpp)``
    ``seg_layer_num[j % num_chunks] += 1`` for every layer j: per-chunk counts differ by at most
    one and the ``L % num_chunks`` extra layers go to the *first* global chunks 0, 1, ...
    (with interleaved placement: local chunk 0 of devices 0, 1, ... first).

``from_layers_per_device(counts, pp, vpp)``
    the user gives the layer count of every device; each device's count is dealt round-robin
    over its chunks: its i-th layer goes to its local chunk ``i % vpp`` (interleaved: global
    chunk ``(i % vpp) * pp + s``; V: the device's chunks in increasing
    order). Every device needs at least ``vpp`` layers. Layer indices are
    then laid out contiguously in global chunk order. pp2 vpp2, 8 layers, 5/3 ->
    ``seg_layer_num = [3, 2, 2, 1]``: layers 0-2 in global chunk 0 (GPU0's local chunk 0), 3-4
    in chunk 1 (GPU1's local 0), 5-6 in chunk 2 (GPU0's local 1), 7 in chunk 3 (GPU1's local 1).

``from_counts(seg_layer_num, pp, vpp)``
    any per-chunk counts (each >= 1), e.g. from the cost balancer
    (:func:`pipeloom.partition.balance.balance`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..core.ir import Placement, chunks_of, device_of


class PartitionError(ValueError):
    """A partition cannot be made from this input (the message says what to change)."""


def _check_shape(pp: int, vpp: int) -> None:
    for name, v in (("pp", pp), ("vpp", vpp)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise PartitionError(f"{name} must be an integer >= 1, got {v!r}")


@dataclass(frozen=True, slots=True)
class Partition:
    """Per global chunk the tuple of layer indices it holds (contiguous, in chunk order).

    ``embedding`` / ``head``: whether the model has them; when true they run with the first /
    last global chunk and their cost is added there (see :mod:`.layer_costs`).
    """

    pp: int
    vpp: int
    placement: Placement
    chunks: tuple[tuple[int, ...], ...]
    embedding: bool = True
    head: bool = True

    def __post_init__(self) -> None:
        _check_shape(self.pp, self.vpp)
        object.__setattr__(self, "placement", Placement(self.placement))
        object.__setattr__(self, "chunks", tuple(tuple(int(x) for x in c) for c in self.chunks))
        nc = self.pp * self.vpp
        if len(self.chunks) != nc:
            raise PartitionError(f"partition lists {len(self.chunks)} chunks but pp*vpp = {nc}")
        expect = 0
        for k, c in enumerate(self.chunks):
            if not c:
                raise PartitionError(f"chunk {k} holds no layer; every chunk needs at least one")
            if list(c) != list(range(expect, expect + len(c))):
                raise PartitionError(
                    f"chunk {k} holds layers {list(c)}; chunks must hold contiguous layers in chunk order "
                    f"starting at layer {expect}")
            expect += len(c)

    # ------------------------------------------------------------------ views
    @property
    def num_chunks(self) -> int:
        return self.pp * self.vpp

    @property
    def num_layers(self) -> int:
        return sum(len(c) for c in self.chunks)

    @property
    def seg_layer_num(self) -> list[int]:
        """Layer count per global chunk (the name Megatron-style pipeline code uses)."""
        return [len(c) for c in self.chunks]

    def bounds(self) -> list[tuple[int, int]]:
        """Per global chunk the half-open layer range ``(start, end)``."""
        return [(c[0], c[-1] + 1) for c in self.chunks]

    def device_of(self, chunk: int) -> int:
        return device_of(chunk, self.pp, self.placement)

    def chunks_of(self, device: int) -> list[int]:
        """Global chunks on ``device`` in its local chunk order."""
        return chunks_of(device, self.pp, self.vpp, self.placement)

    def devices(self) -> list[list[list[int]]]:
        """Per device, per local chunk, the layer indices (the CLI's JSON ``devices``)."""
        return [[list(self.chunks[c]) for c in self.chunks_of(d)] for d in range(self.pp)]

    def layers_per_device(self) -> list[int]:
        return [sum(len(self.chunks[c]) for c in self.chunks_of(d)) for d in range(self.pp)]

    def chunk_of_layer(self, layer: int) -> int:
        for k, (s, e) in enumerate(self.bounds()):
            if s <= layer < e:
                return k
        raise PartitionError(f"layer {layer} is not in 0..{self.num_layers - 1}")

    def to_dict(self) -> dict:
        nc = self.num_chunks
        return {
            "pp": self.pp,
            "vpp": self.vpp,
            "placement": self.placement.value,
            "layers": self.num_layers,
            "seg_layer_num": self.seg_layer_num,
            "chunks": [list(c) for c in self.chunks],
            "devices": self.devices(),
            "layers_per_device": self.layers_per_device(),
            "embedding": {"chunk": 0, "device": self.device_of(0)} if self.embedding else None,
            "head": {"chunk": nc - 1, "device": self.device_of(nc - 1)} if self.head else None,
        }

    def describe(self) -> str:
        """One line per device: ``d0: c0[0-2] c2[5-6]``."""
        lines = []
        for d in range(self.pp):
            parts = []
            for c in self.chunks_of(d):
                s, e = self.bounds()[c]
                tag = f"{s}" if e - s == 1 else f"{s}-{e - 1}"
                extra = ("+emb" if c == 0 and self.embedding else "") + \
                        ("+head" if c == self.num_chunks - 1 and self.head else "")
                parts.append(f"c{c}[{tag}]{extra}")
            lines.append(f"d{d}: " + " ".join(parts))
        return "\n".join(lines)


# ---------------------------------------------------------------------- constructors
def from_counts(seg_layer_num: Sequence[int], pp: int, vpp: int = 1,
                placement: Placement | str = Placement.INTERLEAVED, *, embedding: bool = True,
                head: bool = True) -> Partition:
    """Partition with the given layer count per global chunk (contiguous ranges in chunk order)."""
    _check_shape(pp, vpp)
    nc = pp * vpp
    counts = list(seg_layer_num)
    if len(counts) != nc:
        raise PartitionError(f"got {len(counts)} per-chunk layer counts but pp*vpp = {nc}; give one per chunk")
    for k, n in enumerate(counts):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise PartitionError(f"chunk {k} gets {n!r} layers; every chunk needs an integer >= 1")
    chunks, start = [], 0
    for n in counts:
        chunks.append(tuple(range(start, start + n)))
        start += n
    return Partition(pp, vpp, Placement(placement), tuple(chunks), embedding, head)


def uniform(num_layers: int, pp: int, vpp: int = 1, placement: Placement | str = Placement.INTERLEAVED, *,
            embedding: bool = True, head: bool = True) -> Partition:
    """``seg_layer_num[j % num_chunks] += 1``: counts differ by <= 1, extras on the first chunks."""
    _check_shape(pp, vpp)
    nc = pp * vpp
    _check_layers(num_layers, nc, pp, vpp)
    seg = [0] * nc
    for j in range(num_layers):
        seg[j % nc] += 1
    return from_counts(seg, pp, vpp, placement, embedding=embedding, head=head)


def from_layers_per_device(counts: Sequence[int], pp: int, vpp: int = 1,
                           placement: Placement | str = Placement.INTERLEAVED, *, num_layers: int | None = None,
                           embedding: bool = True, head: bool = True) -> Partition:
    """User-given layers per device, dealt round-robin over each device's chunks."""
    _check_shape(pp, vpp)
    counts = list(counts)
    if len(counts) != pp:
        raise PartitionError(f"--layers-per-device lists {len(counts)} devices but pp={pp}; give one count "
                             f"per device")
    for d, n in enumerate(counts):
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise PartitionError(f"device {d} gets {n!r} layers; counts must be integers >= {vpp}")
    total = sum(counts)
    if num_layers is not None and total != num_layers:
        raise PartitionError(f"--layers-per-device sums to {total} but --layers is {num_layers}; "
                             f"make the counts sum to {num_layers}")
    short = [d for d, n in enumerate(counts) if n < vpp]
    if short:
        d = short[0]
        raise PartitionError(f"device {d} gets {counts[d]} layer(s) but has vpp={vpp} chunks; every device needs "
                             f">= vpp layers (one per chunk)")
    nc = pp * vpp
    seg = [0] * nc
    for s in range(pp):
        mine = chunks_of(s, pp, vpp, placement)  # interleaved: (v * pp + s for v in range(vpp))
        for i in range(counts[s]):
            seg[mine[i % vpp]] += 1
    return from_counts(seg, pp, vpp, placement, embedding=embedding, head=head)


# ---------------------------------------------------------------------- uneven end stages
# Per-chunk counts that may hold 0 layers (a chunk with only the embedding or only the loss head): the
# analytic memory model and the tuner take them; a :class:`Partition` (what the runtime builds) does not.
def ends_as_layers(num_layers: int, pp: int, vpp: int = 1, *, embedding: int = 1, loss: int = 1) -> list[int]:
    """Layers per global chunk when the embedding and the loss head each take the place of ``embedding`` /
    ``loss`` layers in the split (Megatron-LM's ``--account-for-embedding-in-pipeline-split`` and
    ``--account-for-loss-in-pipeline-split``): ``num_layers + embedding + loss`` slots split evenly, the extra
    slots on chunks 1, 2, ... (not on chunk 0, which holds the embedding), then chunk 0 gives up ``embedding``
    and the last chunk ``loss`` of them.

    Llama 3 405B (Dubey et al. 2024, "The Llama 3 Herd of Models", sec. 3.3.2): 126 layers on pp 16, one layer
    less on the first and the last stage; with vpp 8 the first chunk holds only the embedding and the last only
    the output projection and the loss (``[0, 1, ..., 1, 0]``)."""
    _check_shape(pp, vpp)
    nc = pp * vpp
    for name, v in (("embedding", embedding), ("loss", loss)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise PartitionError(f"{name} must count as an integer >= 0 layers, got {v!r}")
    slots = num_layers + embedding + loss
    seg = [slots // nc + (1 if 0 < k <= slots % nc else 0) for k in range(nc)]  # no extra beside the embedding
    seg[0] -= embedding
    seg[-1] -= loss
    bad = [k for k, n in enumerate(seg) if n < 0 or (n == 0 and 0 < k < nc - 1)]
    if bad or nc == 1 and seg[0] < 0:
        raise PartitionError(f"{num_layers} layers with the embedding and the loss counted as {embedding} and {loss} "
                             f"layer(s) leave chunk {bad[0] if bad else 0} of pp*vpp = {nc} without a layer; use "
                             f"fewer chunks")
    return seg


def end_stage_counts(num_layers: int, pp: int, vpp: int = 1, *, first: int | None = None,
                     last: int | None = None) -> list[int]:
    """Layers per global chunk (interleaved placement) when the first and/or the last pipeline stage hold
    ``first`` / ``last`` layers and the other stages share the rest evenly, extras on the earlier ones
    (Megatron-LM's ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``).
    A stage's layers are dealt over its ``vpp`` chunks evenly; on the first stage the fewest go to its first
    chunk, on the last stage to its last chunk (so ``first < vpp`` leaves chunk 0 with only the embedding)."""
    _check_shape(pp, vpp)
    for name, v in (("first", first), ("last", last)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise PartitionError(f"--{name}-stage-layers must be an integer >= 0, got {v!r}")
    fixed = {0: first} if first is not None else {}
    if last is not None:
        if pp == 1 and first is not None:
            raise PartitionError("with pp 1 the first stage is the last: give --first-stage-layers or "
                                 "--last-stage-layers, not both")
        fixed[pp - 1] = last
    rest = [s for s in range(pp) if s not in fixed]
    left = num_layers - sum(fixed.values())
    if left < 0 or (rest and left < len(rest) * vpp) or (not rest and left != 0):
        need = f"at least {len(rest) * vpp} layers for the other {len(rest)} stage(s) x vpp {vpp}" if rest else \
            f"the stages to sum to {num_layers}"
        raise PartitionError(f"first/last stage layers {first}/{last} of {num_layers} layers leave {left}; need {need}")
    per = dict(fixed)
    for i, s in enumerate(rest):
        per[s] = left // len(rest) + (1 if i < left % len(rest) else 0)
    seg = [0] * (pp * vpp)
    for s in range(pp):
        n = per[s]
        local = [n // vpp + (1 if v < n % vpp else 0) for v in range(vpp)]  # extras on the earlier chunks
        if s == 0:
            local.reverse()  # the first stage's fewest on its first chunk (the embedding's)
        for v in range(vpp):
            seg[v * pp + s] = local[v]
    empty = [k for k, n in enumerate(seg) if n == 0 and 0 < k < len(seg) - 1]
    if empty:
        raise PartitionError(f"first/last stage layers {first}/{last} with vpp {vpp} leave chunk {empty[0]} without a "
                             f"layer; only the first chunk (embedding) and the last (loss) may hold none")
    return seg


def _check_layers(num_layers: int, nc: int, pp: int, vpp: int) -> None:
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1:
        raise PartitionError(f"--layers must be an integer >= 1, got {num_layers!r}")
    if num_layers < nc:
        raise PartitionError(f"{num_layers} layers cannot fill pp*vpp = {pp}*{vpp} = {nc} chunks (each needs "
                             f">= 1 layer); use --layers >= {nc} or fewer devices/chunks")


def parse_counts(text: str) -> list[int]:
    """Parse ``7,8,8,9`` (the --layers-per-device form)."""
    out = []
    for part in str(text).replace(" ", "").split(","):
        if part == "":
            raise PartitionError(f"--layers-per-device {text!r}: empty item; write counts like 7,8,8,9")
        try:
            out.append(int(part))
        except ValueError:
            raise PartitionError(f"--layers-per-device {text!r}: {part!r} is not an integer; write counts like "
                                 f"7,8,8,9") from None
    return out
