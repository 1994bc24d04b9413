"""The tuner's chosen plan as files: schedule, Gantt chart and the launch configuration of three runtimes."""
from __future__ import annotations

import json
import os

from ..core.ir import Placement
from ..partition.megatron import counts_to_layout
from ..schedule.io import save

#: pipeloom builders Megatron-Core runs natively: 1F1B (vpp 1) and interleaved 1F1B (vpp > 1)
MEGATRON_NATIVE = ("1f1b", "interleaved")
#: torch.distributed.pipelining classes for the builders it has one of (else: the CSV schedule)
TORCH_CLASSES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "fthenb": "GPipe", "zbv": "ZBVZeroBubble",
                 "dualpipev": "DualPipeV"}


def megatron_args(res, c) -> list[str]:
    """Megatron-Core command-line arguments of configuration ``c``."""
    args = [f"--tensor-model-parallel-size {c.tp}", f"--pipeline-model-parallel-size {c.pp}",
            f"--micro-batch-size {c.microbatch_size}", f"--global-batch-size {res.problem.global_batch}",
            f"--seq-length {res.problem.seq}"]
    if c.tp > 1:
        args.append("--sequence-parallel")
    if c.vpp > 1 and c.placement is Placement.INTERLEAVED:
        args.append(f"--num-virtual-stages-per-pipeline-rank {c.vpp}")
        args.append(f"--microbatch-group-size-per-virtual-pipeline-stage {c.pp}")
    if c.placement is Placement.INTERLEAVED or c.vpp == 1:
        args.append(f"--pipeline-model-parallel-layout \"{counts_to_layout(c.seg_layer_num)}\"")
    if c.recompute == "selective":
        args.append("--recompute-granularity selective")
    elif c.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    if c.zero:
        args.append("--use-distributed-optimizer")
    args += ["--overlap-grad-reduce", "--bf16"]
    return args


def torchtitan_toml(res, c, csv_name: str | None) -> str:
    layers = [sum(c.seg_layer_num[k] for k in _chunks(c, d)) for d in range(c.pp)]
    lines = ["[parallelism]", f"tensor_parallel_degree = {c.tp}", f"pipeline_parallel_degree = {c.pp}",
             f"data_parallel_shard_degree = {c.dp}" if c.zero else f"data_parallel_replicate_degree = {c.dp}",
             f"pipeline_parallel_microbatch_size = {c.microbatch_size}",
             f"pipeline_parallel_layers_per_stage = {min(c.seg_layer_num)}  # pipeloom split per chunk: "
             f"{list(c.seg_layer_num)}"]
    cls = TORCH_CLASSES.get(c.schedule)
    if cls and csv_name is None:
        lines.append(f"pipeline_parallel_schedule = \"{cls}\"")
    else:
        lines.append("pipeline_parallel_schedule = \"PipelineScheduleMulti\"")
        lines.append(f"pipeline_parallel_schedule_csv = \"{csv_name}\"")
    lines += ["", "[training]", f"global_batch_size = {res.problem.global_batch}", f"seq_len = {res.problem.seq}",
              "", "[activation_checkpoint]",
              f"mode = \"{ {'none': 'none', 'selective': 'selective', 'full': 'full'}[c.recompute] }\"",
              f"# layers per pipeline rank: {layers}; microbatches per step: {c.microbatches}"]
    return "\n".join(lines) + "\n"


def _chunks(c, d: int) -> list[int]:
    from ..core.ir import chunks_of

    return chunks_of(d, c.pp, c.vpp, c.placement)


def write_plan(res, out_dir: str) -> list[str]:
    """Write the best configuration of ``res`` under ``out_dir``; returns the written paths."""
    from ..sim.simulate import simulate  # noqa: F401  (the schedule was simulated already)
    from ..viz import render_plan

    c = res.best
    if c is None:
        raise ValueError("no configuration fits; nothing to write")
    os.makedirs(out_dir, exist_ok=True)
    written = []
    sched = c.schedule_obj
    plan_path = os.path.join(out_dir, "plan.json")
    save(sched, plan_path)
    written.append(plan_path)
    csv_name = None
    if c.schedule not in TORCH_CLASSES or c.schedule not in ("1f1b", "interleaved", "fthenb"):
        csv_name = "plan.torch.csv"
        try:
            save(sched, os.path.join(out_dir, csv_name), fmt="torch")
            written.append(os.path.join(out_dir, csv_name))
        except (ValueError, ImportError):
            csv_name = None
    big = sched.num_jobs > 20000
    if not big:
        paths = render_plan(c.sim, out_dir, stem="plan",  # in seconds, as the table (the sim's unit is scaled)
                            seconds_per_unit=c.makespan_s / c.sim.makespan if c.sim.makespan and c.makespan_s else None)
        written += [p for p in paths if p.endswith(".png")]
        for p in paths:
            if not p.endswith(".png") and os.path.exists(p):
                os.remove(p)
    d = c.to_dict()
    world = c.tp * c.pp * c.dp
    run_cmd = (f"pipeloom run --plan {plan_path} --dp {c.dp}" if c.tp == 1 else
               f"# pipeloom run has no tensor parallelism; pipeline part: pipeloom run --plan {plan_path} --dp {c.dp}")
    launch = {
        "config": d,
        "pipeloom_run": run_cmd,
        "torchrun": f"torchrun --nnodes {max(1, world // res.problem.gpu.gpus_per_node)} --nproc-per-node "
                    f"{min(world, res.problem.gpu.gpus_per_node)} -m pipeloom run --plan {plan_path} --dp {c.dp}",
        "megatron_args": megatron_args(res, c),
        "megatron_note": None if c.schedule in MEGATRON_NATIVE else
        f"Megatron-Core has no {c.schedule} schedule; these arguments give its shape (interleaved 1F1B order)",
        "torchtitan_toml": "torchtitan.toml",
    }
    with open(os.path.join(out_dir, "torchtitan.toml"), "w") as fh:
        fh.write(torchtitan_toml(res, c, csv_name))
    written.append(os.path.join(out_dir, "torchtitan.toml"))
    with open(os.path.join(out_dir, "megatron_args.txt"), "w") as fh:
        fh.write(" \\\n  ".join(launch["megatron_args"]) + "\n")
    written.append(os.path.join(out_dir, "megatron_args.txt"))
    with open(os.path.join(out_dir, "launch.json"), "w") as fh:
        json.dump(launch, fh, indent=1)
    written.append(os.path.join(out_dir, "launch.json"))
    return written
