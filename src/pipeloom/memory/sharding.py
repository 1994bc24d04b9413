"""Sharded data parallelism (ZeRO-1/2/3, FSDP) in the memory model: what each level shards over the
data-parallel replicas, the static bytes per device that follow and the transient they cost (no torch).

The table of bytes per parameter is in :mod:`pipeloom.memory.layers`' docstring. The time of the collectives
(reduce-scatter of gradients, all-gather of parameters) is the time model's (:mod:`pipeloom.tune.costs`);
:func:`collectives` lists the ones a chunk runs per step under a level (what the memory accounting implies),
:func:`sharded` what is sharded.
"""
from __future__ import annotations

import math

#: what each ZeRO level shards over the data-parallel replicas (Rajbhandari et al. 2020, sec. 5)
ZERO_LEVELS = {0: "nothing (every replica holds parameters, gradients and optimizer states)",
               1: "the optimizer states (fp32 master weights, Adam m and v)",
               2: "the optimizer states and the gradients",
               3: "the optimizer states, the gradients and the parameters (FSDP)"}


def zero_help() -> str:
    """One line naming what each ZeRO level shards (for errors and --help)."""
    return "; ".join(f"{z} = {what}" for z, what in ZERO_LEVELS.items())


def sharded(train) -> frozenset[str]:
    """What ``train`` shards over its dp replicas: a subset of {'optimizer', 'grads', 'params'} (empty with
    dp = 1: one replica shards nothing). The time model reads this to charge the collectives it implies."""
    if train.dp == 1:
        return frozenset()
    return frozenset(("optimizer", "grads", "params")[:train.zero])


def static_bytes(params: int, train) -> tuple[int, int, int]:
    """(params, grads, optimizer) bytes for ``params`` parameters (the table in :mod:`pipeloom.memory.layers`)."""
    sh = sharded(train)
    d = train.dp

    def part(nbytes: int, what: str) -> int:
        return math.ceil(nbytes * params / d) if what in sh else nbytes * params

    master = 4 if train.dtype == "fp32" else 2
    if train.dtype == "fp16" and "grads" not in sh:
        grads = 2 * params + part(4, "optimizer")  # fp16 grads + fp32 master grads (sharded from ZeRO-1 on)
    else:
        grads = part({"fp32": 4, "bf16": 4, "fp16": 6}[train.dtype], "grads")
    opt = part(8 if train.dtype == "fp32" else 12, "optimizer")
    return part(master, "params"), grads, opt


def shard_transient_bytes(train, chunk_params: int) -> float:
    """Working memory of sharded data parallelism while one chunk of ``chunk_params`` parameters runs (bytes).

    * gradients sharded (ZeRO-2/3): the chunk's unsharded gradients exist from its backward until their
      reduce-scatter (fp32 main grads in bf16, as the static table counts them);
    * parameters sharded (ZeRO-3/FSDP): the chunk's parameters, all-gathered for its F and again for its
      B and W, in the parameter dtype.

    One chunk at a time (no prefetch of the next one, no per-layer wrapping: FSDP wrapping every layer holds
    one layer plus the prefetched next one, less than a chunk of many layers)."""
    sh = sharded(train)
    out = 0.0
    if "grads" in sh:
        out += {"fp32": 4, "bf16": 4, "fp16": 6}[train.dtype] * chunk_params
    if "params" in sh:
        out += train.elem * chunk_params
    return out


def collectives(train, chunk_params: int, microbatches: int) -> list[tuple[str, str, float, int]]:
    """The data-parallel collectives one chunk of ``chunk_params`` parameters runs per step under ``train``'s
    sharding, as ``(kind, what, bytes, count)``: ``count`` times a collective of ``kind`` ('all-reduce',
    'reduce-scatter', 'all-gather') over ``bytes`` (the unsharded size; the time model turns it into seconds
    with its ring formulas). This is what the memory accounting above implies:

    * ZeRO-0: the fp32 gradients all-reduced once per step;
    * ZeRO-1: the gradients reduce-scattered once, the updated bf16 parameters all-gathered once;
    * ZeRO-2: no whole gradient buffer is kept across microbatches, so the gradients are reduce-scattered after
      every microbatch's backward of the chunk (``microbatches`` times); parameters all-gathered once;
    * ZeRO-3: also the parameters gathered for every microbatch's forward and again for its backward
      (``2 * microbatches`` all-gathers, the gathered copy freed in between).

    With dp = 1 there is nothing to run: an empty list."""
    if train.dp == 1:
        return []
    grads = {"fp32": 4, "bf16": 4, "fp16": 6}[train.dtype] * chunk_params
    params = train.elem * chunk_params
    if train.zero == 0:
        return [("all-reduce", "grads", grads, 1)]
    if train.zero == 1:
        return [("reduce-scatter", "grads", grads, 1), ("all-gather", "params", params, 1)]
    if train.zero == 2:
        return [("reduce-scatter", "grads", grads, microbatches), ("all-gather", "params", params, 1)]
    return [("reduce-scatter", "grads", grads, microbatches), ("all-gather", "params", params, 2 * microbatches)]
