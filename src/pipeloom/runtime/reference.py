"""The single-process reference a run is checked against (needs torch)."""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

__all__ = ["reference_step"]


def reference_step(model: nn.Module, loss_fn: Callable, inputs: Sequence[torch.Tensor],
                   targets: Sequence[torch.Tensor]) -> tuple[float, dict[str, torch.Tensor]]:
    """Single-process reference: mean loss over the microbatches and the gradients by name."""
    model.zero_grad(set_to_none=True)
    n = len(inputs)
    total = 0.0
    for x, t in zip(inputs, targets):
        loss = loss_fn(model(x), t)
        (loss / n).backward()
        total += loss.item()
    return total / n, {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
