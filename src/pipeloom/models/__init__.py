"""Small pure-torch example models for the runtime, the memory tracer and the benchmarks.

Importing this package imports torch; the pipeloom core never imports it.
"""
from .llama import (
    LlamaChunk,
    LlamaConfig,
    build_chunk_modules,
    build_reference,
    even_layer_split,
    loss_fn,
    synthetic_batch,
)

__all__ = [
    "LlamaChunk",
    "LlamaConfig",
    "build_chunk_modules",
    "build_reference",
    "even_layer_split",
    "loss_fn",
    "synthetic_batch",
]
