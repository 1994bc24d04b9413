"""pipeloom: pipeline-parallel schedules for PyTorch.

The layers, lowest first (each imports only those below it): ``core`` (the schedule value, the
dependency and memory rules, costs, errors), ``sim``, ``schedule``, ``models``, ``partition``,
``viz``, ``trace``, ``runtime``, ``memory``; ``api`` and ``cli`` on top. Everything up to ``trace`` and
``memory.analytic`` never imports torch.
"""
from .api import *  # noqa: F401,F403  (the public names, listed in api.__all__)
from .api import __all__

__version__ = "0.1.0"
