"""pipeloom plans in torch.distributed.pipelining, and torch's schedules as pipeloom schedules (imports torch).

* :func:`to_torch_actions` - a pipeloom :class:`Schedule` as torch's per-rank ``_Action`` lists
  (the vocabulary and the microbatch renumbering are those of :mod:`pipeloom.schedule.io.torch_csv`).
* :func:`from_torch_order` - torch's ``pipeline_order`` (or any per-rank action lists) as a pipeloom schedule.
* :func:`torch_builtin` - the order one of torch's schedule classes generates for a shape, built without
  processes (the classes are given light stand-ins for their stages, which is all they read to plan).
* :func:`build_torch_schedule` - a ``_PipelineScheduleRuntime`` with a pipeloom plan loaded, ready for
  ``.step()``: a torchtitan-style loop runs a pipeloom plan without files.
* :func:`build_stages_from_csv` - everything one rank needs to run a saved plan (pipeloom JSON/CSV or torch
  CSV): the stages the plan's placement gives this rank, built from a function that makes chunk ``c``, and the
  runtime with the plan loaded; :meth:`RankPipeline.step` feeds inputs and targets where they belong.

What torch assumes, checked against torch 2.13's ``schedules.py``:

* the last stage's losses are kept in the order that stage runs its forwards and looked up by microbatch
  index, so that order must be 0, 1, 2, ... (export renumbers microbatches to make it so);
* ``Schedule1F1B.pipeline_order`` (the order torch draws and dumps) is off by one on the last rank: it
  forwards microbatches 1..m and never 0 (its warm-up counter starts at 0 and is incremented before the
  first steady-state forward). The order ``Schedule1F1B`` *executes* (``_step_microbatches``) is
  warm-up ``min(m, pp - stage)`` forwards, then backward/forward pairs, then the remaining backwards;
  :func:`torch_builtin` returns that executed order for ``1F1B`` and says so in ``meta``.
"""
from __future__ import annotations

from typing import Callable

import torch.nn as nn
from torch.distributed.pipelining import schedules as _ts

from ..core.errors import ScheduleError
from ..core.ir import BW, F, Placement, Schedule, make_schedule
from ..schedule.io.torch_csv import from_torch_rows, to_torch_rows
from ..schedule.validate import summary, validate

#: torch's schedule classes pipeloom can read, by the name ``-s torch:NAME`` takes
BUILTINS = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
_V_STYLE = ("ZBVZeroBubble", "DualPipeV")


def to_torch_actions(schedule: Schedule) -> dict[int, list]:
    """torch's ``pipeline_order`` of ``schedule``: per rank a list of ``_Action`` (composites for overlapped pairs)."""
    return {r: [_ts._Action.from_str(c) for c in row] for r, row in enumerate(to_torch_rows(schedule))}


def from_torch_order(order: dict[int, list], *, name: str = "torch") -> Schedule:
    """A pipeloom schedule from torch's per-rank action lists (``None`` = idle; comm actions are dropped)."""
    ranks = sorted(order)
    if ranks != list(range(len(ranks))):
        raise ScheduleError(f"torch order names ranks {ranks}; expected 0..{len(ranks) - 1}")
    return from_torch_rows([["" if a is None else str(a) for a in order[r]] for r in ranks], name=name)


class _StageStandIn:
    """What torch's schedule classes read from a stage while planning (no module, no process group)."""

    def __init__(self, index: int, num_stages: int, pp: int, rank: int):
        self.stage_index, self.num_stages, self.group_size, self.group_rank = index, num_stages, pp, rank
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        self.submod = nn.Identity()


def _executed_1f1b(pp: int, m: int) -> Schedule:
    """The order ``Schedule1F1B._step_microbatches`` runs (see the module docstring)."""
    devices = []
    for d in range(pp):
        w = min(m, pp - d)
        seq = [F(i, d) for i in range(w)]
        for i in range(m):
            seq.append(BW(i, d))
            if w + i < m:
                seq.append(F(w + i, d))
        devices.append(seq)
    return make_schedule("torch:1F1B", pp, 1, m, Placement.INTERLEAVED, devices, source="torch",
                         note="the order Schedule1F1B executes; its pipeline_order is off by one on the last rank")


def torch_builtin(name: str, pp: int, microbatches: int, vpp: int | None = None) -> Schedule:
    """The schedule torch's class ``name`` (one of :data:`BUILTINS`) generates for ``pp`` ranks and
    ``microbatches``, as a validated pipeloom schedule. ``vpp``: stages per rank for the multi-stage
    classes (default 2; ZBVZeroBubble and DualPipeV take exactly 2; GPipe and 1F1B take 1)."""
    key = {b.lower(): b for b in BUILTINS}.get(name.lower())
    if key is None:
        raise ScheduleError(f"unknown torch schedule {name!r}; choose one of: {', '.join(BUILTINS)}")
    cls = _ts.get_schedule_class(key)
    multi = issubclass(cls, _ts.PipelineScheduleMulti)
    v = (vpp or 2) if multi else (vpp or 1)
    if not multi and v != 1:
        raise ScheduleError(f"torch:{key} runs one stage per rank; got vpp={v}")
    if key in _V_STYLE and v != 2:
        raise ScheduleError(f"torch:{key} needs exactly 2 stages per rank; got vpp={v}")
    if key == "1F1B":
        sched = _executed_1f1b(pp, microbatches)
    else:
        n = pp * v
        if multi:
            if key in _V_STYLE:
                idx = [0, 2 * pp - 1]
            else:
                idx = [k * pp for k in range(v)]
            stages = [_StageStandIn(i, n, pp, 0) for i in idx]
            try:
                obj = cls(stages, microbatches, loss_fn=_no_loss)
            except (ValueError, AssertionError, RuntimeError) as e:
                raise ScheduleError(f"torch:{key} cannot plan pp={pp} vpp={v} m={microbatches}: "
                                    f"{str(e).strip().splitlines()[0]}") from None
        else:
            obj = cls(_StageStandIn(0, pp, pp, 0), microbatches, loss_fn=_no_loss)
        sched = from_torch_order(obj.pipeline_order, name=f"torch:{key}")
        sched = Schedule(sched.name, sched.pp, sched.vpp, microbatches, sched.placement, sched.devices,
                         sched.overlapped, meta={"source": "torch", "class": cls.__name__})
    problems = validate(sched)
    if problems:
        raise ScheduleError(f"torch:{key}'s own order for pp={pp} vpp={v} m={microbatches} is invalid: "
                            f"{summary(problems)}")
    return sched


def _no_loss(output, target):  # torch needs a loss_fn to plan the backward; never called here
    raise RuntimeError("planning only")


#: where :func:`build_torch_schedule` posts each receive: ``early`` (first, see :func:`lower_early_recvs`) or
#: ``torch`` (where torch's own lowering pass puts it)
RECV_POSTING = ("early", "torch")


def lower_early_recvs(order: dict[int, list]) -> dict[int, list]:
    """torch's compute+comms lowering of ``order`` (per rank ``_Action`` lists; torch's own passes add the
    sends, receives, unshard/reshard and gradient reductions), with every receive moved to the front of its
    rank's list (after the unshards), in the order the lowering gave them.

    Why: gloo's TCP transport is a rendezvous: a send's bytes only move once the receiver has posted the
    matching receive (the receiver's ``NOTIFY_RECV_READY`` reaches the sender's device thread, which then
    writes the data). torch's lowering puts each receive where its round-robin walk (one action per rank per
    round) happens to be when the sender's action is placed, which for a plan whose ranks run unequal numbers
    of actions between two transfers is often right before the action that waits for it: the whole handshake
    then lies on the critical path. Posted first, each transfer starts as soon as its sender sends. This is
    safe: receives from one peer stay in the order the lowering gave them (the order that peer sends, which is
    how gloo matches them), each (stage, microbatch) has its own receive buffer in torch's stages (nothing is
    reused within a step), and posting a receive never blocks."""
    ranks = sorted(order)
    home, m = {}, 0  # stage -> its rank; the number of microbatches
    for r in ranks:
        for a in order[r]:
            for s in (a.sub_actions or (a,)) if a is not None else ():
                home[s.stage_index] = r
                m = max(m, s.microbatch_index + 1)
    num_stages = max(home) + 1
    lowered = {}
    for r in ranks:
        acts = _ts._add_unshard_reshard([a for a in order[r] if a is not None])
        lowered[r] = _ts._add_reduce_grad(acts, m)
    lowered = _ts._add_send_recv(lowered, stage_to_rank=lambda s: home[s], num_stages=num_stages)
    recv = (_ts.RECV_F, _ts.RECV_B)
    out = {}
    for r in ranks:
        head = [a for a in lowered[r] if a.computation_type == _ts.UNSHARD]
        recvs = [a for a in lowered[r] if a.computation_type in recv]
        rest = [a for a in lowered[r] if a.computation_type not in recv and a.computation_type != _ts.UNSHARD]
        out[r] = head + recvs + rest
    return out


def build_torch_schedule(schedule: Schedule, stages: list, loss_fn: Callable, *, recvs: str = "early",
                         **kw) -> "_ts._PipelineScheduleRuntime":
    """torch's ``_PipelineScheduleRuntime`` for this rank's ``stages`` with ``schedule`` loaded (validated by
    pipeloom first, then by torch), ready for ``.step()``. ``recvs``: ``early`` (default) lowers it with
    torch's own send/recv pass and posts every receive first (:func:`lower_early_recvs`: on gloo this takes
    the send/receive handshake off the critical path); ``torch`` keeps torch's lowering as it is (what loading
    the plan's compute-only CSV gives). ``kw`` goes to the runtime's constructor (e.g. ``scale_grads``)."""
    if recvs not in RECV_POSTING:
        raise ValueError(f"recvs={recvs!r}; choose one of: {', '.join(RECV_POSTING)}")
    problems = validate(schedule)
    if problems:
        raise ScheduleError(f"cannot hand an invalid schedule to torch: {summary(problems)}")
    runtime = _ts._PipelineScheduleRuntime(stages, schedule.microbatches, loss_fn=loss_fn, **kw)
    runtime.pipeline_order = to_torch_actions(schedule)
    runtime._validate_and_set_stage_mapping(runtime.pipeline_order)
    if recvs == "torch":
        runtime._prepare_schedule_with_comms(runtime.pipeline_order)
    else:
        runtime._prepare_schedule_with_comms(lower_early_recvs(runtime.pipeline_order), format="compute_comms")
    return runtime


class RankPipeline:
    """One rank's part of a plan in torch's runtime (made by :func:`build_stages_from_csv`).

    ``schedule``: the plan; ``chunks``: the global chunks (torch's stage indices) this rank runs, in increasing
    order; ``modules`` / ``stages``: their modules and torch ``PipelineStage``s; ``runtime``: torch's
    ``_PipelineScheduleRuntime`` with the plan loaded; ``is_first`` / ``is_last``: whether this rank holds
    chunk 0 (it takes the inputs) / the last chunk (it takes the targets and computes the losses)."""

    def __init__(self, schedule: Schedule, chunks: list[int], modules: list, stages: list, runtime) -> None:
        self.schedule, self.chunks, self.modules, self.stages, self.runtime = schedule, chunks, modules, stages, runtime
        self.is_first = 0 in chunks
        self.is_last = schedule.num_chunks - 1 in chunks

    def step(self, inputs=None, target=None) -> list:
        """One training step of the plan (forward and backward of every microbatch, no optimizer): ``inputs``
        (the whole local batch; used on the first rank) and ``target`` (used on the last rank) are split into
        the plan's microbatches by torch. Returns this rank's per-microbatch losses (empty unless it is last)."""
        losses: list = []
        args = (inputs,) if self.is_first else ()
        kw = {"target": target, "losses": losses} if self.is_last else {}
        self.runtime.step(*args, **kw)
        return losses


def build_stages_from_csv(plan, make_chunk: Callable, loss_fn: Callable, *, rank: int | None = None,
                          device=None, group=None, recvs: str = "early", scale_grads: bool = True) -> RankPipeline:
    """This rank's stages of a saved plan, built and loaded into torch's runtime, ready for
    :meth:`RankPipeline.step`.

    ``plan``: a path (pipeloom JSON/CSV or torch's CSV, as :func:`pipeloom.schedule.io.load` reads) or a
    :class:`Schedule`. ``make_chunk(c, num_chunks)`` returns the ``nn.Module`` of global chunk ``c`` (torch's
    stage ``c``: the model's layers in order, chunk 0 first); it is called only for the chunks the plan places on
    this rank (its placement: looped or V, read from the plan's actions). ``rank``/``group``: this rank in the
    pipeline group (default: the default process group). ``loss_fn(output, target)`` as torch's schedules take
    it. ``scale_grads``: divide the summed gradients by the number of microbatches (torch's default)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    from ..schedule import io as schedule_io

    schedule = plan if isinstance(plan, Schedule) else schedule_io.load(str(plan))
    if rank is None:
        rank = dist.get_rank(group) if dist.is_initialized() else 0
    world = dist.get_world_size(group) if dist.is_initialized() else schedule.pp
    if world != schedule.pp:
        raise ScheduleError(f"the plan has pp={schedule.pp} ranks; this pipeline group has {world}")
    device = torch.device("cpu") if device is None else torch.device(device)
    n = schedule.num_chunks
    mine = schedule.chunks_of(rank)
    modules = [make_chunk(c, n).to(device) for c in mine]
    stages = [PipelineStage(mod, c, n, device, group=group) for c, mod in zip(mine, modules)]
    runtime = build_torch_schedule(schedule, stages, loss_fn, recvs=recvs, scale_grads=scale_grads)
    return RankPipeline(schedule, mine, modules, stages, runtime)
