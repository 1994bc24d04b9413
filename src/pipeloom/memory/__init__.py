"""Memory estimation: analytic (no torch) and traced (torch, imported lazily).

:mod:`.analytic` counts parameters, gradients, optimizer states and saved activations of a
decoder-only transformer and turns a schedule's memory trace into per-device peak bytes;
:mod:`.traced` measures the same quantities on a real ``torch.nn.Module`` per chunk.
"""
from .analytic import (PRESETS, MemoryConfigError, MemoryReport, ModelConfig, TrainConfig, estimate,
                       mem_limit_units, parse_bytes, preset, total_params)

__all__ = ["PRESETS", "MemoryConfigError", "MemoryReport", "ModelConfig", "TrainConfig", "estimate",
           "mem_limit_units", "parse_bytes", "preset", "total_params"]
