"""pipeloom's job kinds in torch.distributed.pipelining's action vocabulary: THE one map (no torch).

torch names a compute action ``<stage><letter><microbatch>`` (``1F3``) with these letters::

    pipeloom  F  forward                         torch  F  FORWARD
              B  input-gradient backward                I  BACKWARD_INPUT
              W  weight-gradient backward               W  BACKWARD_WEIGHT
              BW both backwards fused                   B  FULL_BACKWARD

Mind the B: pipeloom's B is torch's I, torch's B is pipeloom's BW. Every reader and writer of torch's
actions (the schedule CSV, the torch integration and its calibration from profiler traces, the run-log
importer of torch traces, the benches) takes its letters from here.
"""
from __future__ import annotations

from .ir import Kind

#: pipeloom kind -> torch action letter
TORCH_LETTER: dict[Kind, str] = {Kind.F: "F", Kind.B: "I", Kind.W: "W", Kind.BW: "B"}
#: torch action letter -> pipeloom kind
KIND_OF_LETTER: dict[str, Kind] = {v: k for k, v in TORCH_LETTER.items()}

__all__ = ["KIND_OF_LETTER", "TORCH_LETTER"]
