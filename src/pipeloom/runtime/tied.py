"""Tied parameters across pipeline stages: sum their gradients over the stages that hold a copy.

A weight used by two chunks (the token embedding of chunk 0 and the LM head of the last chunk of a
model with ``tie_word_embeddings``) is ONE parameter of the unsplit model: its gradient is the sum of
both uses. When the two chunks run on different pipeline stages, each stage holds its own copy and
the executor accumulates only its own use. :class:`TiedGrads` makes the copies agree, as Megatron does
with its embedding group: for every tie and every data-parallel replica, a process group of the
global ranks holding a copy; :meth:`TiedGrads.reduce` all-reduces (sums) the copies' gradients over
it. Called once per step after the executor's step (after the data-parallel reduction, which is
linear, so the order does not matter) and before the optimizer step: the copies then get the same
gradient, start from the same values and so stay identical after every step
(:meth:`TiedGrads.max_weight_diff` checks it).

Chunks on the same stage that share a parameter need nothing: the executor holds it once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class Tie:
    """One parameter held by several chunks: ``(global chunk, parameter name in that chunk)`` each."""

    members: tuple[tuple[int, str], ...]

    @property
    def chunks(self) -> tuple[int, ...]:
        return tuple(k for k, _ in self.members)


class TiedGrads:
    """The tie groups of one run, made on every rank (``dist.new_group`` is collective: all ranks must
    construct this with the same ties, schedule and rank grid, in the same order).

    Args:
        ties: the model's tied parameters (e.g. :func:`pipeloom.integrations.hf.tied_parameters`).
        device_of: global chunk -> pipeline stage (``Schedule.device_of``).
        grid: ``grid[r][s]`` = global rank of pipeline stage ``s`` in data-parallel replica ``r``.
        modules: this rank's chunk modules (global chunk id -> module).
        pp_rank, dp_rank: this rank's stage and replica.
    """

    def __init__(self, ties: Sequence[Tie], device_of: Callable[[int], int], grid: Sequence[Sequence[int]],
                 modules: dict[int, nn.Module], *, pp_rank: int, dp_rank: int) -> None:
        self.groups: list[tuple[object, nn.Parameter]] = []  # (group, my copy) for the ties this rank holds
        self.cross: list[Tie] = []
        for tie in ties:
            stages = sorted({device_of(k) for k in tie.chunks})
            if len(stages) < 2:
                continue  # one stage: a single parameter already
            self.cross.append(tie)
            for r, row in enumerate(grid):
                g = dist.new_group([int(row[s]) for s in stages])
                if r == dp_rank and pp_rank in stages:
                    k, name = next((k, n) for k, n in tie.members if device_of(k) == pp_rank)
                    self.groups.append((g, modules[k].get_parameter(name)))

    def __bool__(self) -> bool:
        return bool(self.cross)

    @torch.no_grad()
    def reduce(self, grad_of: Callable[[nn.Parameter], torch.Tensor | None] = lambda p: p.grad) -> None:
        """Sum every tied copy's gradient over its group (in place); a missing grad counts as zero."""
        for g, p in self.groups:
            grad = grad_of(p)
            if grad is None:
                raise RuntimeError(f"tied parameter {tuple(p.shape)} has no gradient on rank {dist.get_rank()}; "
                                   "reduce after the step, before zero_grad")
            dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=g)

    @torch.no_grad()
    def max_weight_diff(self, value_of: Callable[[nn.Parameter], torch.Tensor] = lambda p: p) -> float:
        """Largest |difference| between the copies of any tie on this rank's groups (0.0: identical)."""
        worst = 0.0
        for g, p in self.groups:
            v = value_of(p).detach().float()
            hi, lo = v.clone(), v.clone()
            dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=g)
            dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=g)
            worst = max(worst, (hi - lo).abs().max().item())
        return worst


__all__ = ["Tie", "TiedGrads"]
