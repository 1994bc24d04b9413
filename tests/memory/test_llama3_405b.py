"""Llama 3 405B's published pre-training configuration fits in an 80 GB H100 per pipeloom's memory model.

Source: Dubey et al. 2024, "The Llama 3 Herd of Models" (arXiv 2407.21783), Table 4 (16,384 GPUs: TP 8, CP 1,
PP 16, DP 128, sequence 8,192, batch size per DP 16, 16M tokens per batch) and sec. 3.3.2 (an interleaved
schedule; one Transformer layer less on the first and on the last stage, so that the first model chunk holds only
the embedding and the last only the output projection and the loss; the input and output tensors of each stage
freed early; no activation checkpointing at 8K) and sec. 3.3.2's FSDP that shards the optimizer states and the
gradients but keeps the parameters after the forward (ZeRO-2 here).

Not in the paper, assumed: micro-batch 1 (16 sequences per DP rank on 16 stages: 16 microbatches), vpp 8 (the
first chunk holding only the embedding needs one layer slot per chunk: 126 layers + embedding + loss = 128
slots = 16 stages x 8 chunks), Megatron-style sequence parallelism with the tensor parallelism, flash attention.
"""
from __future__ import annotations

import math

from pipeloom.memory.analytic import TrainConfig, estimate
from pipeloom.partition.layout import ends_as_layers

GB = 10 ** 9
GiB = 1024 ** 3
H, FFN, V, KV_DIM, L = 16384, 53248, 128256, 8 * 128, 126   # Table 3: width, FFN, vocabulary, 8 KV heads of 128
TP, PP, VPP, DP, M = 8, 16, 8, 128, 16


def _published(zero: int = 2):
    train = TrainConfig(seq=8192, micro_batch=1, tp=TP, sequence_parallel=True, recompute="none", dp=DP, zero=zero)
    return estimate("llama3-405b", train, schedule="interleaved", pp=PP, vpp=VPP, microbatches=M,
                    layers_per_chunk=ends_as_layers(L, PP, VPP), gpu_bytes=80 * GB, reserve_bytes=2 * GiB)


def test_published_configuration_fits_80gb_with_2gib_reserve():
    rep = _published()
    assert rep.layers_per_chunk[0] == 0 and rep.layers_per_chunk[-1] == 0  # embedding-only, loss-only chunks
    assert rep.fits is True
    assert max(d.peak_bytes for d in rep.devices) + 2 * GiB <= 80 * GB


def test_static_bytes_per_device_by_hand():
    """Parameters, gradients and optimizer states per device against a hand count of Llama 3 405B's layer:
    Q and O projections h x h, K and V h x (8 x 128), SwiGLU 3 x h x ffn, split over tp 8; the two RMSNorm
    weights (2h) replicated; bf16 weights (2 bytes), fp32 gradients (4) and fp32 master + Adam m, v (12), the
    last two sharded over dp 128 (ZeRO-2)."""
    layer = (2 * H * H + 2 * H * KV_DIM + 3 * H * FFN) // TP + 2 * H
    assert layer == 398_491_648
    embedding, head = V * H // TP, V * H // TP + H  # vocab-parallel embedding; final norm + output head
    rep = _published()
    expected = {0: embedding + 7 * layer, PP - 1: head + 7 * layer}
    for d in rep.devices:
        p = expected.get(d.device, 8 * layer)
        assert d.params == p
        assert (d.params_bytes, d.grads_bytes, d.optimizer_bytes) == (2 * p, math.ceil(4 * p / DP),
                                                                      math.ceil(12 * p / DP))
    assert sum(d.params for d in rep.devices) * TP < 406e9  # 405.85B in all, each rank an eighth of the matrices


def test_without_gradient_sharding_it_does_not_fit():
    # ZeRO-1 keeps every fp32 gradient: 4 bytes x 3.19B parameters = 11.9 GiB more on a full device
    rep = _published(zero=1)
    assert rep.fits is False
    worst = max(rep.devices, key=lambda d: d.peak_bytes)
    assert worst.grads_bytes == 4 * worst.params
