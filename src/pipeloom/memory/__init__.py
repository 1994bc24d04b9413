"""Memory estimation: analytic (no torch) and traced (torch, imported lazily).

:mod:`.train` is how the model is trained (:class:`TrainConfig`); :mod:`.layers` counts parameters, gradients, optimizer states and saved activations of a decoder-only
transformer; :mod:`.sharding` says what each ZeRO level shards over the data-parallel replicas (static bytes
and the transient of one unsharded chunk); :mod:`.budget` says what each device of a layout holds besides the schedule's activations
(:func:`device_budget`) and turns a size in bytes into a limit in units; :mod:`.analytic` turns a
schedule's memory trace into per-device peak bytes (:func:`estimate`); :mod:`.moe` what expert and context
parallelism, MLA, DeepSeek-V3's MTP module, light recompute and FP8 change in them (docs/moe.md); :mod:`.traced` measures the same
quantities on a real ``torch.nn.Module`` per chunk.
"""
from .analytic import (PRESETS, MemoryConfigError, MemoryReport, ModelConfig, TrainConfig, estimate,
                       mem_limit_units, parse_bytes, preset, total_params)
from .budget import DeviceBudget, device_budget, limit_units

__all__ = ["PRESETS", "DeviceBudget", "MemoryConfigError", "MemoryReport", "ModelConfig", "TrainConfig",
           "device_budget", "estimate", "limit_units", "mem_limit_units", "parse_bytes", "preset", "total_params"]
