"""A pipeloom plan as Megatron-LM / Megatron-Core command-line arguments (no torch).

Megatron runs two pipeline orders of its own: 1F1B (one stage per rank) and interleaved 1F1B (virtual stages,
looped placement: virtual stage ``v`` of rank ``r`` is global chunk ``v * pp + r``). It has no zero-bubble
(B/W split), V-shape or DualPipe order, and no V placement: :data:`MEGATRON_ORDERS` names the pipeloom builders
whose order Megatron runs; for the others the arguments give the plan's shape (pp, virtual stages, the layer
split per chunk), run in Megatron's interleaved 1F1B order, and :func:`megatron_args` says so in its notes.

The layer split is written in the first of these forms that gives exactly the plan's layers per chunk, as
Megatron-Core computes them (``transformer_block.get_num_layers_to_build``):

1. nothing (an even split);
2. ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split`` (the embedding /
   the loss counted as one layer of the first / last virtual stage);
3. ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` (the first / last rank's
   layers, spread evenly over its virtual stages; the middle ranks even);
4. ``--pipeline-model-parallel-layout`` (any split; it implies the virtual stages).

and the virtual stages as ``--num-virtual-stages-per-pipeline-rank`` unless a layout is written (Megatron-LM
accepts at most one of the two: ``megatron/training/arguments.py``, ``validate_args``). Megatron-LM refuses
virtual stages at pp <= 2 unless ``--overlap-p2p-comm`` is given (same place): it is added at pp 2. At pp 1
there is no pipeline: no virtual stages are written.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..core.ir import Placement, device_of
from ..partition.megatron import counts_to_layout

#: pipeloom builders whose order Megatron-Core runs itself: 1F1B (vpp 1) and interleaved 1F1B (vpp > 1)
MEGATRON_ORDERS = ("1f1b", "interleaved")


@dataclass(frozen=True)
class MegatronArgs:
    """Arguments for Megatron-LM's ``pretrain_gpt.py`` and what they do differently from the plan."""

    args: list[str]
    split: list[int]
    """decoder layers per global chunk (Megatron's interleaved order) that the arguments give"""
    vpp: int
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        return " \\\n  ".join(self.args) + "\n"


def megatron_counts(num_layers: int, pp: int, vpp: int, *, first: int | None = None, last: int | None = None,
                    embedding: bool = False, loss: bool = False) -> list[int] | None:
    """Decoder layers per global chunk Megatron-Core builds for these arguments (its
    ``get_num_layers_to_build`` and ``TransformerConfig`` checks, restated), or ``None`` where it refuses them."""
    if (first is not None or last is not None) and (embedding or loss):
        return None
    per_rank = [0] * pp
    if first is not None or last is not None:
        rest, stages = num_layers, pp
        if first is not None:
            rest, stages = rest - first, stages - 1
        if last is not None:
            rest, stages = rest - last, stages - 1
        if (first is not None and first <= 0) or (last is not None and last <= 0) or bool(rest) != bool(stages):
            return None
        if stages and (rest < 0 or rest % stages):
            return None
        mid = rest // stages if stages else 0
        per_rank = [mid] * pp
        if first is not None:
            per_rank[0] = first
        if last is not None:
            per_rank[-1] = last
    else:
        n = num_layers + int(embedding) + int(loss)
        if n % pp:
            return None
        per_rank = [n // pp] * pp
    if any(r % vpp for r in per_rank):
        return None
    counts = [per_rank[c % pp] // vpp for c in range(pp * vpp)]
    if embedding:
        counts[0] -= 1
    if loss:
        counts[-1] -= 1
    if min(counts) < 0:
        return None
    return counts


def split_args(counts: Sequence[int], pp: int) -> tuple[list[str], int]:
    """(the split's Megatron arguments, vpp) for decoder layers per global chunk in interleaved order; the
    virtual stages are included (``--num-virtual-stages-per-pipeline-rank`` or a layout, never both)."""
    counts = [int(c) for c in counts]
    if pp < 1 or len(counts) % pp:
        raise ValueError(f"{len(counts)} chunks do not fill pp={pp} ranks evenly")
    vpp = len(counts) // pp
    L = sum(counts)
    vstages = [f"--num-virtual-stages-per-pipeline-rank {vpp}"] if vpp > 1 else []
    if megatron_counts(L, pp, vpp) == counts:
        return vstages, vpp
    for emb, loss in ((True, True), (True, False), (False, True)):
        if megatron_counts(L, pp, vpp, embedding=emb, loss=loss) == counts:
            return vstages + (["--account-for-embedding-in-pipeline-split"] if emb else []) + \
                (["--account-for-loss-in-pipeline-split"] if loss else []), vpp
    ranks = [sum(counts[c] for c in range(r, len(counts), pp)) for r in range(pp)]
    for f, l in ((ranks[0], ranks[-1]), (ranks[0], None), (None, ranks[-1])):
        if pp > 1 and megatron_counts(L, pp, vpp, first=f, last=l) == counts:
            return vstages + ([f"--decoder-first-pipeline-num-layers {f}"] if f is not None else []) + \
                ([f"--decoder-last-pipeline-num-layers {l}"] if l is not None else []), vpp
    return [f"--pipeline-model-parallel-layout \"{counts_to_layout(counts)}\""], vpp


def megatron_args(*, pp: int, vpp: int, placement: Placement, seg_layer_num: Sequence[int], schedule: str,
                  tp: int = 1, microbatch_size: int = 1, microbatches: int, global_batch: int | None = None,
                  seq: int | None = None, recompute: str = "none", zero: int = 0,
                  num_layers_flag: bool = True, ep: int = 1, cp: int = 1, fp8: bool = False) -> MegatronArgs:
    """Megatron-LM arguments for a plan (see the module docstring)."""
    counts = [int(c) for c in seg_layer_num]
    notes: list[str] = []
    if len(counts) != pp * vpp:
        raise ValueError(f"the split has {len(counts)} chunks; pp*vpp = {pp * vpp}")
    if pp == 1 and vpp > 1:
        notes.append(f"pp 1: no pipeline in Megatron, so no virtual stages (the plan's {vpp} chunks run as one)")
        counts, vpp = [sum(counts)], 1
    if vpp > 1 and placement is Placement.V:
        # Megatron places virtual stage v of rank r at chunk v*pp + r; a V plan's chunk 2pp-1-r sits on rank r
        ranks_v = [sum(counts[c] for c in range(len(counts)) if device_of(c, pp, Placement.V) == r) for r in range(pp)]
        ranks_i = [sum(counts[c] for c in range(r, len(counts), pp)) for r in range(pp)]
        notes.append(f"Megatron has no V placement: the plan's {vpp} chunks per rank and its layers per chunk are "
                     f"kept in Megatron's looped placement (layers per rank {ranks_i}; the plan's V placement: "
                     f"{ranks_v})")
    if schedule not in MEGATRON_ORDERS:
        notes.append(f"Megatron has no {schedule} order: these arguments run the plan's shape in Megatron's "
                     f"{'interleaved 1F1B' if vpp > 1 else '1F1B'} order (pipeloom orders Megatron runs: "
                     f"{', '.join(MEGATRON_ORDERS)})")
    args = [f"--tensor-model-parallel-size {tp}", f"--pipeline-model-parallel-size {pp}"]
    if num_layers_flag:
        args.append(f"--num-layers {sum(counts)}")
    args += [f"--micro-batch-size {microbatch_size}"]
    if global_batch is not None:
        args.append(f"--global-batch-size {global_batch}")
    if seq is not None:
        args.append(f"--seq-length {seq}")
    if tp > 1:
        args.append("--sequence-parallel")
    split, vpp_out = split_args(counts, pp)
    args += split
    if vpp_out > 1:
        if pp <= 2:
            args.append("--overlap-p2p-comm")  # Megatron-LM: virtual stages at pp <= 2 need it
        group = pp
        if microbatches % pp:
            if microbatches >= pp:
                group = microbatches
                args.append(f"--microbatch-group-size-per-virtual-pipeline-stage {group}")
                notes.append(f"m={microbatches} is not a multiple of pp={pp}: one microbatch group of {group} "
                             f"(Megatron-Core refuses a last group smaller than pp)")
            else:
                notes.append(f"m={microbatches} < pp={pp}: Megatron-Core's interleaved schedule needs at least pp "
                             f"microbatches per step")
    if recompute == "selective":
        args.append("--recompute-granularity selective")
    elif recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    if zero:
        args.append("--use-distributed-optimizer")
    if zero >= 2:
        notes.append(f"the plan shards {'gradients and parameters' if zero == 3 else 'gradients'} too (ZeRO-{zero}); "
                     f"--use-distributed-optimizer shards the optimizer states only: more memory than planned")
    args += ["--overlap-grad-reduce", "--bf16"]
    if ep > 1:  # expert parallel (docs/moe.md); pairs that hide its all-to-all: Megatron-Core 0.14's EP A2A overlap
        args += [f"--expert-model-parallel-size {ep}", "--moe-token-dispatcher-type alltoall", "--moe-grouped-gemm"]
        if schedule == "dualpipev" and recompute != "full" and (pp == 1 or vpp_out > 1):
            args += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
            notes.append("the plan pairs F and B to hide the all-to-all: Megatron-Core's --overlap-moe-expert-"
                         "parallel-comm (its combined 1F1B) does that inside its interleaved order")
        elif schedule == "dualpipev":  # Megatron-Core refuses its EP overlap with full recompute or without vpp
            notes.append("the plan pairs F and B to hide the all-to-all; Megatron-Core's EP overlap needs virtual "
                         "stages and no full recompute, so these arguments leave it off")
    if cp > 1:
        args.append(f"--context-parallel-size {cp}")
    if fp8:
        args.append("--fp8-format hybrid")
    return MegatronArgs(args, counts, vpp_out, notes)


def parse_args(args: Sequence[str]) -> dict:
    """``{flag: value}`` of written arguments (a flag alone maps to ``True``; quotes stripped)."""
    out: dict = {}
    for a in args:
        flag, _, value = a.partition(" ")
        out[flag] = value.strip().strip('"') if value else True
    return out


__all__ = ["MEGATRON_ORDERS", "MegatronArgs", "megatron_args", "megatron_counts", "parse_args", "split_args"]
