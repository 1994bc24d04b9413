"""Job timing of the executor (needs torch): wall-clock or CUDA-event start/end of each job's compute,
the lazily formatted ``step S, after job X`` of P2P errors, and a step's statistics."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..core.ir import Job

__all__ = ["StepStats"]


class _Timer:
    """Wall-clock start/end of a job's compute; CUDA events on GPU, resolved at step end."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.pending: list = []

    def start(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.time()

    def stop(self, started, record: Callable[[float, float], None]) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.pending.append((started, ev, record))
        else:
            record(started, time.time())

    def resolve(self) -> None:
        if not self.pending:
            return
        torch.cuda.synchronize()
        ref = torch.cuda.Event(enable_timing=True)
        ref.record()
        ref.synchronize()
        t_ref = time.time()
        for s, e, record in self.pending:
            record(t_ref - s.elapsed_time(ref) / 1e3, t_ref - e.elapsed_time(ref) / 1e3)
        self.pending = []


class _After:
    """``step S, after job X`` for P2P errors, formatted only if one happens (no string per job)."""

    __slots__ = ("step", "job")

    def __init__(self, step: int, job: Job) -> None:
        self.step, self.job = step, job

    def __str__(self) -> str:
        return f"step {self.step}, after job {self.job}"


@dataclass(slots=True)
class StepStats:
    step: int
    loss: float
    losses: list[float]
    time_s: float
    wait_s: float
    compute_s: float
