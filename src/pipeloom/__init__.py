"""pipeloom: pipeline-parallel schedules for PyTorch.

The layers, lowest first (each imports only those below it): ``core`` (the schedule value, the
dependency and memory rules, costs, errors), ``sim``, ``schedule``, ``models``, ``partition``,
``viz``, ``trace``, ``runtime``, ``memory``; ``api`` and ``cli`` on top. Everything up to ``trace`` and
``memory.analytic`` never imports torch.

The public names (``pipeloom.plan``, ``pipeloom.Schedule``, ... listed in :mod:`pipeloom.api`) are
loaded on first use, so that ``import pipeloom.cli`` (the command line) pays only for what the
command it runs needs.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"


def __getattr__(name: str):
    """The facade's names, imported when first asked for (PEP 562)."""
    if name.startswith("__") and name != "__all__":
        raise AttributeError(name)
    api = importlib.import_module(f"{__name__}.api")
    if name == "__all__":
        return api.__all__
    if name in api.__all__:
        return getattr(api, name)
    raise AttributeError(f"module 'pipeloom' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(importlib.import_module(f"{__name__}.api").__all__))
