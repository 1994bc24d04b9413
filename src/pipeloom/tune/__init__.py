"""``pipeloom tune``: search the parallel configuration of a training run (no torch).

* :mod:`.gpus`   -- GPU presets (peak BF16 FLOP/s, memory, HBM and link figures)
* :mod:`.costs`  -- the cost model: per-layer F/B/W seconds from FLOPs (an efficiency, or a curve of the GEMM
                    size), PP/DP collectives, optimizer, and the calibration file
* :mod:`.comm_terms` -- the TP/SP communication terms of a layer and what each overlap mode hides
* :mod:`.space`  -- the problem, one configuration, the caches they share (one device budget per layout),
                    the enumeration of the space
* :mod:`.bounds` -- every lower bound of a configuration: memory, step time, and the memory-aware step time
                    (warm-up, last forward, DP bucket)
* :mod:`.search` -- evaluation (plan, simulate, DP buckets, memory), simulation in bound order, ranking
* :mod:`.moe_costs` -- the expert-parallel all-to-all, routing permutation and expert load, ring attention
                    (context parallel) and FP8 terms of a layer, and what an F&B pair hides (docs/moe.md)
* :mod:`.measured` -- a calibration file from a measured run (``pipeloom run --calibrate``)
* :mod:`.launch` -- the chosen plan as files: schedule, Gantt, pipeloom/torchrun, torchtitan, Megatron-Core

The names below load on first use, so that building the command line (which lists the GPU presets) does not
import the search and the memory model.
"""
from __future__ import annotations

import importlib

_WHERE = {"Calibration": "costs", "CalibrationError": "costs", "Config": "space", "GPU": "gpus", "GPUS": "gpus",
          "GPUError": "gpus", "Link": "gpus", "Problem": "space", "TuneError": "space", "TuneResult": "search",
          "gpu_preset": "gpus", "tune": "search", "with_overrides": "gpus"}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
