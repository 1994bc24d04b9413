"""The tuner's chosen plan as files: schedule, Gantt chart and the launch configuration of three runtimes.

:func:`write_plan` writes into a folder, and only these files (each whole or not at all; nothing else in the
folder is touched, nothing is deleted):

===========================  =====================================================================
``plan.json``               the plan (pipeloom's format: ``pipeloom run --plan``, ``show``, ...)
``plan.torch.csv``          the same order as torch's compute-only CSV (torchtitan runs it)
``plan.torch.csv.meta.json`` the plan's builder and memory limit beside the CSV (torch's loader reads only actions)
``plan.gantt.png``          its Gantt chart (plans of at most :data:`GANTT_MAX_JOBS` jobs)
``pipeloom_torchtitan.py``  torchtitan 0.3's config function for the plan (not written where torchtitan
                            cannot place the plan's stages; ``launch.json`` says why)
``torchtitan_args.txt``     the same settings as torchtitan command-line overrides
``megatron_args.txt``       Megatron-LM arguments (:mod:`pipeloom.integrations.megatron`)
``launch.json``             all of it, with the commands and what each runtime does differently
``pipeloom.toml``           the settings (``pipeloom run --config``, ``pipeloom plan --config``), written by
                            :func:`pipeloom.tune.settings.write_config` (``tune --out`` calls both)
===========================  =====================================================================
"""
from __future__ import annotations

import json
import os

from ..core.files import atomic_write, write_text
from ..core.ir import Placement
from ..integrations import megatron as _mg
from ..integrations import torchtitan as _tt
from ..schedule.io import save

#: pipeloom builders Megatron-Core runs natively: 1F1B (vpp 1) and interleaved 1F1B (vpp > 1)
MEGATRON_NATIVE = _mg.MEGATRON_ORDERS
#: the files :func:`write_plan` may write, in the order it writes them
FILES = ("plan.json", "plan.torch.csv", "plan.torch.csv.meta.json", "plan.gantt.png", "pipeloom_torchtitan.py",
         "torchtitan_args.txt", "megatron_args.txt", "launch.json", "pipeloom.toml")
#: plans with more jobs than this get no Gantt picture
GANTT_MAX_JOBS = 20000


def megatron_args(res, c) -> list[str]:
    """Megatron-LM command-line arguments of configuration ``c``."""
    return _megatron(res, c).args


def _megatron(res, c) -> _mg.MegatronArgs:
    return _mg.megatron_args(pp=c.pp, vpp=c.vpp, placement=c.placement, seg_layer_num=c.seg_layer_num,
                             schedule=c.schedule, tp=c.tp, microbatch_size=c.microbatch_size,
                             microbatches=c.microbatches, global_batch=res.problem.global_batch, seq=res.problem.seq,
                             recompute=c.recompute, zero=c.zero, ep=getattr(c, "ep", 1), cp=getattr(c, "cp", 1),
                             fp8=getattr(res.problem, "fp8", False))


def titan_job(res, c) -> _tt.TitanJob:
    """What torchtitan needs of configuration ``c``."""
    return _tt.TitanJob(pp=c.pp, vpp=c.vpp, placement=Placement(c.placement), seg_layer_num=tuple(c.seg_layer_num),
                        microbatches=c.microbatches, microbatch_size=c.microbatch_size, tp=c.tp, dp=c.dp,
                        zero=c.zero, recompute=c.recompute, seq=res.problem.seq, global_batch=res.problem.global_batch,
                        model=res.problem.model.name, schedule=c.schedule)


def write_plan(res, out_dir: str) -> list[str]:
    """Write the best configuration of ``res`` under ``out_dir`` (the files of the module docstring);
    returns the written paths. Use :func:`replaced` beforehand to learn which of them existed."""
    c = res.best
    if c is None:
        raise ValueError("no configuration fits; nothing to write")
    os.makedirs(out_dir, exist_ok=True)
    written: list[str] = []

    def path(name: str) -> str:
        return os.path.join(out_dir, name)

    sched = c.schedule_obj
    save(sched, path("plan.json"))
    written.append(path("plan.json"))
    csv_name = "plan.torch.csv"
    written += save(sched, path(csv_name), fmt="torch")  # the CSV and its .meta.json (the plan's limit)
    if sched.num_jobs <= GANTT_MAX_JOBS and c.sim is not None:
        from ..viz import in_seconds, write_outputs
        from ..viz.timeline import from_sim

        # in seconds, as the table (the sim's unit is scaled)
        sim = c.sim
        if sim.makespan and c.makespan_s:
            sim = in_seconds(sim, c.makespan_s / sim.makespan)
        written += write_outputs([path("plan.gantt.png")],
                                 timeline=from_sim(sim, unit="s") if sim is not c.sim else from_sim(sim))
    world = c.tp * c.pp * c.dp
    gpn = res.problem.gpu.gpus_per_node
    torchrun = f"torchrun --nnodes {max(1, world // gpn)} --nproc-per-node {min(world, gpn)}"
    titan_written, titan = _tt.write_files(titan_job(res, c), out_dir, csv_name, launcher=torchrun)
    written += titan_written
    mg = _megatron(res, c)
    write_text(path("megatron_args.txt"), mg.text())
    written.append(path("megatron_args.txt"))
    plan_path = path("plan.json")
    run_cmd = (f"pipeloom run --plan {plan_path} --dp {c.dp}" if c.tp == 1 else
               f"# pipeloom run has no tensor parallelism; pipeline part: pipeloom run --plan {plan_path} --dp {c.dp}")
    launch = {
        "config": c.to_dict(),
        "pipeloom_run": run_cmd,
        "torchrun": f"{torchrun} -m pipeloom run --plan {plan_path} --dp {c.dp}",
        "torchtitan": titan,
        "megatron_args": mg.args,
        "megatron_split": mg.split,
        "megatron_vpp": mg.vpp,
        "megatron_note": "; ".join(mg.notes) or None,
        "megatron_runs_this_order": c.schedule in MEGATRON_NATIVE and (c.vpp == 1 or c.placement is not Placement.V),
    }
    with atomic_write(path("launch.json")) as fh:
        json.dump(launch, fh, indent=1, allow_nan=False)
    written.append(path("launch.json"))
    return written


def replaced(out_dir: str) -> list[str]:
    """The files of :data:`FILES` that already exist in ``out_dir`` (a run replaces them, nothing else)."""
    return [os.path.join(out_dir, f) for f in FILES if os.path.exists(os.path.join(out_dir, f))]
