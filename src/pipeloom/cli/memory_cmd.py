"""pipeloom memory: per-device memory of a model under a pipeline schedule, before any GPU is touched."""
from __future__ import annotations

import argparse
import textwrap

from .common import (add_mem_limit_option, add_model_option, add_schedule_option, add_shape_options, positive_int,
                     print_json)

GiB = 1024 ** 3


def add_parser(sub) -> None:
    p = sub.add_parser(
        "memory", help="estimate per-device memory (params, grads, optimizer, activations) of a model",
        description=textwrap.fill("Estimate the memory of every pipeline device for a decoder-only transformer: parameters, "
                    "gradients, optimizer states (mixed-precision Adam, Megatron accounting) and the peak of "
                    "saved activations, taken from the memory trace of the actual schedule (B/W split "
                    "included). Activation sizes follow Korthikanti et al. 2022, adapted to GQA/SwiGLU/flash "
                    "attention. With --gpu-memory, say whether it fits and which memory limit (1p/1.5p/2p) "
                    "the free memory allows.", 100),
        epilog="examples:\n  pipeloom memory --model llama2-7b --pp 4 --microbatches 8 --schedule 1f1b "
               "--gpu-memory 80GiB\n  pipeloom memory --model llama2-70b --pp 8 --vpp 2 -m 16 -s interleaved "
               "--tp 8 --sequence-parallel --recompute selective --json\n"
               "  pipeloom memory --model path/to/config.json --pp 4 -m 8      # a Hugging Face config.json\n"
               "  pipeloom memory --model Mixtral-8x7B-v0.1 --pp 8 -m 16       # a published config shipped with pipeloom\n"
               "  pipeloom memory --model llama3-405b --pp 16 --vpp 8 -s interleaved -m 16 --tp 8 --sequence-parallel "
               "--dp 128 --zero 2 --account-for-embedding --account-for-loss --gpu-memory 80GB --reserve 2GiB"
               "   # Llama 3 405B as published",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_option(p, required=True)
    from ..schedule import registry

    add_schedule_option(p, required=False, default="1f1b",
                        help="pipeline schedule whose memory trace gives the live microbatches, one of: "
                             + ", ".join(registry.names()) + " (default: %(default)s)")
    add_shape_options(p, pp_help="pipeline degree (devices)", m_help="microbatches per step")
    p.add_argument("--micro-batch", type=positive_int, default=1, help="sequences per microbatch (default: 1)")
    p.add_argument("--seq", type=positive_int, default=None,
                   help="training sequence length (default: the model's context length up to 8192; a longer "
                        "context (max_position_embeddings) gives 8192 and a warning on stderr)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16",
                   help="parameter/activation precision; bf16/fp16 keep fp32 master weights (default: %(default)s)")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree (default: 1)")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="Megatron sequence parallelism (split norm/dropout activations over tp)")
    p.add_argument("--keep-gathered-input", action="store_true",
                   help="with --sequence-parallel: the QKV and fc1 inputs stay all-gathered from F to W, as "
                        "'pipeloom run --sequence-parallel --keep-gathered-input' keeps them (default: the sequence "
                        "shard saved and gathered again before the weight gradients, as Megatron and 'pipeloom run "
                        "--sequence-parallel' do)")
    p.add_argument("--recompute", choices=["none", "selective", "full"], default="none",
                   help="activation recompute: selective = attention core, full = keep layer inputs only "
                        "(default: %(default)s)")
    p.add_argument("--attention", choices=["flash", "math"], default="flash",
                   help="flash: no s*s matrix kept; math: softmax kept (Korthikanti's 5as/h term) "
                        "(default: %(default)s)")
    p.add_argument("--impl", choices=["fused", "eager", "hf"], default="fused",
                   help="fused: Megatron kernels; eager: unfused PyTorch ops as in pipeloom.models.llama; hf: "
                        "transformers' own modules (eager norms and MLP, SDPA with native GQA) "
                        "(default: %(default)s)")
    p.add_argument("--dp", type=positive_int, default=1, help="data-parallel degree (what --zero 1-3 shard over)")
    # (the words of pipeloom.memory.sharding.ZERO_LEVELS; not imported: building the parser loads no model)
    p.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=0,
                   help="what is sharded over --dp: 0 nothing; 1 the optimizer states (fp32 master weights, Adam "
                        "m and v); 2 the optimizer states and the gradients; 3 the optimizer states, the gradients "
                        "and the parameters (FSDP). Levels 2 and 3 add one chunk's unsharded gradients (and "
                        "gathered parameters) to the transient (default: 0)")
    g = p.add_argument_group(
        "stage shapes", "How the layers fill the pp*vpp chunks (default: evenly, extras on the first chunks). "
        "A chunk may hold only the embedding (the first) or only the loss head (the last). At most one of "
        "--layers-per-chunk, --megatron-layout, --first/--last-stage-layers, --account-for-embedding/-loss.")
    g.add_argument("--layers-per-chunk", default=None, metavar="N,N,...",
                   help="layers of every global chunk (pp*vpp values; 0 allowed for the first and the last chunk)")
    g.add_argument("--megatron-layout", default=None, metavar="LAYOUT",
                   help="Megatron-Core's --pipeline-model-parallel-layout, e.g. 'E|t*8|...|L' (interleaved order; "
                        "gives vpp)")
    g.add_argument("--first-stage-layers", type=int, default=None, metavar="N",
                   help="layers of the first pipeline stage, the rest shared evenly (Megatron's "
                        "--decoder-first-pipeline-num-layers); with vpp the fewest on its first chunk")
    g.add_argument("--last-stage-layers", type=int, default=None, metavar="N",
                   help="layers of the last pipeline stage (Megatron's --decoder-last-pipeline-num-layers); with "
                        "vpp the fewest on its last chunk")
    g.add_argument("--account-for-embedding", action="store_true",
                   help="the embedding takes the place of one layer in the even split (Megatron's "
                        "--account-for-embedding-in-pipeline-split): one layer less on the first chunk")
    g.add_argument("--account-for-loss", action="store_true",
                   help="the loss head takes the place of one layer (--account-for-loss-in-pipeline-split): one "
                        "layer less on the last chunk. Both, on 126 layers, pp 16, vpp 8: Llama 3 405B's split "
                        "(first chunk only the embedding, last only the loss)")
    g.add_argument("--keep-stage-io", action="store_true",
                   help="each chunk keeps its sent output until its backward (no early freeing); default: freed "
                        "once sent, as Megatron's deallocate_pipeline_outputs and Llama 3 do")
    add_moe_options(p)
    add_mem_limit_option(p, default=None, bytes_ok=True,
                         purpose="memory limit for memory-aware schedules (a size in bytes is converted into units "
                                 "with this estimate)")
    p.add_argument("--gpu-memory", default=None, metavar="SIZE",
                   help="device memory to check against, e.g. 80GiB, 80GB, 40960MiB")
    p.add_argument("--reserve", default="0", metavar="SIZE",
                   help="memory kept aside per device (CUDA context, allocator slack), e.g. 2GiB "
                        "(default: %(default)s)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: total_params, active_params (MoE: top-k experts) and one entry per "
                        "device with params, "
                        "params_bytes, grads_bytes, optimizer_bytes, activations_bytes, peak_bytes")
    p.set_defaults(func=run)


def add_moe_options(p) -> None:
    """Expert and context parallelism, light recompute and FP8 (``memory`` and ``tune``'s pins share them)."""
    from .common import positive_int

    g = p.add_argument_group("mixture of experts, long context, FP8 (docs/moe.md)")
    g.add_argument("--ep", type=positive_int, default=1,
                   help="expert-parallel degree: experts / ep routed experts per rank, carved out of dp*cp "
                        "(Megatron); must divide the experts and dp*cp (default: 1)")
    g.add_argument("--capacity-factor", type=float, default=None, metavar="X",
                   help="expert capacity over the mean load (buffers padded to it); default: dropless")
    g.add_argument("--moe-imbalance", type=float, default=1.0, metavar="X",
                   help="dropless: the busiest rank's expert load over the mean, >= 1 (default: 1, balanced)")
    g.add_argument("--cp", type=positive_int, default=1,
                   help="context-parallel degree (ring attention, zig-zag split): activations / cp (default: 1)")
    g.add_argument("--recompute-norms", action="store_true",
                   help="recompute RMSNorm outputs and MLA up-projections in backward (DeepSeek-V3)")
    g.add_argument("--precision", choices=["bf16", "fp8"], default="bf16",
                   help="GEMM precision: fp8 caches GEMM inputs in FP8 and keeps an FP8 weight copy (default: "
                        "%(default)s; the rest of the model stays in --dtype)")


def moe_train_kwargs(args) -> dict:
    """The :class:`~pipeloom.memory.layers.TrainConfig` fields of :func:`add_moe_options`."""
    return dict(ep=args.ep, capacity_factor=args.capacity_factor, moe_imbalance=args.moe_imbalance, cp=args.cp,
                recompute_norms=args.recompute_norms, fp8=args.precision == "fp8")


def _lpc(text: str | None):
    if text is None:
        return None
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--layers-per-chunk {text!r}: expected comma-separated integers, e.g. 8,8,8,8") from None
    if any(v < 0 for v in vals):
        raise ValueError(f"--layers-per-chunk {text!r}: layer counts must be >= 0")
    return vals


def stage_shape(args, layers: int) -> tuple[int | None, list[int] | None]:
    """(vpp, layers per global chunk) from the stage-shape options (None, None: the defaults)."""
    from ..partition.layout import end_stage_counts, ends_as_layers
    from ..partition.megatron import layout_chunk_counts
    from ..schedule import registry

    given = [f for f, on in (("--layers-per-chunk", args.layers_per_chunk is not None),
                             ("--megatron-layout", args.megatron_layout is not None),
                             ("--first/--last-stage-layers", args.first_stage_layers is not None
                              or args.last_stage_layers is not None),
                             ("--account-for-embedding/-loss", args.account_for_embedding or args.account_for_loss))
             if on]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)} both shape the stages; give one of them")
    if args.megatron_layout is not None:
        vpp, counts = layout_chunk_counts(args.megatron_layout, args.pp)
        if args.vpp is not None and args.vpp != vpp:
            raise ValueError(f"--megatron-layout has {vpp} stages per pipeline rank but --vpp is {args.vpp}; "
                             f"drop --vpp or give a layout of pp*vpp stages")
        return vpp, counts
    vpp = args.vpp if args.vpp is not None else registry.default_vpp(args.schedule)
    if given and given[0].startswith("--first"):
        if vpp > 1 and registry.get(args.schedule).placement_at(vpp).value != "interleaved":
            raise ValueError(f"--first/--last-stage-layers deal a stage's layers over interleaved chunks; schedule "
                             f"{args.schedule!r} places its chunks otherwise: give --layers-per-chunk")
        return vpp, end_stage_counts(layers, args.pp, vpp, first=args.first_stage_layers,
                                     last=args.last_stage_layers)
    if given and given[0].startswith("--account"):
        return vpp, ends_as_layers(layers, args.pp, vpp, embedding=int(args.account_for_embedding),
                                   loss=int(args.account_for_loss))
    return args.vpp, _lpc(args.layers_per_chunk)


def _check_sizes(args) -> None:
    """--gpu-memory must leave room after --reserve (else every device 'does not fit' for no model reason)."""
    from ..memory.analytic import parse_bytes

    reserve = parse_bytes(args.reserve, what="--reserve")
    if args.gpu_memory is None:
        return
    gpu = parse_bytes(args.gpu_memory, what="--gpu-memory")
    if gpu <= 0:
        raise ValueError(f"--gpu-memory {args.gpu_memory!r}: must be more than 0 bytes, e.g. 80GiB")
    if reserve >= gpu:
        raise ValueError(f"--reserve {args.reserve} is not below --gpu-memory {args.gpu_memory}: nothing would be "
                         f"left for the model; lower --reserve")


def run(args) -> int:
    from ..memory.analytic import TrainConfig, estimate
    from .common import model_from_args

    _check_sizes(args)

    import sys

    from ..memory.analytic import training_seq

    model = model_from_args(args)
    seq, warning = training_seq(model, args.seq)
    if warning:
        print(f"pipeloom: warning: {warning}", file=sys.stderr)
    train = TrainConfig(seq=seq, micro_batch=args.micro_batch, dtype=args.dtype, tp=args.tp,
                        sequence_parallel=args.sequence_parallel, recompute=args.recompute,
                        attention=args.attention, impl=args.impl, dp=args.dp, zero=args.zero,
                        free_stage_io=not args.keep_stage_io, keep_gathered_input=args.keep_gathered_input,
                        **moe_train_kwargs(args))
    vpp, lpc = stage_shape(args, model.layers)
    rep = estimate(model, train, schedule=args.schedule, pp=args.pp, vpp=vpp,
                   microbatches=args.microbatches, layers_per_chunk=lpc,
                   gpu_bytes=args.gpu_memory, reserve_bytes=args.reserve, mem_limit=args.mem_limit)
    if args.json:
        from ..models.moe import group_sizes

        print_json({**rep.to_dict(), **moe_train_kwargs(args), "precision": args.precision,
                    "groups": group_sizes(tp=args.tp, cp=args.cp, ep=args.ep, dp=args.dp, pp=args.pp)})
    else:
        print_report(rep)
    return 0 if rep.fits in (None, True) else 1


def _gib(x: float) -> str:
    return f"{x / GiB:.1f}"


def print_report(rep) -> None:
    from rich.console import Console
    from rich import box
    from rich.table import Table

    t = rep.train
    from ..models.flops import active_params

    active = f", {active_params(rep.model) / 1e9:.2f}B active" if rep.model.moe else ""
    title = (f"{rep.model.name} ({rep.total_params / 1e9:.2f}B{active})  {rep.schedule_name} pp={rep.pp} vpp={rep.vpp} "
             f"m={rep.microbatches}\ntp={t.tp}{'+sp' if t.sequence_parallel else ''} seq={t.seq or rep.model.seq} "
             f"b={t.micro_batch} {t.dtype}{'+fp8' if t.fp8 else ''} recompute={t.recompute}"
             f"{'+norms' if t.recompute_norms else ''}"
             + (f" dp={t.dp} zero={t.zero}" if t.dp > 1 else "") + (f" ep={t.ep}" if t.ep > 1 else "")
             + (f" cp={t.cp}" if t.cp > 1 else "") + ("" if t.free_stage_io else " stage-io-kept"))
    tab = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, caption="GiB per device; act = peak held activations over the schedule, "
                                     "units = full-stage microbatch activations; tmp = transient working set")
    for c in ("dev", "chunks", "params", "weights", "grads", "optim", "act", "units", "tmp", "peak"):
        tab.add_column(c, justify="right", no_wrap=True)
    if rep.gpu_bytes is not None:
        tab.add_column("fits", justify="center", no_wrap=True)
    for d in rep.devices:
        row = [str(d.device), ",".join(map(str, d.chunks)), _count(d.params),
               _gib(d.params_bytes), _gib(d.grads_bytes), _gib(d.optimizer_bytes),
               _gib(d.activations_bytes), f"{d.peak_units:.2f}", _gib(d.transient_bytes), _gib(d.peak_bytes)]
        if rep.gpu_bytes is not None:
            row.append("[green]yes[/green]" if d.fits else "[red]NO[/red]")
        tab.add_row(*row)
    con = Console()
    con.print(tab)
    split = rep.schedule is not None and any(j.kind.value == "B" for seq in rep.schedule.devices for j in seq)
    con.print(f"one unit (full-stage microbatch activation) = {_gib(rep.unit_bytes)} GiB"
              + (f"; B frees b/a = {_ratio(rep)} of a chunk's activations, W the rest" if split else ""))
    if t.ep > 1 or t.cp > 1:
        from ..models.moe import group_sizes

        g = group_sizes(tp=t.tp, cp=t.cp, ep=t.ep, dp=t.dp, pp=rep.pp)
        con.print(f"process groups: world {g['world']} = tp {g['tp']} x cp {g['cp']} x pp {g['pp']} x dp {t.dp}; "
                  f"dense gradients over {g['dp']}, ep {g['ep']}, expert gradients over {g['expert_dp']}")
    if rep.mem_limit_units is not None:
        con.print(f"schedule memory limit: {rep.mem_limit_units:.3g} units ({rep.mem_limit_units / rep.pp:.3g}p)")
    if rep.gpu_bytes is not None:
        avail = rep.limit_units_available
        lvl = rep.largest_limit_level()
        worst = max(rep.devices, key=lambda d: d.peak_bytes)
        verdict = "[green]fits[/green]" if rep.fits else "[red]does NOT fit[/red]"
        con.print(f"{verdict}: {rep.schedule_name} peaks at {_gib(worst.peak_bytes)} GiB on device {worst.device}, "
                  f"{'within' if rep.fits else 'above'} {_gib(rep.gpu_bytes - rep.reserve_bytes)} GiB "
                  f"({_gib(rep.gpu_bytes)} GiB per device less {_gib(rep.reserve_bytes)} GiB reserve)")
        # what a memory-aware schedule could be given: a limit, not a second verdict on this schedule
        if avail <= 0:
            con.print("memory-aware schedules: no room for held activations on the tightest device (its parameters, "
                      "gradients, optimizer states and transient alone fill it)")
        else:
            con.print(f"memory-aware schedules: room for {avail:.3g} units of held activations ({avail / rep.pp:.3g}p) "
                      f"on the tightest device; "
                      + (f"largest standard --mem-limit within it: {lvl}" if lvl else
                         "below 1p, the smallest standard --mem-limit (give --mem-limit in units or bytes)"))
    for n in rep.notes:
        con.print(f"[yellow]note:[/yellow] {n}")


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e5 else str(n)


def _ratio(rep) -> str:
    r = [b / a if a else 0.0 for a, b in zip(rep.mem_a, rep.mem_b)]
    lo, hi = min(r), max(r)
    return f"{lo:.2f}" if abs(hi - lo) < 5e-3 else f"{lo:.2f}..{hi:.2f}"
