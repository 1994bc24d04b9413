"""``pipeloom run``: train the built-in example model, or a transformers model (``--model PATH``), with a
schedule on torch.distributed."""
from __future__ import annotations

import argparse
import math
import sys

from .common import (add_builder_options, add_costs_option, add_mem_limit_option, add_mem_option, add_partition_options,
                     add_schedule_option, add_shape_options, fmt, layers_int, number_type, partition_given,
                     plan_inputs, positive_int, print_json, print_table)
from ..schedule import io as schedule_io
from .config_opts import RUN_FLAGS, add_config_option

# defaults of the options that a --plan file replaces (None in argparse, to tell "not given" from the default)
_DEFAULTS = {"schedule": "1f1b", "pp": 2, "microbatches": 4}

# max |diff| accepted by --verify: fp32 must match the reference to float rounding; bf16 only roughly
TOLERANCE = {"fp32": 1e-5, "bf16": 5e-2}
# parameters after the first AdamW step: its update lr*g/(|g|+eps) turns the rounding of a gradient
# near eps into a good part of lr, so they are checked to a share of lr (a real bug moves them by ~lr)
PARAM_TOLERANCE = 0.05


def _delay(text: str) -> tuple[int, float]:
    try:
        r, s = text.split(":", 1)
        rank, sec = int(r), float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected RANK:SECONDS, e.g. 2:0.05") from None
    if rank < 0 or not (sec >= 0 and math.isfinite(sec)):
        raise argparse.ArgumentTypeError(f"{text!r}: RANK must be >= 0 and SECONDS a finite number >= 0")
    return rank, sec


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v


def _tp_overlap(text: str) -> str:
    from ..models.tp_modes import parse_overlap
    try:
        parse_overlap(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _millis(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of milliseconds") from None
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be a finite number of milliseconds >= 0, got {text}")
    return v


def add_parser(sub) -> None:
    p = sub.add_parser(
        "run",
        help="run a schedule for real on torch.distributed (example or transformers model, CPU/gloo or torchrun)",
        description=(
            "Train the built-in example model (a small Llama-style decoder on synthetic data), or a\n"
            "transformers model (--model PATH, optionally --weights and --data FILE), with a\n"
            "pipeline schedule on torch.distributed. Without torchrun the command spawns pp*dp ranks\n"
            "on this machine (gloo on 127.0.0.1, CPU); under torchrun (RANK/WORLD_SIZE set) it runs\n"
            "one rank per process and uses NCCL when CUDA is available. --verify compares the first\n"
            "step's loss and every gradient with a single-process reference, and the parameters after the\n"
            "first AdamW step (exit code 1 on failure)."),
        epilog=(
            "examples:\n"
            "  pipeloom run --example llama-tiny --schedule zbv --pp 4 --microbatches 8 --verify\n"
            "  pipeloom run --schedule 1f1b --pp 2 --dp 2 --microbatches 4 --steps 5 --log-dir logs\n"
            "  pipeloom plan --schedule zbh1 --pp 4 -m 8 -o plan.json && pipeloom run --plan plan.json\n"
            "  pipeloom run --model my-gpt2/config.json --schedule zbv --pp 2 -m 4 --verify\n"
            "  pipeloom run --model my-llama/ --weights --data train.bin --seq-len 64 --steps 20"
            "  torchrun --nproc-per-node 4 -m pipeloom run --schedule zbv --pp 4 -m 8"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--example", default=None, metavar="NAME",
                   help="built-in model to train (available: llama-tiny; default: llama-tiny); not with --model PATH")
    from ..models.families import architectures

    p.add_argument("--model", metavar="NAME|PATH", default=None,
                   help="the model to train: a built-in example name (llama-tiny), or a transformers "
                        "config.json (or a directory holding one) of a decoder-only causal LM ("
                        + ", ".join(architectures(runnable=True)) + " families; needs the 'hf' extra); built "
                        "with random weights from --seed, cut into the schedule's chunks by the layer partition")
    p.add_argument("--weights", action="store_true",
                   help="with --model PATH: load the weights from the *.safetensors files next to config.json")
    add_config_option(p)
    add_schedule_option(p, required=False,
                        help=f"schedule builder from the registry (see 'pipeloom compare'); default: "
                             f"{_DEFAULTS['schedule']}")
    p.add_argument("--plan", metavar="FILE",
                   help="run this schedule file (JSON or CSV from 'pipeloom plan', or hand-written) instead "
                        "of building one; the schedule, pp, vpp and microbatches come from the file (so "
                        "--schedule, --pp, --vpp, --microbatches, --mem-limit and the other planning options "
                        "cannot be given with it)")
    add_shape_options(p, required=False, pp_help=f"pipeline stages (default: {_DEFAULTS['pp']})",
                      m_help=f"microbatches per step (default: {_DEFAULTS['microbatches']})",
                      vpp_help="chunks per stage (default: the schedule's: 2 for interleaved and V-shape "
                               "schedules, else 1)")
    p.add_argument("--dp", type=positive_int, default=1,
                   help="data-parallel replicas; world size = pp*dp (default: %(default)s)")
    p.add_argument("--tp", type=positive_int, default=1,
                   help="tensor-parallel ranks per stage (Megatron-style column/row-parallel layers of the built-in "
                        "Llama, or of a transformers llama/mistral --model; tp must divide heads, ffn and vocab, and "
                        "kv_heads or be a multiple of it); world size = pp*dp*tp (default: %(default)s)")
    p.add_argument("--sequence-parallel", action="store_true", default=False,
                   help="with --tp > 1: norms and the activations between stages on seq_len/tp tokens per rank "
                        "(all-gather before, reduce-scatter after the tensor-parallel GEMMs; W gathers the shards again)")
    p.add_argument("--keep-gathered-input", action="store_true", default=False,
                   help="with --sequence-parallel: keep the column groups' gathered inputs from F to W, no re-gather "
                        "(more memory: 'pipeloom memory --keep-gathered-input')")
    p.add_argument("--tp-overlap", type=_tp_overlap, default="off", metavar="MODE",
                   help="with --tp > 1: what a column-parallel layer's input-gradient collective overlaps in the "
                        "backward: off; async (its own weight-gradient GEMMs, where the plan fuses B and W or a W "
                        "follows its own B); chunked:K (a split B's input gradient in K token pieces, each piece's "
                        "collective under the next piece's GEMMs); fill (queued W work of an earlier microbatch); "
                        "every mode gives bitwise the same result (default: %(default)s)")
    p.add_argument("--tp-link-delay", type=_millis, default=0.0, metavar="MS",
                   help="with --tp > 1: an emulated link for tests and benchmarks: every tensor-parallel collective "
                        "lands MS milliseconds late (a piece of a chunked one its share), waiting on a "
                        "communication thread, no CPU used (default: %(default)s)")
    p.add_argument("--steps", type=positive_int, default=3, help="optimizer steps (default: %(default)s)")
    g = p.add_argument_group("data parallel", "How the dp replicas' gradients are reduced (docs/runtime.md).")
    g.add_argument("--overlap-grad-reduce", dest="overlap_grad_reduce", action="store_true", default=False,
                   help="start each chunk's reduction asynchronously right after its last W/BW on the rank, "
                        "overlapped with the pipeline drain (off by default: not yet measured to help, see "
                        "docs/bench/dp_overlap.md)")
    g.add_argument("--no-overlap-grad-reduce", dest="overlap_grad_reduce", action="store_false",
                   help="one blocking all-reduce of all gradients after the last job (default)")
    g.add_argument("--zero", type=int, choices=[0, 1], default=0,
                   help="1: ZeRO-1: reduce-scatter the gradients, keep the AdamW states (and with --dtype bf16 the "
                        "fp32 master weights) for this rank's 1/dp shard only, all-gather the parameters (default: 0)")
    g.add_argument("--rank-order", choices=["dp-pp", "pp-dp"], default="dp-pp",
                   help="global rank -> (dp, pp): dp-pp (default: ranks 0..pp-1 are one pipeline) or pp-dp "
                        "(ranks 0..dp-1 are stage 0's replicas: with one node per stage, pp crosses nodes and "
                        "dp stays inside a node)")
    g = p.add_argument_group("planning", "The schedule is planned as 'pipeloom plan' plans it, from these options.")
    add_mem_limit_option(g, default=None, purpose="memory limit for memory-aware schedules")
    add_costs_option(g, default=None,
                     help="costs to plan with: F=..,B=..,W=..,comm=.. as in 'pipeloom plan' (default: unit costs), "
                          "or 'measured': run a first plan for a few logged steps, fit every chunk's F/B/W and "
                          "comm in ms, plan again with them (printed), then run")
    add_mem_option(g, runtime=False)  # pipeloom runs its own plans
    add_builder_options(g)
    add_partition_options(p, layers=False)
    g = p.add_argument_group("model and data")
    g.add_argument("--microbatch-size", type=positive_int, default=2, help="sequences per microbatch (default: 2)")
    g.add_argument("--seq-len", type=positive_int, default=16, help="tokens per sequence (default: 16)")
    g.add_argument("--layers", type=layers_int, default=None,
                   help="decoder layers (default: max(8, pp*vpp)); split evenly over the chunks unless the layer "
                        "partition options below choose the split (then they also cost the chunks)")
    g.add_argument("--dim", type=positive_int, default=None,
                   help="width of the example model, a multiple of 8 (default: 64)")
    g.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                   help="parameter dtype; bf16 keeps fp32 master weights and fp32 grads (default: fp32)")
    g.add_argument("--lr", type=number_type(0, unit="a learning rate"), default=1e-3, help="AdamW learning rate (default: 1e-3)")
    g.add_argument("--seed", type=int, default=0, help="weights and data seed (default: 0)")
    g.add_argument("--data", metavar="FILE", default=None,
                   help="train on this token file (token ids back to back, as nanoGPT's prepare.py writes "
                        "train.bin), sampling --seq-len tokens at seeded offsets; default: synthetic data")
    g.add_argument("--data-dtype", choices=("uint16", "uint32"), default="uint16",
                   help="integer type of the --data file (default: %(default)s)")
    g = p.add_argument_group("checking, logs and faults")
    g.add_argument("--verify", action="store_true",
                   help="also run a single-process reference of the first step and compare the loss and "
                        f"every parameter gradient (fails above {TOLERANCE['fp32']:g} in fp32)")
    g.add_argument("--log-dir", metavar="DIR", help="write per-rank job logs DIR/workerlog.<rank> (JSON lines)")
    g.add_argument("--profile-steps", metavar="A:B", default=None,
                   help="with --log-dir: log jobs of steps A..B-1 only (A alone: step A; steps count from 0; "
                        "default: every step)")
    g.add_argument("--inject-delay", type=_delay, metavar="RANK:SECONDS", default=None,
                   help="sleep SECONDS in every job on global rank RANK (makes a straggler)")
    g.add_argument("--allow-oversubscribe", action="store_true",
                   help="start the pp*dp local ranks even when this machine has too few cores or too little "
                        "memory for them (by default refused, saying what they need)")
    g.add_argument("--timeout", type=_seconds, default=120.0, metavar="SECONDS",
                   help="fail when a rank waits longer than this on a peer (default: 120)")
    g.add_argument("--calibrate", metavar="FILE", default=None,
                   help="after the run, write a calibration JSON for 'pipeloom tune --calibration FILE': achieved "
                        "FLOP/s per F/B/W from the timed jobs (steps after the first), P2P seconds per byte, the "
                        "dp all-reduce's bus bandwidth (dp > 1) and the device (docs/tune.md)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: schedule, pp, vpp, microbatches, steps, loss, step_time_s, "
                        "deferred_wgrad_share (per chunk with W jobs: share of its weight-gradient FLOPs deferred "
                        "to W; null without W jobs) (+ max_loss_diff, max_grad_diff with --verify; model, "
                        "tied_across_stages, tied_weight_diff with --model PATH)")
    p.set_defaults(func=run, _config_flags=RUN_FLAGS)


def run(args) -> int:
    from ..runtime.driver import EXAMPLES
    from ..runtime.driver import run as run_example
    from ..core.limits import check_local_ranks
    from ..runtime.launch import RankFailure, under_torchrun
    from . import CLIError

    if args.example is not None and args.model is not None and args.model != args.example:
        raise CLIError(f"--example {args.example} and --model {args.model} both name the model to train; give one")
    args.example = args.example or "llama-tiny"
    if args.example not in EXAMPLES:
        raise CLIError(f"unknown example {args.example!r}; available: {', '.join(EXAMPLES)}")
    _check_args(args)
    cfg = run_config(args)
    calib_tmp = None
    if args.calibrate:
        import dataclasses
        import tempfile

        if cfg.log_dir is None:
            if under_torchrun():  # every rank would log into a temporary folder of its own
                raise CLIError("--calibrate under torchrun needs --log-dir DIR (one folder the ranks share, read by "
                               "rank 0 after the run)")
            calib_tmp = tempfile.TemporaryDirectory(prefix="pipeloom-calibrate-")
        window = cfg.profile_steps or (f"1:{cfg.steps}" if cfg.steps > 1 else "0:1")
        cfg = dataclasses.replace(cfg, measure_links=True, log_dir=cfg.log_dir or calib_tmp.name,
                                  profile_steps=window)
    args.title = cfg.model.name if cfg.model is not None else args.example
    if not args.allow_oversubscribe and not under_torchrun():
        check_local_ranks((cfg.plan.pp if args.plan else cfg.pp) * cfg.dp * cfg.tp)
    try:
        if args.json or not sys.stderr.isatty():
            res = run_example(cfg, example=args.example)
        else:
            from rich.console import Console
            what = cfg.schedule if not args.plan else "plan " + args.plan
            with Console(stderr=True).status(f"running {what} on {(cfg.pp if not args.plan else cfg.plan.pp) * cfg.dp * cfg.tp}"
                                             f" ranks{' (measuring costs first)' if cfg.measure_costs else ''}..."):
                res = run_example(cfg, example=args.example)
    except RankFailure as e:
        raise CLIError(str(e)) from None
    if res is None:  # a non-zero rank under torchrun
        return 0
    if args.calibrate:
        _write_calibration(args, cfg, res)
        if calib_tmp is not None:
            calib_tmp.cleanup()
    tol = TOLERANCE[cfg.dtype]
    ok = not args.verify or (res["max_loss_diff"] <= tol and res["max_grad_diff"] <= tol
                             and res["max_param_diff"] <= max(tol, PARAM_TOLERANCE * args.lr)
                             and res["params_missing_grad"] == 0)
    if args.json:
        print_json({k: res[k] for k in ("schedule", "pp", "vpp", "dp", "microbatches", "steps", "loss",
                                        "step_time_s", "losses", "dtype", "zero", "overlap_grad_reduce")}
                   | ({"max_loss_diff": res["max_loss_diff"], "max_grad_diff": res["max_grad_diff"],
                       "max_param_diff": res["max_param_diff"], "verified": ok} if args.verify else {})
                   | ({"measured_costs": res["planned_costs"]} if cfg.measure_costs else {})
                   | ({"calibration_file": args.calibrate} if args.calibrate else {})
                   | ({k: res[k] for k in ("tp", "sequence_parallel", "keep_gathered_input", "tp_overlap", "tp_link_delay_ms",
                                           "tp_comm_wait_s")} if res.get("tp", 1) > 1 else {})
                   | {k: res[k] for k in ("model", "tied_across_stages", "tied_weight_diff", "deferred_wgrad_share")
                      if k in res})
    else:
        _print_table(res, args, tol, ok, measured=cfg.measure_costs)
    return 0 if ok else 1


def _write_calibration(args, cfg, res: dict) -> None:
    """The calibration file of ``--calibrate`` (:func:`pipeloom.tune.measured.calibration_from_run`)."""
    import json

    from ..core.files import write_text
    from ..runtime.driver import model_config
    from ..trace.reader import read_logs
    from ..tune.measured import calibration_from_run, tp_wait_per_chunk_pass
    from . import CLIError

    nc = len(res["layers_per_chunk"])
    if cfg.model is None:
        model = model_config(cfg, nc)
    else:
        from ..models.hf_config import resolve_model
        model = resolve_model(args.model)
    what = (f"{model.name} {res['schedule']} pp={res['pp']} vpp={res['vpp']} dp={res['dp']} "
            f"m={res['microbatches']} mbs={cfg.microbatch_size} seq={cfg.seq_len} {cfg.dtype}"
            + (f" tp={cfg.tp}{' sp' if cfg.sequence_parallel else ''} tp-overlap={cfg.tp_overlap}" if cfg.tp > 1 else ""))
    tp = {} if cfg.tp == 1 else dict(  # one TP rank's FLOPs; the TP collectives' wait recorded apart
        tp=cfg.tp, tp_wait=tp_wait_per_chunk_pass(cfg.log_dir, nc),
        tp_info={"sequence_parallel": cfg.sequence_parallel, "overlap": cfg.tp_overlap,
                 "link_delay_ms": cfg.tp_link_delay_ms, "wait_seconds_per_step": res.get("tp_comm_wait_s")})
    try:
        data = calibration_from_run(read_logs(cfg.log_dir), model, microbatch_size=cfg.microbatch_size,
                                    seq_len=cfg.seq_len, dtype=cfg.dtype, layers_per_chunk=res["layers_per_chunk"],
                                    device=res["device"], dp_allreduce=res.get("dp_allreduce"), what=what, **tp)
    except ValueError as e:
        raise CLIError(f"--calibrate {args.calibrate}: {e}") from None
    try:  # whole or not at all (writability was checked before the run)
        write_text(args.calibrate, json.dumps(data, indent=1, allow_nan=False) + "\n")
    except OSError as e:
        raise CLIError(f"--calibrate {args.calibrate}: cannot write it ({e.strerror})") from None
    except ValueError as e:  # a measured figure that is not finite: no file rather than a non-JSON one
        raise CLIError(f"--calibrate {args.calibrate}: the measured figures are not finite ({e})") from None
    res["calibration_file"] = args.calibrate


def _is_measured(args) -> bool:
    return args.costs is not None and args.costs.strip().lower() == "measured"


def run_config(args):
    """The :class:`~pipeloom.runtime.driver.RunConfig` of the run options: the schedule's PlanSpec made as
    'pipeloom plan' makes it (costs, memory, -O, layer partition), nothing planned yet."""
    from ..runtime.driver import RunConfig

    sched = schedule_io.load(args.plan) if args.plan else None
    model = _model(args, pp=sched.pp if sched is not None else args.pp or _DEFAULTS["pp"])
    common = dict(dp=args.dp, tp=args.tp, sequence_parallel=args.sequence_parallel, steps=args.steps, microbatch_size=args.microbatch_size, seq_len=args.seq_len,
                  dim=args.dim or 64, seed=args.seed, lr=args.lr, verify=args.verify, log_dir=args.log_dir,
                  profile_steps=args.profile_steps, inject_delay=args.inject_delay, timeout_s=args.timeout,
                  dtype=args.dtype, model=model, data=args.data, data_dtype=args.data_dtype,
                  overlap_grad_reduce=args.overlap_grad_reduce, zero=args.zero, rank_order=args.rank_order,
                  tp_overlap=args.tp_overlap, tp_link_delay_ms=args.tp_link_delay,
                  keep_gathered_input=args.keep_gathered_input)
    if sched is not None:
        split = getattr(args, "layers_per_chunk", None)  # the layer split of the plan (e.g. the tuner's)
        if split:
            from ..partition.layout import parse_counts
            split = tuple(parse_counts(split))
        return RunConfig(plan=sched, pp=sched.pp, microbatches=sched.microbatches, n_layers=args.layers,
                         layers_per_chunk=split, **common)
    schedule = args.schedule or _DEFAULTS["schedule"]
    from ..partition.layout import parse_counts
    from ..schedule import registry

    registry.get(schedule)
    pp = args.pp or _DEFAULTS["pp"]
    m = args.microbatches or _DEFAULTS["microbatches"]
    vpp = args.vpp or registry.default_vpp(schedule)
    measured = _is_measured(args)
    layers = args.layers if args.layers is not None else model.layers if model is not None else \
        sum(parse_counts(args.layers_per_chunk)) if getattr(args, "layers_per_chunk", None) else max(8, pp * vpp)
    if model is not None and partition_given(args) and args.vocab is None and args.hidden is None:
        # the model costs its own layers and head, as 'plan --model' does (models.hf_config.resolve_model)
        args = argparse.Namespace(**vars(args))
        args._partition_model = True
        args.seq = args.seq or args.seq_len
    spec, pplan = plan_inputs(args, schedule, pp=pp, microbatches=m, vpp=vpp,
                              costs="" if measured else args.costs, layers=layers)
    return RunConfig(schedule=schedule, pp=pp, vpp=vpp, microbatches=m, spec=spec, n_layers=args.layers,
                     layers_per_chunk=tuple(pplan.partition.seg_layer_num) if pplan is not None else None,
                     measure_costs=measured, **common)


def _model(args, pp: int):
    """None for the built-in example, or the transformers model of ``--model PATH``."""
    from ..runtime.driver import EXAMPLES
    from . import CLIError

    if args.model is None or args.model in EXAMPLES:
        if args.model is not None:
            args.example = args.model
        if args.weights:
            raise CLIError("--weights loads a transformers checkpoint: give --model PATH (a config.json or its "
                           "directory with *.safetensors files); the example model has seeded weights")
        return None
    if args.dim is not None:
        raise CLIError(f"--dim sets the example model's width; --model {args.model} has its own (drop --dim)")
    from ..models.hf_config import resolve_model

    # pipeloom's own reader first: a config it refuses (or one too big for this machine) never reaches the ranks
    mc = resolve_model(args.model)
    from ..runtime.launch import under_torchrun

    if not args.allow_oversubscribe and not under_torchrun():
        check_model_memory(mc, pp=pp, dp=args.dp, verify=args.verify, model_flag=f"--model {args.model}")
    try:
        from ..integrations.hf import HFRunModel
    except ImportError as e:
        raise CLIError(f"--model {args.model}: needs transformers (pip install 'pipeloom[hf]'): {e}") from None
    return HFRunModel(args.model, weights=args.weights)


#: bytes per parameter a rank of ``run --model`` holds: every rank builds the whole model in fp32 (4 bytes a
#: parameter); the parameters of its own chunks then get a gradient (4) and Adam's two moments (8)
BUILD_BYTES_PER_PARAM = 4
TRAIN_BYTES_PER_PARAM = 12


def check_model_memory(model, *, pp: int, dp: int, verify: bool = False, model_flag: str = "--model",
                       available: int | None = None) -> int:
    """Refuse, before any rank starts, a ``--model`` whose ranks cannot fit in this machine's memory; returns the
    estimate in bytes. A lower bound from the analytic parameter count (:mod:`pipeloom.models.flops`): pp x dp
    ranks each build the whole model (:data:`BUILD_BYTES_PER_PARAM`), each data-parallel replica trains it
    (:data:`TRAIN_BYTES_PER_PARAM`), and ``--verify`` builds and trains one more copy. The error gives the
    estimate, the memory available and the layers of this width that would fit."""
    from ..core.limits import machine_capacity
    from ..models.flops import embedding_params, head_params, layer_params, total_params
    from . import CLIError

    if available is None:
        available = machine_capacity()[1]
    total = total_params(model)
    copies_built = pp * dp + (1 if verify else 0)
    copies_trained = dp + (1 if verify else 0)
    per_param = copies_built * BUILD_BYTES_PER_PARAM + copies_trained * TRAIN_BYTES_PER_PARAM
    need = total * per_param
    if available is None or need <= available:
        return need
    fixed = embedding_params(model) + head_params(model, with_tied_copy=False)
    fit = int((available / per_param - fixed) // max(1, layer_params(model)))
    fits = (f"at most {fit} of its layers fit (it has {model.layers})" if fit >= 1 else
            "not even one layer of this width fits")
    raise CLIError(f"{model_flag}: {model.name} has {total / 1e9:.3g} B parameters; {pp * dp} ranks building it "
                   f"need about {need / 2**30:,.1f} GiB here ({BUILD_BYTES_PER_PARAM} bytes per parameter for each "
                   f"rank's copy, {TRAIN_BYTES_PER_PARAM} more per data-parallel replica for gradients and Adam) but "
                   f"{available / 2**30:,.1f} GiB is available: {fits}; use a smaller config (num_hidden_layers, "
                   f"hidden_size), fewer ranks, torchrun on machines with more memory, or --allow-oversubscribe")


def _check_args(args) -> None:
    """Catch option mistakes before any process starts."""
    import os

    from . import CLIError

    if args.plan:
        given = [flag for flag, v in (("--schedule", args.schedule), ("--pp", args.pp),
                                      ("--microbatches", args.microbatches), ("--vpp", args.vpp),
                                      ("--mem-limit", args.mem_limit), ("--costs", args.costs), ("--mem", args.mem),
                                      ("--option", args.option or None),
                                      ("--layers-per-device", args.layers_per_device),
                                      ("--layer-costs", args.layer_costs), ("--balance", args.balance),
                                      ("--vocab", args.vocab), ("--hidden", args.hidden), ("--seq", args.seq))
                 if v is not None]
        if given:
            raise CLIError(f"--plan {args.plan} fixes the schedule, pp, vpp and microbatches; drop "
                           f"{', '.join(given)} (or drop --plan and build the schedule from the options)")
    if args.calibrate is not None:
        folder = os.path.dirname(os.path.abspath(args.calibrate))
        if os.path.isdir(args.calibrate) or not os.path.isdir(folder):
            raise CLIError(f"--calibrate {args.calibrate}: give a file path in an existing folder (the calibration "
                           f"JSON is written there after the run)")
    if args.data is not None and os.path.exists(args.data):  # a regular file (not a FIFO, device or folder)
        from ..core.files import check_input

        check_input(args.data, "token data")
    if args.log_dir is not None and os.path.exists(args.log_dir) and not os.path.isdir(args.log_dir):
        raise CLIError(f"--log-dir {args.log_dir}: is a file; give a directory (created when missing)")
    # --profile-steps windows that log nothing are RunConfig's check (the API gets it too)


def _print_table(res: dict, args, tol: float, ok: bool, *, measured: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"pipeloom run: {getattr(args, 'title', args.example)}, schedule {res['schedule']}",
              show_header=True)
    t.add_column("field")
    t.add_column("value", justify="right")
    if res.get("tp", 1) > 1:
        t.add_row("pp x vpp x dp x tp", f"{res['pp']} x {res['vpp']} x {res['dp']} x {res['tp']}"
                  + ((" (sequence parallel, inputs kept for W)" if res.get("keep_gathered_input") else
                      " (sequence parallel, inputs re-gathered in W)") if res.get("sequence_parallel") else ""))
        t.add_row("tp overlap", res["tp_overlap"] + (f" (emulated link: {res['tp_link_delay_ms']:g} ms per collective)"
                                                      if res["tp_link_delay_ms"] else ""))
        t.add_row("tp collectives waited (s/step)", fmt(res["tp_comm_wait_s"]))
    else:
        t.add_row("pp x vpp x dp", f"{res['pp']} x {res['vpp']} x {res['dp']}")
    t.add_row("microbatches", str(res["microbatches"]))
    t.add_row("dtype", res["dtype"])
    if res["dp"] > 1:
        t.add_row("dp gradient reduction", ("ZeRO-1 reduce-scatter" if res["zero"] else "all-reduce")
                  + (", overlapped per chunk" if res["overlap_grad_reduce"] else ", after the step"))
    if measured:
        c = res["planned_costs"]
        t.add_row("measured costs (ms/chunk)", f"F={_ms(c['F'])} B={_ms(c['B'])} W={_ms(c['W'])} comm={c['comm']:.3g}")
    t.add_row("steps", str(res["steps"]))
    t.add_row("loss per step", " ".join(f"{x:.4f}" for x in res["losses"]))
    t.add_row("step time (median, s)", fmt(res["step_time_s"]))
    if args.verify:
        t.add_row("max |loss - reference|", fmt(res["max_loss_diff"], 3))
        t.add_row("max |grad - reference|", fmt(res["max_grad_diff"], 3))
        t.add_row("max |param - reference| after step 1", fmt(res["max_param_diff"], 3))
        t.add_row("verify", ("[green]PASS[/]" if ok else "[red]FAIL[/]") + f" (tolerance {tol:g})")
    if res.get("tied_across_stages"):
        t.add_row("tied weights across stages", f"{res['tied_across_stages']} (max copy difference "
                                                 f"{fmt(res['tied_weight_diff'], 3)})")
    if res.get("deferred_wgrad_share"):
        t.add_row("weight-grad FLOPs deferred to W", " ".join(
            f"c{k}:{'-' if v is None else f'{100 * v:.0f}%'}" for k, v in res["deferred_wgrad_share"].items()))
    if args.log_dir:
        t.add_row("job logs", f"{args.log_dir}/workerlog.<rank>")
    if getattr(args, "calibrate", None):
        t.add_row("calibration (for pipeloom tune)", args.calibrate)
    print_table(Console(), t)


def _ms(v) -> str:
    return ":".join(f"{x:.3g}" for x in v) if isinstance(v, (list, tuple)) else f"{v:.3g}"
