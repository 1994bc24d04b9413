"""``--config FILE``: a settings file's fields (:mod:`pipeloom.core.config`) as a command's flags.

The command line only maps flags to fields: each flag below is one ``section.field``. A field the file sets
fills its flag unless the flag is on the command line (the command line wins); a field the file leaves out
keeps the flag's own default.
"""
from __future__ import annotations

import argparse
import json

from ..core.config import ConfigError, PipeloomConfig, read_config


def _counts(v) -> str:
    return ",".join(map(str, v))


def _options(v: dict) -> list[str]:
    return [f"{k}={json.dumps(x)}" for k, x in v.items()]


#: (argparse dest, section.field, conversion to the flag's value or None)
SCHEDULE_FLAGS = [
    ("schedule", "schedule.name", None), ("pp", "schedule.pp", None), ("vpp", "schedule.vpp", None),
    ("microbatches", "schedule.microbatches", None), ("mem_limit", "schedule.mem_limit", None),
    ("costs", "schedule.costs", None), ("mem", "schedule.mem", None), ("runtime", "schedule.runtime", None),
    ("option", "schedule.options", _options),
]
PARTITION_FLAGS = [
    ("layers", "partition.layers", None), ("layers_per_device", "partition.layers_per_device", _counts),
    ("layers_per_chunk", "partition.layers_per_chunk", _counts), ("layer_costs", "partition.layer_costs", None),
    ("balance", "partition.balance", None), ("vocab", "partition.vocab", None),
    ("hidden", "partition.hidden", None), ("seq", "partition.seq", None),
]
#: plan: the schedule and partition sections (--model there costs the layers)
PLAN_FLAGS = SCHEDULE_FLAGS + PARTITION_FLAGS + [("model", "partition.model", None)]
#: run: also the model, training and job sections (--model there is what is trained)
RUN_FLAGS = SCHEDULE_FLAGS + PARTITION_FLAGS + [
    ("model", "model.name", None), ("dim", "model.dim", None), ("weights", "model.weights", None),
    ("dp", "training.dp", None), ("steps", "training.steps", None),
    ("microbatch_size", "training.microbatch_size", None), ("seq_len", "training.seq_len", None),
    ("lr", "training.lr", None), ("seed", "training.seed", None), ("dtype", "training.dtype", None),
    ("zero", "training.zero", None), ("overlap_grad_reduce", "training.overlap_grad_reduce", None),
    ("rank_order", "training.rank_order", None), ("data", "training.data", None),
    ("data_dtype", "training.data_dtype", None),
    ("verify", "job.verify", None), ("log_dir", "job.log_dir", None), ("profile_steps", "job.profile_steps", None),
    ("timeout", "job.timeout_s", None),
]
#: tune: the problem of its [tune] record (the file tune --out wrote asks the same question again)
TUNE_FLAGS = [("model", "tune.model", None), ("gpus", "tune.gpus", None), ("gpu", "tune.gpu", None),
              ("global_batch", "tune.global_batch", None), ("seq", "tune.seq", None),
              ("gpus_per_node", "tune.gpus_per_node", None), ("gpu_flops", "tune.gpu_flops", None),
              ("gpu_memory", "tune.gpu_memory", None), ("intra_bw", "tune.intra_bw", None),
              ("intra_latency", "tune.intra_latency", None), ("inter_bw", "tune.inter_bw", None),
              ("inter_latency", "tune.inter_latency", None), ("efficiency", "tune.efficiency", None),
              ("calibration", "tune.calibration", None), ("max_tp", "tune.max_tp", None),
              ("tp", "tune.pin_tp", None), ("pp", "tune.pin_pp", None), ("max_pp", "tune.max_pp", None),
              ("max_vpp", "tune.max_vpp", None), ("max_microbatch_size", "tune.max_microbatch_size", None),
              ("schedules", "tune.schedules", None), ("recompute", "tune.recompute_modes", None),
              ("zero", "tune.zero_modes", None), ("reserve", "tune.reserve", None), ("top", "tune.top", None),
              ("vpp", "tune.pin_vpp", None), ("dp", "tune.pin_dp", None),
              ("microbatch_size", "tune.pin_microbatch_size", None), ("partitions", "tune.partitions", None),
              ("tp_overlap", "tune.tp_overlap", None), ("tp_comm_overlap", "tune.tp_comm_overlap", None),
              ("dp_bucket_size", "tune.dp_bucket_size", None),
              ("efficiency_half_hidden", "tune.efficiency_half_hidden", None),
              ("ep", "tune.pin_ep", None), ("max_ep", "tune.max_ep", None), ("cp", "tune.pin_cp", None),
              ("max_cp", "tune.max_cp", None), ("capacity_factor", "tune.capacity_factor", None),
              ("moe_imbalance", "tune.moe_imbalance", None), ("route_nodes", "tune.route_nodes", None),
              ("precision", "tune.precision", None), ("recompute_norms", "tune.recompute_norms", None),
              ("pair_fb", "tune.pair_fb", None)]
#: the tune flags a settings file records as the question asked (argparse dest -> [tune] field)
TUNE_QUESTION = {dest: path.split(".", 1)[1] for dest, path, _ in TUNE_FLAGS}
#: the flags that plan a schedule: when one is on the command line, a file's schedule.plan is not used
PLANNING_DESTS = {d for d, _, _ in SCHEDULE_FLAGS + PARTITION_FLAGS} | {"model"}


def add_config_option(p) -> None:
    """--config FILE (.toml or .json), e.g. the pipeloom.toml that 'pipeloom tune --out DIR' writes."""
    p.add_argument("--config", metavar="FILE.toml|FILE.json", default=None,
                   help="read the settings from this file ([schedule], [partition], ... sections; e.g. DIR/pipeloom."
                        "toml from 'pipeloom tune --out DIR'); a flag given on the command line wins over the file "
                        "(docs/cli.md#settings-files)")


def given_dests(sub: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The dests of the options ``argv`` gives explicitly (parsed again with every default suppressed)."""
    saved = [(a, a.default, a.required) for a in sub._actions]
    try:
        for a in sub._actions:
            a.default, a.required = argparse.SUPPRESS, False
        ns, _ = sub.parse_known_args(argv)
    finally:
        for a, d, r in saved:
            a.default, a.required = d, r
    return set(vars(ns)) & {a.dest for a in sub._actions}


def apply_config(args, sub: argparse.ArgumentParser, argv: list[str], flags: list) -> PipeloomConfig:
    """Fill ``args`` from ``args.config``'s fields where the flag is not in ``argv``; returns the config.

    A file's ``schedule.plan`` becomes ``args.plan`` while no planning flag is given (then the schedule
    is planned again from the file's [schedule] section and the flags)."""
    cfg, fields = read_config(args.config)
    if flags is RUN_FLAGS and "partition.model" in fields:
        raise ConfigError(f"{args.config}: partition.model: a run costs the layers of the model it trains ([model] "
                          f"name); leave partition.model out (it is for 'pipeloom plan')")
    given = given_dests(sub, argv)
    use_plan = cfg.schedule.plan is not None and not (given & PLANNING_DESTS) and hasattr(args, "plan") \
        and "plan" not in given
    fixed = use_plan or "plan" in given  # a schedule file (the settings' or --plan FILE) fixes the schedule
    for dest, path, conv in flags:
        if dest in given or path not in fields or not hasattr(args, dest):
            continue
        if fixed and (path.startswith("schedule.") or (path.startswith("partition.")
                                                         and path != "partition.layers_per_chunk")):
            continue  # the plan file fixes the schedule (a run still takes the layer split)
        section, name = path.split(".")
        v = getattr(getattr(cfg, section), name)
        if path == "schedule.name" and not v.startswith("torch:"):
            from ..schedule import registry
            try:
                registry.get(v)
            except ValueError as e:
                raise ConfigError(f"{args.config}: schedule.name: {e}") from None
        setattr(args, dest, conv(v) if conv else v)
    if use_plan:
        args.plan = cfg.schedule.plan
    return cfg
