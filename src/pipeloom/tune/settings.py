"""The tuner's chosen plan as a settings file (``DIR/pipeloom.toml``) that ``pipeloom run --config`` and
``pipeloom plan --config`` take (no torch).

``[schedule]`` names the builder, shape and memory limit and points at the exact plan ``tune`` wrote
(``plan = "plan.json"``): ``run --config`` runs that file; ``plan --config`` plans the builder again for the
same shape, layer split and limit, with costs from the layer counts. ``[partition]`` holds the layer split,
``[training]`` dp, ZeRO, micro-batch size and sequence length, ``[tune]`` what was asked and predicted
(``pipeloom tune --config`` asks it again).
"""
from __future__ import annotations

import os

from ..core.config import CONFIG_NAME, ModelSection, PartitionSection, PipeloomConfig, ScheduleSection, \
    TrainingSection, TuneSection


def plan_config(res, plan_file: str = "plan.json", model_path: str | None = None,
                asked: dict | None = None) -> PipeloomConfig:
    """The settings of ``res.best`` (a :class:`~pipeloom.tune.search.TuneResult`); ``plan_file`` is the
    schedule file beside the settings file; ``model_path`` the transformers config.json tuned for (what
    ``pipeloom run`` trains; a preset has none); ``asked``: the rest of the question as ``[tune]`` fields
    (``gpu_flops``, ``max_pp``, ``schedules``, ... as the command line gave them; None values left out)."""
    c, p = res.best, res.problem
    if c is None:
        raise ValueError("no configuration fits; nothing to write")
    path_like = model_path is not None and os.path.exists(model_path)
    return PipeloomConfig(
        schedule=ScheduleSection(name=c.schedule, pp=c.pp, vpp=c.vpp, microbatches=c.microbatches,
                                 mem_limit=None if c.mem_limit is None else f"{c.mem_limit:g}", plan=plan_file),
        # a chunk of only the embedding or only the loss ('ends' partition) is no Partition pipeloom run builds
        partition=PartitionSection(layers_per_chunk=tuple(c.seg_layer_num) if min(c.seg_layer_num) >= 1 else None),
        model=ModelSection(name=model_path if path_like else None),
        # pipeloom run shards at most the optimizer (ZeRO-1); a ZeRO-2/3 plan's level is in the header
        training=TrainingSection(dp=c.dp, zero=min(c.zero, 1), microbatch_size=c.microbatch_size, seq_len=p.seq,
                                 dtype="bf16"),
        tune=TuneSection(model=model_path if path_like else p.model.name, gpus=p.gpus, gpu=p.gpu.name, global_batch=p.global_batch, seq=p.seq,
                         tp=c.tp, recompute=c.recompute, step_time_s=c.step_time_s, mfu=c.mfu,
                         tokens_per_s=c.tokens_per_s, ep=c.ep, cp=c.cp, **{k: v for k, v in (asked or {}).items() if v is not None}))


def write_config(res, out_dir: str, plan_file: str = "plan.json", model_path: str | None = None,
                 asked: dict | None = None) -> str:
    """Write ``out_dir/pipeloom.toml`` (:func:`plan_config`); returns its path."""
    cfg = plan_config(res, plan_file, os.path.abspath(model_path) if model_path else None, asked)
    c = res.best
    header = (f"pipeloom tune's best plan: {res.problem.model.name} on {res.problem.gpus} x {res.problem.gpu.name}, "
              f"tp {c.tp} x pp {c.pp} x dp {c.dp}\n"
              f"pipeloom run --config {CONFIG_NAME} runs schedule.plan ({plan_file}) exactly; flags win over the file\n"
              f"pipeloom plan --config {CONFIG_NAME} plans {c.schedule} again for this shape, split and limit"
              + ("" if c.tp == 1 else f"\npipeloom run has no tensor parallelism: tp {c.tp} is a record ([tune])")
              + ("" if min(c.seg_layer_num) >= 1 else
                 f"\nlayers per chunk {list(c.seg_layer_num)}: a chunk of only the embedding or only the loss, which "
                 f"pipeloom run cannot build; [partition] is left out (run splits evenly), megatron_args.txt has "
                 f"the layout")
              + ("" if c.zero <= 1 else f"\nplanned with ZeRO-{c.zero}; pipeloom run shards only the optimizer "
                                         f"(training.zero = 1): it needs more memory than planned"))
    path = os.path.join(out_dir, CONFIG_NAME)
    cfg.save(path, header)
    return path
