"""pipeloom tune for Llama 3 405B's pre-training job (16,384 H100s of 80 GB, 16M tokens per step at 8K) picks the
published configuration or one it predicts at least as fast that also fits (sources and assumptions:
tests/memory/test_llama3_405b.py).

The search keeps the published tp 8, pp 16 and micro-batch 1 and searches the rest (vpp up to 8, schedules,
recompute, ZeRO-1/2, uniform or trimmed end stages); the whole space (every tp, pp, micro-batch size, all
schedules) gives the same pick in about 2.5 minutes (docs/tune.md). The published layout's time is predicted in
the same run, so the comparison holds whatever the time model predicts in absolute terms.
"""
from __future__ import annotations

import pytest

from pipeloom.core.ir import Placement
from pipeloom.models.presets import preset
from pipeloom.partition.layout import ends_as_layers
from pipeloom.tune import Problem, gpu_preset, tune, with_overrides
from pipeloom.tune.search import Config, _Space, evaluate

GB = 10 ** 9


@pytest.mark.slow  # 8-45 s on 2 busy cores: make test runs it, make test-fast does not
def test_tune_picks_the_published_layout_or_a_faster_fitting_one():
    gpu = with_overrides(gpu_preset("h100"), memory=80 * GB)
    prob = Problem(model=preset("llama3-405b"), gpus=16384, gpu=gpu, global_batch=2048, seq=8192, tp=8, pp=16,
                   microbatch_sizes=(1,), zero=(1, 2), partitions=("uniform", "ends"),
                   schedules=("1f1b", "interleaved", "zbvpp"), max_vpp=8, top=1)
    res = tune(prob, workers=1)
    published = evaluate(_Space(prob), Config(
        tp=8, pp=16, dp=128, vpp=8, microbatch_size=1, microbatches=16, schedule="interleaved", recompute="none",
        zero=2, partition="ends", mem_limit_mode="default", seg_layer_num=tuple(ends_as_layers(126, 16, 8)),
        placement=Placement.INTERLEAVED), refine=True)
    assert published.fits, published.error
    best = res.best
    assert best is not None and best.fits and best.peak_bytes + prob.reserve <= gpu.memory
    assert best.step_time_s <= published.step_time_s * (1 + 1e-9)
