"""The data-parallel options of ``simulate`` and ``compare``: --dp N and the gradient reduction's link
(model in :mod:`pipeloom.sim.dp`)."""
from __future__ import annotations

from .common import positive_int


def add_dp_options(p, *, gantt: bool = False) -> None:
    g = p.add_argument_group(
        "data parallel",
        "With --dp N > 1 the step also reduces every device's gradients over N replicas (ring collectives, "
        "see docs/runtime.md): the result gets step_time, dp_exposed (the un-hidden tail) and dp_hidden_share. "
        "Gradient bytes come from --model or --param-bytes; one cost unit is --dp-unit-ms milliseconds.")
    g.add_argument("--dp", type=positive_int, default=1, help="data-parallel replicas (default: 1, no reduction)")
    if not any("--model" in a.option_strings for a in p._actions):  # simulate's partition options have it
        g.add_argument("--model", default=None, metavar="PRESET|CONFIG",
                       help="gradient bytes per chunk from this model's parameters (a preset or a Hugging Face "
                            "config.json), its layers split evenly over the chunks")
    g.add_argument("--param-bytes", default=None, metavar="BYTES",
                   help="gradient bytes of the whole model (split evenly over the chunks), or one value per "
                        "global chunk (B0,B1,...); suffixes KB/MB/GB/KiB/MiB/GiB allowed")
    g.add_argument("--grad-bytes", type=positive_int, default=4,
                   help="bytes per gradient element with --model (default: 4, fp32 grads as the runtime keeps)")
    g.add_argument("--dp-bandwidth", default="100Gb/s", metavar="BW",
                   help="per-device dp link: 100Gb/s (bits), 12.5GB/s (bytes) or bytes/s (default: %(default)s)")
    g.add_argument("--dp-latency", default="5us", metavar="T",
                   help="latency per ring step: 5us, 0.01ms or seconds (default: %(default)s)")
    g.add_argument("--dp-unit-ms", type=float, default=1.0, metavar="MS",
                   help="milliseconds per schedule cost unit (default: 1, costs in ms as measured costs are)")
    g.add_argument("--overlap-grad-reduce", action="store_true", default=False,
                   help="start each chunk's reduction after its last W/BW on the device (as `run "
                        "--overlap-grad-reduce` does)")
    g.add_argument("--no-overlap-grad-reduce", dest="overlap_grad_reduce", action="store_false",
                   help="one reduction after the device's last job (default, as `run`'s default)")
    g.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=0,
                   help="1: ZeRO-1 (reduce-scatter per chunk, all-gather of the parameters after the step); 2: "
                        "gradients sharded (a reduce-scatter after every backward of a chunk); 3: FSDP (also an "
                        "all-gather of the chunk's parameters before each F and B)")
    g.add_argument("--dp-bucket", default=None, metavar="BYTES",
                   help="gradient bytes per bucket, each reduced as soon as the backward has filled it (with "
                        "--overlap-grad-reduce; Megatron's default is 40M parameters = 160MB of fp32 grads) "
                        "(default: one bucket per chunk)")
    if gantt:
        g.add_argument("--dp-gantt", default=None, metavar="FILE",
                       help="draw the step with a band of the dp collectives under each device (.png/.svg/.pdf)")


def dp_wanted(args) -> bool:
    """--dp N > 1 or explicit gradient bytes (--model alone also costs the layers: no reduction then)."""
    return args.dp > 1 or args.param_bytes is not None


def chunk_bytes(args, num_chunks: int, vpp: int) -> list[float]:
    """Gradient bytes of every global chunk from --model or --param-bytes."""
    from ..memory.analytic import TrainConfig, chunk_memory, parse_bytes, split_layers
    from ..models.hf_config import resolve_model

    if args.model is not None and args.param_bytes is not None:
        raise ValueError("give --model or --param-bytes for the gradient bytes, not both")
    if args.model is not None:
        model = resolve_model(args.model)
        if model.layers < num_chunks:
            raise ValueError(f"--model {args.model} has {model.layers} layers, fewer than the {num_chunks} chunks")
        chunks = chunk_memory(model, TrainConfig(dtype="fp32"), split_layers(model.layers, num_chunks))
        return [float(c.params * args.grad_bytes) for c in chunks]
    if args.param_bytes is not None:
        parts = [s.strip() for s in str(args.param_bytes).split(",")]
        vals = [float(parse_bytes(s, what="--param-bytes")) for s in parts]  # (the error names the option)
        if len(vals) == 1:
            return [vals[0] / num_chunks] * num_chunks
        if len(vals) != num_chunks:
            raise ValueError(f"--param-bytes has {len(vals)} values but the schedule has {num_chunks} chunks "
                             f"(give one total or one per chunk)")
        return vals
    raise ValueError(f"--dp {args.dp} needs the gradient bytes: give --model PRESET or --param-bytes BYTES")


def link_from_args(args):
    from ..sim.dp import DPLink, parse_bandwidth, parse_seconds

    if not args.dp_unit_ms > 0:
        raise ValueError(f"--dp-unit-ms must be > 0, got {args.dp_unit_ms}")
    return DPLink(bandwidth=parse_bandwidth(args.dp_bandwidth), latency=parse_seconds(args.dp_latency),
                  unit_s=args.dp_unit_ms * 1e-3)


def dp_result(args, sched, sim):
    """:class:`~pipeloom.sim.dp.DPResult` of ``sim`` under the dp options."""
    from ..sim.dp import simulate_dp

    from ..memory.analytic import parse_bytes

    bucket = None
    if getattr(args, "dp_bucket", None) is not None:
        bucket = float(parse_bytes(args.dp_bucket, what="--dp-bucket"))
        if bucket <= 0:
            raise ValueError(f"--dp-bucket must be > 0 bytes, got {args.dp_bucket}")
    return simulate_dp(sim, chunk_bytes(args, sched.num_chunks, sched.vpp), args.dp, link_from_args(args),
                       overlap=args.overlap_grad_reduce, zero=args.zero, bucket_bytes=bucket)
