"""pipeloom tune: which tp, pp, vpp, dp, micro-batch, schedule, memory limit and recompute to run, and does it fit."""
from __future__ import annotations

import argparse
import re
import textwrap

from ..core.limits import MAX_GPUS, MAX_PP, MAX_SEQ, MAX_TOP, MAX_TUNE_LAYERS, MAX_VPP, MAX_WORKERS, check_at_most
from .common import add_mem_limit_option, capped_int, number_type, positive_int, print_json, print_table

GiB = 1024 ** 3


def add_parser(sub) -> None:
    from ..tune.gpus import GPUS
    # the defaults of pipeloom.tune.space (DEFAULT_ZERO, DEFAULT_PARTITIONS): not imported, building the
    # parser loads no memory model

    p = sub.add_parser(
        "tune", help="search tp/pp/vpp/dp, micro-batch, schedule, memory limit, recompute, ZeRO level for a model on N GPUs",
        description=textwrap.fill(
            "Search the parallel configuration of a training run: tensor parallel (inside a node), pipeline, "
            "virtual stages, data parallel, micro-batch size and count, every registered schedule family "
            "(zero-bubble and V-shapes included), memory limit, recompute, ZeRO level and the layer partition. Time "
            "comes from the model's FLOPs at peak x efficiency plus TP, pipeline and DP communication and the "
            "optimizer step, simulated under the actual schedule; memory from the analytic estimator under the "
            "same schedule. Configurations are pruned by a memory lower bound and a step-time lower bound "
            "before any simulation. See docs/tune.md.", 100),
        epilog="examples:\n"
               "  pipeloom tune --model llama2-7b --gpus 64 --gpu h100 --global-batch 512\n"
               "  pipeloom tune --model llama2-70b --gpus 1024 --global-batch 1024 --schedules 1f1b,interleaved\n"
               "  pipeloom tune --model config.json --gpus 16 --gpu-flops 400e12 --gpu-memory 96GiB --global-batch 64 "
               "--out plan/",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, metavar="PRESET|config.json",
                   help="model preset (as 'pipeloom memory --model') or a Hugging Face config.json")
    p.add_argument("--gpus", type=capped_int(1, MAX_GPUS), required=True, help="number of GPUs (whole nodes)")
    p.add_argument("--gpus-per-node", type=positive_int, default=None, help="GPUs per node (default: 8)")
    p.add_argument("--gpu", default="h100", metavar="NAME",
                   help=f"GPU preset: {', '.join(GPUS)} (default: %(default)s)")
    p.add_argument("--gpu-flops", type=number_type(0, unit="FLOP/s"), default=None, metavar="FLOPS",
                   help="peak dense BF16 FLOP/s per GPU, e.g. 989e12 (replaces the preset's)")
    p.add_argument("--gpu-memory", default=None, metavar="SIZE", help="memory per GPU, e.g. 80GiB (replaces the preset's)")
    p.add_argument("--global-batch", type=positive_int, required=True, metavar="SEQS",
                   help="sequences per optimizer step (= dp x micro-batch size x microbatches)")
    p.add_argument("--seq", type=capped_int(1, MAX_SEQ), default=None,
                   help="training sequence length (default: the model's context up to 8192; a longer context "
                        "(max_position_embeddings) gives 8192 and a warning on stderr)")
    g = p.add_argument_group("links (defaults from the GPU preset)")
    g.add_argument("--intra-bw", type=number_type(0, unit="bytes/s"), default=None, metavar="B/S",
                   help="bus bandwidth per GPU inside a node (bytes/s)")
    g.add_argument("--intra-latency", type=number_type(0, unit="seconds"), default=None, metavar="S",
                   help="latency per message inside a node (s)")
    g.add_argument("--inter-bw", type=number_type(0, unit="bytes/s"), default=None, metavar="B/S",
                   help="bandwidth per GPU between nodes (bytes/s)")
    g.add_argument("--inter-latency", type=number_type(0, unit="seconds"), default=None, metavar="S",
                   help="latency per message between nodes (s)")
    g.add_argument("--efficiency", type=number_type(0, 1), default=None,
                   help="fraction of peak FLOP/s the layers reach (default 0.5, or the calibration file's)")
    g.add_argument("--efficiency-half-hidden", type=number_type(0), default=None, metavar="H",
                   help="hidden size at which a layer reaches half the efficiency: the efficiency becomes "
                        "efficiency x hidden / (hidden + H), the share of a layer's non-GEMM work (default 0: one "
                        "efficiency, or the calibration file's efficiency_half_hidden)")
    g.add_argument("--calibration", default=None, metavar="FILE",
                   help="JSON with efficiency and link figures (format in docs/tune.md)")
    o = p.add_argument_group("communication overlap (modelled in docs/tune.md)")
    o.add_argument("--tp-overlap", default="async", metavar="MODE",
                   help="how TP collectives overlap compute: off, async (Megatron's: the input-gradient reduce-scatter "
                        "behind the weight-gradient GEMMs of a fused backward), chunked:K (micro-pipelined dgrad), fill "
                        "(a split B runs earlier W work meanwhile) (default: %(default)s)")
    o.add_argument("--tp-comm-overlap", action="store_true",
                   help="Megatron's --tp-comm-overlap (TransformerEngine userbuffers): forward collectives overlap the GEMMs too")
    o.add_argument("--dp-bucket-size", type=positive_int, default=None, metavar="PARAMS",
                   help="parameters per DP gradient bucket, reduced during the backward (default: Megatron's "
                        "max(40M, 1M x dp))")
    s = p.add_argument_group("search limits")
    s.add_argument("--max-tp", type=positive_int, default=None, help="largest tensor-parallel degree")
    s.add_argument("--tp", type=positive_int, default=None, help="fix the tensor-parallel degree (default: search)")
    s.add_argument("--pp", type=capped_int(1, MAX_PP), default=None, help="fix the pipeline degree (default: search)")
    s.add_argument("--max-pp", type=capped_int(1, MAX_PP), default=None, help="largest pipeline degree")
    s.add_argument("--vpp", type=capped_int(1, MAX_VPP), default=None,
                   help="fix the chunks per device (default: search up to --max-vpp); vpp > 1 needs pp > 1")
    s.add_argument("--dp", type=positive_int, default=None,
                   help="fix the data-parallel degree (default: GPUs / (tp x pp) for every tp and pp searched)")
    s.add_argument("--microbatch-size", type=positive_int, default=None, metavar="SEQS",
                   help="fix the micro-batch size (default: search every divisor up to --max-microbatch-size)")
    s.add_argument("--max-vpp", type=capped_int(1, MAX_VPP), default=4, help="largest number of chunks per device (default: 4)")
    s.add_argument("--max-microbatch-size", type=positive_int, default=8,
                   help="largest micro-batch size in sequences (default: 8)")
    s.add_argument("--schedules", default=None, metavar="A,B",
                   help="schedule builders to consider (default: every registered one but optimal)")
    s.add_argument("--recompute", default="none,selective,full", metavar="MODES",
                   help="recompute modes to consider: none, selective (attention core only), full (layer inputs "
                        "only); one value pins it (default: %(default)s)")
    s.add_argument("--partitions", default="uniform,balanced,ends", metavar="WAYS",
                   help="layer partitions to consider: uniform (even, extras on the first chunks), balanced (by "
                        "cost, the head's time counted), ends (the embedding and the loss each take one layer's "
                        "place, as Llama 3 trims its first and last stage) (default: %(default)s)")
    s.add_argument("--zero", default="0,1,2", metavar="LEVELS",
                   help="ZeRO levels to consider, comma-separated: 0 = nothing sharded; 1 = the optimizer states "
                        "(fp32 master weights, Adam m and v) sharded over dp; 2 = the gradients too; 3 = the "
                        "parameters too (FSDP). A level > 0 is tried only where dp > 1 (default: %(default)s; 3 on "
                        "request: it costs the search time again and did not lead the searches of docs/tune.md)")
    add_mem_limit_option(s, default=None, bytes_ok=True,
                         purpose="plan every memory-aware schedule under this limit (Xp for each configuration's pp; "
                                 "a size in bytes through each configuration's memory estimate) instead of searching "
                                 "its default limit and the GPU's room")
    s.add_argument("--reserve", default="2GiB", metavar="SIZE",
                   help="memory kept aside per GPU (CUDA context, allocator) (default: %(default)s)")
    s.add_argument("--top", type=capped_int(1, MAX_TOP), default=5, help="configurations to rank (default: %(default)s)")
    s.add_argument("--workers", type=capped_int(1, MAX_WORKERS), default=None,
                   help="processes that build schedules (default: one per core, at most 2; the result is the same)")
    e = p.add_argument_group("mixture of experts, long context, FP8 (docs/moe.md)")
    e.add_argument("--ep", type=positive_int, default=None,
                   help="fix the expert-parallel degree (default: search every ep dividing the experts and dp*cp)")
    e.add_argument("--max-ep", type=positive_int, default=None, help="largest expert-parallel degree to search")
    e.add_argument("--cp", type=positive_int, default=None, help="fix the context-parallel degree (default: search "
                   "up to --max-cp)")
    e.add_argument("--max-cp", type=positive_int, default=1, help="largest context-parallel degree (default: 1)")
    e.add_argument("--capacity-factor", type=number_type(0), default=None, metavar="X",
                   help="expert capacity over the mean load (default: dropless)")
    e.add_argument("--moe-imbalance", type=number_type(1), default=1.0, metavar="X",
                   help="dropless: the busiest rank's expert load over the mean (default: 1, balanced)")
    e.add_argument("--route-nodes", type=positive_int, default=None, metavar="N",
                   help="node-limited routing: each token to at most N nodes (DeepSeek-V3: 4; default: unlimited)")
    e.add_argument("--recompute-norms", action="store_true",
                   help="recompute RMSNorm outputs and MLA up-projections in backward (DeepSeek-V3)")
    e.add_argument("--pair-fb", action="store_true",
                   help="pair an F with a B of another microbatch in schedules that do not pair by themselves "
                        "(hides the expert all-to-all: Megatron-Core's combined 1F1B; dualpipev pairs anyway)")
    e.add_argument("--precision", choices=["bf16", "fp8"], default="bf16",
                   help="GEMM precision: fp8 runs the weight GEMMs at twice the rate with quantisation traffic "
                        "and caches their inputs in FP8 (default: %(default)s)")
    p.add_argument("--explain", action="store_true", help="print every number the cost model used for the best one")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write the best plan into DIR: plan.json, plan.torch.csv, plan.gantt.png, pipeloom_torchtitan.py "
                        "(torchtitan 0.3 config), torchtitan_args.txt, megatron_args.txt, launch.json and pipeloom.toml "
                        "(for 'pipeloom run --config' and 'pipeloom plan --config'); these files are replaced, nothing "
                        "else in DIR is touched")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object {configs, searched, pruned, ...}")
    from .config_opts import TUNE_FLAGS, add_config_option

    add_config_option(p)  # [tune] model, gpus, gpu, global_batch, seq: e.g. the pipeloom.toml of an earlier --out
    for a in p._actions:  # required unless a --config file gives them (checked in run)
        if a.dest in ("model", "gpus", "global_batch"):
            a.required = False
    p.set_defaults(func=run, _config_flags=TUNE_FLAGS)


def _csv(text: str, flag: str, allowed=None, conv=str) -> tuple:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ValueError(f"{flag} {text!r}: give at least one value")
    out = []
    for x in items:
        try:
            v = conv(x)
        except ValueError:
            raise ValueError(f"{flag} {text!r}: {x!r} is not allowed; allowed: {', '.join(map(str, allowed))}") from None
        if allowed is not None and v not in allowed:
            raise ValueError(f"{flag} {text!r}: {x!r} is not allowed; allowed: {', '.join(map(str, allowed))}")
        out.append(v)
    return tuple(dict.fromkeys(out))


def problem_from_args(args):
    import dataclasses

    from ..core.costs import parse_size
    from ..schedule import registry
    from ..tune import Calibration, Problem, gpu_preset, with_overrides
    from ..tune.search import PARTITIONS, RECOMPUTES

    from ..tune.gpus import check_figure

    for flag, value, kind in (("--gpu-flops", args.gpu_flops, "flops"), ("--intra-bw", args.intra_bw, "bandwidth"),
                              ("--inter-bw", args.inter_bw, "bandwidth"), ("--intra-latency", args.intra_latency,
                                                                           "latency"),
                              ("--inter-latency", args.inter_latency, "latency"),
                              ("--efficiency", args.efficiency, "efficiency")):
        if value is not None:
            check_figure(flag, value, kind)
    from ..tune.gpus import divisors

    if args.vpp is not None and args.vpp > 1 and args.pp == 1:
        raise ValueError(f"--vpp {args.vpp} with --pp 1: virtual stages need a pipeline; give --pp > 1 or --vpp 1")
    for flag, v in (("--pp", args.pp), ("--tp", args.tp), ("--dp", args.dp)):  # tp * pp * dp = GPUs: a degree must divide them
        if v is not None and args.gpus % v:
            ds = divisors(args.gpus)
            shown = ", ".join(map(str, ds[:16])) + (", ..." if len(ds) > 16 else "")
            raise ValueError(f"{flag} {v} does not divide --gpus {args.gpus} (tp x pp x dp = GPUs); give {flag} "
                             f"among {shown}, or more GPUs")
    model = _resolve_model(args.model)
    check_at_most(f"--model {args.model}: the layers tune searches", model.layers, MAX_TUNE_LAYERS,
                  "a smaller num_hidden_layers ('simulate'/'memory --model' take up to the general layer cap)")
    gpu = gpu_preset(args.gpu)
    gpu = with_overrides(gpu, peak_flops=args.gpu_flops,
                         memory=(parse_size(args.gpu_memory, what="--gpu-memory", zero_ok=False)
                                 if args.gpu_memory is not None else None),
                         gpus_per_node=args.gpus_per_node, intra_bandwidth=args.intra_bw,
                         intra_latency=args.intra_latency, inter_bandwidth=args.inter_bw,
                         inter_latency=args.inter_latency)
    cal = Calibration.load(args.calibration) if args.calibration else Calibration()
    # a measured calibration (pipeloom run --calibrate): an efficiency of this GPU's peak, or another
    # device's FLOP/s in place of the peak (Calibration.resolve says which; --explain prints it)
    cal, gpu = cal.resolve(gpu)
    if args.efficiency is not None:
        if args.efficiency <= 0:
            raise ValueError("--efficiency must be > 0 (a fraction of peak FLOP/s, e.g. 0.5)")
        cal = dataclasses.replace(cal, efficiency=args.efficiency, source=cal.source + " + --efficiency")
    if args.efficiency_half_hidden is not None:
        cal = dataclasses.replace(cal, efficiency_half_hidden=float(args.efficiency_half_hidden),
                                  source=cal.source + " + --efficiency-half-hidden")
    gpu = cal.apply(gpu)
    # the command-line link figures win over the calibration file's
    gpu = with_overrides(gpu, intra_bandwidth=args.intra_bw, intra_latency=args.intra_latency,
                         inter_bandwidth=args.inter_bw, inter_latency=args.inter_latency)
    cal = dataclasses.replace(cal, intra=None, inter=None, hbm_bandwidth=None)  # now in the GPU's figures
    schedules = None
    if args.schedules:
        schedules = _csv(args.schedules, "--schedules", registry.names())
    reserve = parse_size(args.reserve, what="--reserve")
    if reserve >= gpu.memory:
        raise ValueError(f"--reserve {args.reserve} is not below the GPU memory ({gpu.memory / GiB:.1f} GiB)")
    import sys

    from ..memory.analytic import training_seq

    seq, warning = training_seq(model, args.seq)
    if warning:
        print(f"pipeloom: warning: {warning}", file=sys.stderr)
    return Problem(model=model, gpus=args.gpus, gpu=gpu, global_batch=args.global_batch, seq=seq,
                   calibration=cal, max_tp=args.max_tp, max_pp=args.max_pp, tp=args.tp, pp=args.pp,
                   schedules=schedules,
                   recompute=_csv(args.recompute, "--recompute", RECOMPUTES),
                   zero=_csv(args.zero, "--zero", (0, 1, 2, 3), int), reserve=reserve, top=args.top, mem_limit=args.mem_limit,
                   vpp=args.vpp, dp=args.dp, partitions=_csv(args.partitions, "--partitions", PARTITIONS),
                   microbatch_sizes=None if args.microbatch_size is None else (args.microbatch_size,),
                   max_microbatch_size=max(args.max_microbatch_size, args.microbatch_size or 1),
                   max_vpp=max(args.max_vpp, args.vpp or 1),
                   tp_overlap=args.tp_overlap, tp_comm_overlap=args.tp_comm_overlap, dp_bucket_params=args.dp_bucket_size,
                   **_moe_fields(args, model))


def _moe_fields(args, model) -> dict:
    """The Problem's expert / context parallel and FP8 fields; a pin that cannot work is one line."""
    if args.ep is not None and args.ep > 1 and not model.moe:
        raise ValueError(f"--ep {args.ep}: {model.name} is not a mixture-of-experts model (ep must be 1)")
    if args.ep is not None and model.moe and model.experts % args.ep:
        raise ValueError(f"--ep {args.ep} does not divide the {model.experts} routed experts of {model.name}")
    if args.cp is not None and args.gpus % args.cp:
        raise ValueError(f"--cp {args.cp} does not divide --gpus {args.gpus}")
    return dict(ep=args.ep, max_ep=args.max_ep, cp=args.cp, max_cp=args.max_cp,
                capacity_factor=args.capacity_factor, moe_imbalance=args.moe_imbalance, fp8=args.precision == "fp8",
                route_nodes=args.route_nodes, recompute_norms=args.recompute_norms,
                pair_fb=getattr(args, "pair_fb", False))


def _resolve_model(spec: str):
    try:
        from ..models.hf_config import resolve_model
    except ImportError:
        from ..models.presets import preset

        if spec.lower().endswith(".json"):
            raise ValueError(f"--model {spec!r}: reading Hugging Face config.json files needs "
                             f"pipeloom.models.hf_config, not in this build; give a preset") from None
        return preset(spec)
    return resolve_model(spec)


def run(args) -> int:
    from ..tune import tune

    missing = [f for f, v in (("--model", args.model), ("--gpus", args.gpus), ("--global-batch", args.global_batch))
               if v is None]
    if missing:
        raise ValueError(f"tune needs {', '.join(missing)} (or a --config FILE whose [tune] section sets "
                         f"{', '.join(m.lstrip('-').replace('-', '_') for m in missing)})")

    prob = problem_from_args(args)
    if args.out is not None:
        import os

        if os.path.exists(args.out) and not os.path.isdir(args.out):
            raise ValueError(f"--out {args.out!r} is a file; give a directory")
    try:
        if args.json:
            res = tune(prob, workers=args.workers)
        else:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            with Progress(TextColumn("simulating configurations"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), transient=True) as bar:
                task = bar.add_task("tune", total=None)
                res = tune(prob, progress=lambda i, n: bar.update(task, completed=i, total=n), workers=args.workers)
    except ValueError as e:  # the cost model's internal fields (F, B, W, comm) are not what the user gave
        if not re.match(r"(F|B|W|comm|overlap)\b", str(e)):
            raise
        raise ValueError(f"the figures give job times the cost model cannot use ({str(e).splitlines()[0]}): check "
                         f"--gpu-flops, --efficiency, --seq, --intra-bw/--inter-bw, --intra-latency/--inter-latency "
                         f"and the --calibration file's efficiency, achieved_flops and link figures") from None
    written, before, titan = [], [], []
    if args.out is not None:
        from ..tune.launch import replaced, write_plan

        # only the files write_plan names are written; what else is in the folder stays as it is
        before = replaced(args.out)
        written = write_plan(res, args.out)
        from ..tune.settings import write_config
        from .config_opts import TUNE_QUESTION

        # the whole question, so that 'tune --config DIR/pipeloom.toml' asks it again
        asked = {f: getattr(args, d) for d, f in TUNE_QUESTION.items()
                 if f not in ("model", "gpus", "gpu", "global_batch", "seq") and hasattr(args, d)}
        if asked.get("calibration"):
            asked["calibration"] = os.path.abspath(asked["calibration"])
        written.append(write_config(res, args.out, model_path=args.model, asked=asked))
        titan = _titan_line(args.out)
    if args.json:
        out = res.to_dict()
        out["configs"] = out["configs"][:prob.top]  # the ranking --top asks for, as the table shows
        if args.explain:
            out["explain"] = res.explain
        if written:
            out["written"] = written
            out["replaced"] = [p for p in written if p in before]
            out["launch_notes"] = titan
        print_json(out)
        return 0
    _print(res, args.explain, written, set(before), titan)
    return 0


def _titan_line(out_dir: str) -> list[str]:
    """What the torchtitan and Megatron files do differently from the plan (and why torchtitan got none, if so)."""
    import json
    import os

    with open(os.path.join(out_dir, "launch.json"), encoding="utf-8") as fh:
        launch = json.load(fh)
    t = launch["torchtitan"]
    out = [f"torchtitan: {t['command']}"] if t["unsupported"] is None else [f"no torchtitan config: {t['unsupported']}"]
    out += [f"torchtitan: {n}" for n in t["notes"]]
    return out + ([f"megatron: {launch['megatron_note']}"] if launch["megatron_note"] else [])


def _print(res, explain: bool, written: list[str], before: set = frozenset(), titan: list = ()) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    p = res.problem
    con = Console()
    con.width = max(con.width, 160)  # the ranking is wide; never squeeze it into 80 columns
    t = Table(title=f"{p.model.name} on {p.gpus} x {p.gpu.name}, global batch {p.global_batch} x {p.seq} tokens "
                    f"(efficiency {p.calibration.efficiency:g})",
              box=box.SIMPLE_HEAD, caption="step = simulated pipeline + exposed DP comm + optimizer; peak = the "
                                           "fullest device; headroom = GPU - reserve - peak")
    extra = ((["ep"] if getattr(p.model, "moe", False) else [])
             + (["cp"] if getattr(p, "cp", None) not in (None, 1) or getattr(p, "max_cp", 1) > 1 else []))
    for c in ("#", "tp", "pp", "vpp", "dp", *extra, "mbs", "m", "schedule", "limit", "recomp", "zero", "split",
              "tokens/s", "MFU", "step s", "bubble", "exp. comm s", "peak GiB", "headroom", "fits"):
        t.add_column(c, justify="left" if c in ("schedule", "recomp", "split") else "right", no_wrap=True)
    ranked = [c for c in res.configs if c.fits][:p.top]
    for i, c in enumerate(ranked):
        t.add_row(str(i + 1), str(c.tp), str(c.pp), str(c.vpp), str(c.dp), *[str(getattr(c, x)) for x in extra],
                  str(c.microbatch_size),
                  str(c.microbatches), c.schedule, "-" if c.mem_limit is None else f"{c.mem_limit:.3g}",
                  c.recompute, str(c.zero), c.partition[:4], f"{c.tokens_per_s:,.0f}", f"{c.mfu * 100:.1f}%",
                  f"{c.step_time_s:.3f}", f"{c.bubble * 100:.1f}%", f"{c.exposed_comm_s:.3f}",
                  f"{c.peak_bytes / GiB:.1f}", f"{(p.gpu.memory - p.reserve - c.peak_bytes) / GiB:.1f}", "yes")
    print_table(con, t)
    con.print(f"searched {res.searched} configurations, simulated {res.simulations} "
              f"({res.cache_hits} cache hits) in {res.seconds:.1f} s")
    pr = Table(title="pruned", box=box.SIMPLE_HEAD)
    pr.add_column("reason")
    pr.add_column("count", justify="right")
    for k, v in sorted(res.pruned.items(), key=lambda kv: -kv[1]):
        pr.add_row(k, str(v))
    print_table(con, pr)
    best = res.best
    if best is not None and best.pp > 1:
        from ..integrations.megatron import split_args

        # the split as the Megatron arguments tune --out writes it (a V plan: the same chunks, looped)
        split, _ = split_args(best.seg_layer_num, best.pp)
        if split:
            con.print(f"best: Megatron-LM split {' '.join(split)}", highlight=False, soft_wrap=True)
    if explain and res.explain:
        con.print("[bold]cost model of the best configuration[/bold]")
        _print_tree(con, res.explain, "")
    for w in written:
        con.print(f"{'replaced' if w in before else 'wrote'} {w}", highlight=False, soft_wrap=True)
    for line in titan:
        con.print(line, highlight=False, soft_wrap=True)


def _print_tree(con, obj, indent: str) -> None:
    for k, v in obj.items():
        if isinstance(v, dict):
            con.print(f"{indent}{k}:")
            _print_tree(con, v, indent + "  ")
        elif isinstance(v, list):
            vals = ", ".join(f"{x:.4g}" if isinstance(x, float) else str(x) for x in v[:16])
            con.print(f"{indent}{k}: [{vals}{', ...' if len(v) > 16 else ''}]")
        else:
            con.print(f"{indent}{k}: {v:.6g}" if isinstance(v, float) else f"{indent}{k}: {v}")
