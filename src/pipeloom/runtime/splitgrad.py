"""The split backward's former home: it moved to :mod:`pipeloom.autograd.splitgrad` (below both the runtime and
the memory tracer); these names are re-exported from there for code that still imports them here."""
from ..autograd.splitgrad import (SplitGrad, Stash, deferrable_linears, deferred_share, is_conv1d,  # noqa: F401
                                  weight_grads)

__all__ = ["SplitGrad", "Stash", "deferrable_linears", "deferred_share", "is_conv1d", "weight_grads"]
