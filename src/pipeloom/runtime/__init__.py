"""Run pipeloom schedules on torch.distributed (gloo on CPU, NCCL on GPU).

Importing this package imports torch. Main pieces:

* :class:`PipelineExecutor` (executor.py): runs one rank's job list (F, B, W, BW) of any valid
  schedule; link-ordered batched P2P; ``on_job`` observes or wraps every job.
* :class:`SplitGrad` (from :mod:`pipeloom.autograd.splitgrad`, below both the runtime and the memory
  tracer, which replays schedules with it too): the split backward (weight grads of the linears
  deferred from B to W), by forward hooks on module instances.
* :mod:`.grads`: the step's flat fp32 gradient buffer and the :class:`GradReducer` seam; :mod:`.zero1` the ZeRO-1 optimizer over its shards
  (default: one all-reduce over data parallelism after accumulation).
* :mod:`.commplan`: the messages of a schedule and the per-link order both ends agree on (no torch).
* :mod:`.tied`: a weight held by chunks on several stages (tied embedding and head): its copies'
  gradients summed over a group of the ranks holding them, before the optimizer step.
* :mod:`.data`: token files for ``pipeloom run --data`` (no torch).
* :mod:`.launch`: spawn local ranks or join torchrun.
* :mod:`.config`: :class:`~.config.RunConfig`, what one run is, and :func:`~.config.prepare` (plans or validates
  its schedule once; no torch).
* :mod:`.driver`: the orchestration behind ``pipeloom run``: spawn or join the ranks, build each rank's chunks
  (the built-in ``llama-tiny`` example or a model of your own), run the steps, gather the result.
* :mod:`.verify`: ``--verify``, the first step against a single-process reference.
* :mod:`.tp_overlap`: per B/BW job, what a tensor-parallel layer's input-gradient collective overlaps
  (``pipeloom run --tp-overlap off|async|chunked:K|fill``).
* :mod:`.timing`: job timers (wall clock or CUDA events) and a step's statistics.
"""
from .commplan import build_comm_plan
from .executor import NonFiniteLossError, PipelineExecutor, ScheduleRuntimeError, reference_step
from .grads import AllReduceAfterAccumulation, GradBuffer, GradReducer
from ..autograd.splitgrad import SplitGrad
from ..trace.writer import JobLog, parse_profile_steps
from .launch import RankFailure, spawn
from .p2p import PeerError
from ..models.slicing import chunk_modules

__all__ = ["PipelineExecutor", "NonFiniteLossError", "ScheduleRuntimeError", "PeerError", "RankFailure",
           "AllReduceAfterAccumulation", "GradBuffer", "GradReducer", "SplitGrad", "JobLog", "build_comm_plan", "chunk_modules", "parse_profile_steps", "reference_step", "spawn"]
