"""Run pipeloom schedules on torch.distributed (gloo on CPU, NCCL on GPU).

Importing this package imports torch. Main pieces:

* :class:`PipelineExecutor` (executor.py): runs one rank's job list (F, B, W, BW) of any valid
  schedule; split backward, link-ordered batched P2P, grads reduced once over DP.
* :mod:`.commplan`: the messages of a schedule and the per-link order both ends agree on (no torch).
* :mod:`.launch`: spawn local ranks or join torchrun.
* :mod:`.example`: the ``llama-tiny`` example behind ``pipeloom run``.
"""
from .commplan import build_comm_plan
from .executor import NonFiniteLossError, PipelineExecutor, ScheduleRuntimeError, reference_step
from ..trace.writer import JobLog, parse_profile_steps
from .launch import RankFailure, spawn
from .p2p import PeerError
from ..models.slicing import chunk_modules

__all__ = ["PipelineExecutor", "NonFiniteLossError", "ScheduleRuntimeError", "PeerError", "RankFailure",
           "JobLog", "build_comm_plan", "chunk_modules", "parse_profile_steps", "reference_step", "spawn"]
