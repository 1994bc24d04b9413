"""Options and output helpers shared by the subcommands."""
from __future__ import annotations

import argparse
import json
import math
import sys

from ..core.costs import MEM_LIMIT_HELP as _LIMIT_GRAMMAR, RUNTIMES, MemLimit, MemModel, runtime_mem_model
from ..core.limits import MAX_LAYERS
from ..schedule.planning import make_spec, plan
from ..schedule import registry
from ..schedule.registry import PlanSpec


def _int_at_least(lo: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        return v
    return parse


positive_int = _int_at_least(1)
nonnegative_int = _int_at_least(0)


def capped_int(lo: int, cap: int):
    """argparse type: an integer in [lo, cap] (``cap`` from :mod:`pipeloom.core.limits`)."""
    base = _int_at_least(lo)

    def parse(text: str) -> int:
        v = base(text)
        if v > cap:
            raise argparse.ArgumentTypeError(f"{v:,} is above the cap of {cap:,} (caps: docs/robustness.md)")
        return v
    return parse


layers_int = capped_int(1, MAX_LAYERS)


def number_type(lo: float, hi: float | None = None, *, unit: str = "a number", hi_open: bool = False):
    """argparse type: a finite float in [lo, hi] (or [lo, hi) with ``hi_open``), with a one-line message otherwise."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {unit}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{text!r} is not {unit} (must be finite)")
        too_high = hi is not None and (v >= hi if hi_open else v > hi)
        if v < lo or too_high:
            rng = f">= {lo:g}" if hi is None else f"in [{lo:g}, {hi:g}{')' if hi_open else ']'}"
            raise argparse.ArgumentTypeError(f"must be {rng}, got {v:g}")
        return v
    return parse


def check_out_path(flag: str, path: str, exts: tuple[str, ...], what: str = "") -> None:
    """Fail early (before any planning or reading) on an output name the writer would reject: a name
    without one of ``exts`` or whose nearest existing parent is not a directory. Missing directories
    are fine: the writers create them."""
    import os

    if not path or os.path.splitext(path)[1].lower() not in exts:
        raise ValueError(f"{flag} {path!r}: the name must end in {', '.join(exts[:-1])}{' or ' if len(exts) > 1 else ''}"
                         f"{exts[-1]}{what}")
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path!r} is a directory; give a file name")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"{flag} {path!r}: {parent} is a file, not a directory")


def wrap(text: str, width: int = 90) -> str:
    """Wrap a long --help description paragraph."""
    import textwrap

    return textwrap.fill(text, width)


# ---------------------------------------------------------------------- planning options, each defined once
DEFAULT_COSTS = "F=1,B=1,W=1,comm=0"
#: the one --mem-limit grammar of every command (:class:`pipeloom.core.costs.MemLimit`)
MEM_LIMIT_HELP = "peak activation memory per device: " + _LIMIT_GRAMMAR
COSTS_HELP = ("durations per chunk pass (BW = B+W) and cross-device latency; per-chunk lists as F=1:2:1:1 "
              "(default: %(default)s)")


def add_schedule_option(p, *, required: bool = True, default: str | None = None, help: str | None = None) -> None:
    """--schedule/-s NAME (a registry builder)."""
    p.add_argument("--schedule", "-s", required=required, default=default, metavar="NAME",
                   help=help or "schedule builder; one of: " + ", ".join(registry.names()))


def add_shape_options(p, *, required: bool = True, pp_help: str = "pipeline degree (number of devices)",
                      m_help: str = "microbatches per step (gradient accumulation steps)",
                      vpp_help: str = "chunks per device (default: 2 for interleaved and V-shape schedules, else 1)",
                      microbatches: bool = True) -> None:
    """--pp, --microbatches/-m, --vpp (``required=False``: None when not given, the command fills defaults)."""
    p.add_argument("--pp", type=positive_int, required=required, default=None, help=pp_help)
    if microbatches:
        p.add_argument("--microbatches", "-m", type=positive_int, required=required, default=None, help=m_help)
    p.add_argument("--vpp", type=positive_int, default=None, help=vpp_help)


def mem_limit_type(*, bytes_ok: bool):
    """argparse type of --mem-limit: a :class:`~pipeloom.core.costs.MemLimit`, parsed once with the one
    grammar; ``bytes_ok``: the command has a model that turns a size in bytes into units (memory, tune)."""
    def parse(text: str) -> MemLimit:
        try:
            return MemLimit.parse(text, what="memory limit", bytes_ok=bytes_ok)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def add_mem_limit_option(p, *, default: str | None = "none", bytes_ok: bool = False, purpose: str = "") -> None:
    """--mem-limit LIMIT, one grammar and one help for every command (``purpose``: what the command does with
    it, put before the grammar); parsed into a :class:`~pipeloom.core.costs.MemLimit` by argparse."""
    grammar = _LIMIT_GRAMMAR if bytes_ok else _LIMIT_GRAMMAR.replace(
        "or, where a model converts it (memory, tune), a size per device such as 80GiB",
        "(a size in bytes such as 80GiB needs a model: memory, tune)")
    p.add_argument("--mem-limit", default=default, metavar="LIMIT", type=mem_limit_type(bytes_ok=bytes_ok),
                   help=(purpose or "peak activation memory per device") + ": " + grammar
                   + ("" if default is None else " (default: %(default)s)"))


def add_costs_option(p, *, default: str | None = DEFAULT_COSTS, help: str = COSTS_HELP) -> None:
    """--costs F=..,B=..,W=..,comm=.. (parsed by :meth:`pipeloom.core.costs.Costs.parse` where it is used)."""
    p.add_argument("--costs", default=default, metavar="F=..,B=..,W=..,comm=..", help=help)


def add_mem_option(p, *, help: str = "activation memory per chunk pass in units: F allocates a (default 1/vpp), "
                                     "B frees b (default a/2), W frees a-b", runtime: bool = True) -> None:
    """--mem a=..,b=.. (the activation memory model) and, with ``runtime``, --runtime (whose memory model)."""
    p.add_argument("--mem", default=None, metavar="a=..,b=..", help=help)
    if runtime:
        p.add_argument("--runtime", choices=RUNTIMES, default=None,
                       help="the runtime that will execute the plan, for its memory model: pipeloom (B frees b) or "
                            "torch (torch.distributed.pipelining keeps a chunk's graph until W: B frees 0). "
                            "Default: torch with --format torch, else pipeloom")


def mem_model_from_args(args) -> MemModel:
    """--mem under the --runtime's rules (torch: B frees nothing; a b > 0 in --mem is then an error)."""
    mem = MemModel.parse(getattr(args, "mem", None))
    runtime = getattr(args, "runtime", None) or ("torch" if getattr(args, "format", None) == "torch" else "pipeloom")
    if runtime == "torch":
        if mem.b not in (None, 0, 0.0):
            raise ValueError("--mem gives b (what B frees) but torch's runtime frees nothing at its I (B) step; "
                             "drop b from --mem, or plan for --runtime pipeloom")
        return runtime_mem_model("torch", a=mem.a)
    return mem


def add_builder_options(p, *, one_schedule: bool = True) -> None:
    """-O/--option KEY=VALUE, repeatable (builder options, see :func:`parse_options`)."""
    p.add_argument("--option", "-O", action="append", default=[], metavar="KEY=VALUE", dest="option",
                   help="builder-specific option, repeatable, e.g. -O time_limit=30 for optimal, "
                        "-O remainder=last for interleaved (values parsed as JSON when they can be); a key the "
                        "schedule does not read is an error" + ("" if one_schedule else
                        "; each schedule gets the options it reads"))


def add_planning_options(p: argparse.ArgumentParser, *, schedule: bool = True, partition: bool = True,
                         costs_default: str | None = DEFAULT_COSTS, costs_help: str = COSTS_HELP) -> None:
    """The options that make a :class:`PlanSpec`: --schedule/--pp/--microbatches/--vpp/--mem-limit/--costs/--mem/-O
    and the layer-partition options (shared by simulate, plan, compare and run)."""
    if schedule:
        add_schedule_option(p)
    add_shape_options(p, vpp_help="chunks per device (default: 2 for interleaved and V-shape schedules, else 1)"
                      if schedule else "chunks per device, for every schedule (default: each schedule at vpp 1 "
                                       "and at vpp 2, where it takes them)")
    add_mem_limit_option(p)
    add_costs_option(p, default=costs_default, help=costs_help)
    add_mem_option(p)
    add_builder_options(p, one_schedule=schedule)
    if partition:
        add_partition_options(p)


# ---------------------------------------------------------------------- --model (one resolution for every command)
def model_help() -> str:
    from ..models.families import architectures
    from ..models.hf_config import shipped_configs
    from ..models.presets import PRESETS

    return ("the model: a preset (" + ", ".join(PRESETS) + "), a published config shipped with pipeloom ("
            + ", ".join(p.stem for p in shipped_configs().values()) + "), or a path to a Hugging Face config.json "
            "or to a directory holding one (read as JSON; architectures " + ", ".join(architectures()) + ")")


def add_model_option(p, *, required: bool = False, help: str | None = None) -> None:
    """--model PRESET|CONFIG, resolved by :func:`model_from_args`."""
    p.add_argument("--model", required=required, default=None, metavar="PRESET|CONFIG",
                   help=help or model_help())


def model_from_args(args):
    """The :class:`~pipeloom.models.config.ModelConfig` of ``--model`` (None when not given), through
    :func:`pipeloom.models.hf_config.resolve_model`, the one resolution every command uses."""
    spec = getattr(args, "model", None)
    if spec is None:
        return None
    from ..models.hf_config import resolve_model

    return resolve_model(spec)


# ---------------------------------------------------------------------- layer partition
PARTITION_KEYS = ("layers", "layers_per_device", "layers_per_chunk", "layer_costs", "balance")


def add_partition_options(p: argparse.ArgumentParser, *, layers: bool = True) -> None:
    """--layers/--layers-per-device/--layer-costs/--vocab/--hidden/--seq/--balance: per-chunk costs from layers.

    ``layers=False`` leaves out --layers (and --model) for a command that defines them itself (run: the
    model's layers)."""
    g = p.add_argument_group(
        "layer partition",
        "Split L layers over pp*vpp chunks and derive per-chunk F/B/W and memory from them (see "
        "'pipeloom partition --help'). Without these options every chunk costs --costs F/B/W.")
    if layers:
        g.add_argument("--layers", type=layers_int, default=None, metavar="L",
                       help="number of transformer layers; uniform split: per-chunk counts differ by at most one, "
                            "the L %% (pp*vpp) extra layers go to the first global chunks")
    g.add_argument("--layers-per-device", default=None, metavar="N0,N1,..",
                   help="layers of each device (e.g. 7,8,8,9), dealt round-robin over the device's chunks; "
                        "each needs >= vpp")
    g.add_argument("--layers-per-chunk", default=None, metavar="N0,N1,..",
                   help="layers of every global chunk, pp*vpp counts (e.g. the split 'pipeloom tune' chose: its "
                        "pipeloom.toml's partition.layers_per_chunk)")
    if layers:
        g.add_argument("--model", default=None, metavar="PRESET|CONFIG",
                       help="cost the layers from a model: its layer count (--layers defaults to it), the head's time "
                            "from the FLOPs of one layer (top-k experts for MoE) vs the vocabulary projection, its "
                            "memory from their activations; " + model_help().removeprefix("the model: "))
    g.add_argument("--layer-costs", default=None, metavar="FILE",
                   help="per-layer F/B/W/mem (+ embedding, head) as .json or .csv; then --costs gives only "
                        "comm/overlap")
    g.add_argument("--vocab", type=positive_int, default=None, metavar="V",
                   help="vocabulary size: cost the head (norm + projection + loss) from V/hidden (needs --hidden)")
    g.add_argument("--hidden", type=positive_int, default=None, metavar="H", help="hidden size (with --vocab)")
    g.add_argument("--seq", type=positive_int, default=None, metavar="S",
                   help="sequence length: adds the attention term to the head/layer time ratio")
    g.add_argument("--balance", nargs="?", const="auto", default=None, metavar="OBJECTIVE",
                   choices=["auto", "bottleneck", "makespan"],
                   help="choose the per-chunk layer counts by cost: 'bottleneck' (DP, minimise the largest "
                        "chunk/device time) or 'makespan' (simulate the schedule); bare --balance = makespan "
                        "when a schedule is known, else bottleneck")
    p.set_defaults(_partition_options=True)  # plan_inputs acts on these only where they were added
    if layers:
        p.set_defaults(_partition_model=True)  # --model here is the partition's (run's --model is its own)


def partition_given(args) -> bool:
    """True if the command has the partition options and one of them was used."""
    return getattr(args, "_partition_options", False) and (any(
        getattr(args, k, None) is not None for k in PARTITION_KEYS) or (
        getattr(args, "_partition_model", False) and getattr(args, "model", None) is not None))


def partition_from_args(args, spec: PlanSpec, schedule: str | None = None, progress=None, *,
                        objective: str | None = None, layers: int | None = None):
    """The :class:`~pipeloom.partition.PartitionPlan` the partition options ask for (placement from the
    schedule's declaration). ``objective`` and ``layers`` replace --balance and --layers where given."""
    from ..partition import make_partition, placement_of
    from ..core.ir import Placement

    placement = placement_of(schedule, spec.vpp, spec.options) if schedule else Placement.INTERLEAVED
    if schedule is None and args.layers_per_device is not None and spec.vpp > 1:
        raise ValueError("--layers-per-device with vpp > 1 needs one schedule (interleaved and V placements put "
                         "different chunks on a device); use plan/simulate --schedule NAME")
    objective = objective or args.balance
    if objective == "auto":
        objective = "makespan" if schedule else "bottleneck"
    model = model_from_args(args) if getattr(args, "_partition_model", False) else None
    return make_partition(pp=spec.pp, vpp=spec.vpp, placement=placement, layers=args.layers if layers is None else layers,
                          layers_per_device=args.layers_per_device,
                          layers_per_chunk=getattr(args, "layers_per_chunk", None), layer_costs=args.layer_costs,
                          base_costs=spec.costs, vocab=args.vocab, hidden=args.hidden, seq=args.seq, model=model,
                          balance=objective, schedule=schedule, microbatches=spec.microbatches,
                          mem_limit=spec.mem_limit if schedule else None,
                          max_evals=getattr(args, "max_evals", 400), options=spec.options, progress=progress)


def parse_options(items: list[str]) -> dict:
    """``["time_limit=30", "placement=v"]`` -> ``{"time_limit": 30, "placement": "v"}``."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--option {item!r}: expected KEY=VALUE, e.g. time_limit=30")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def plan_inputs(args, schedule: str | None = None, *, pp: int | None = None, microbatches: int | None = None,
                vpp: int | None = None, costs=None, layers: int | None = None):
    """``(PlanSpec, PartitionPlan or None)`` from the planning options in ``args`` (``args`` is not changed).

    The keywords replace the options of the same name where given: compare plans every vpp with
    per-chunk costs of its own, run fills in its defaults (pp 2, 4 microbatches, the model's layers)."""
    if vpp is None:
        vpp = args.vpp
    if vpp is None:
        if schedule and schedule.startswith(TORCH_PREFIX):
            vpp = 1 if schedule[len(TORCH_PREFIX):].lower() in ("gpipe", "1f1b") else 2
        else:
            vpp = registry.default_vpp(schedule) if schedule else 1
    spec = make_spec(pp=args.pp if pp is None else pp, vpp=vpp,
                     microbatches=args.microbatches if microbatches is None else microbatches,
                     costs=args.costs if costs is None else costs, mem=mem_model_from_args(args),
                     mem_limit=args.mem_limit, options=parse_options(getattr(args, "option", [])))
    if getattr(args, "_partition_options", False) and not partition_given(args):
        alone = [f"--{k}" for k in ("vocab", "hidden", "seq") if getattr(args, k, None) is not None]
        if alone:
            raise ValueError(f"{', '.join(alone)}: only used to cost the layers of a layer partition; give --layers L "
                             f"(or --layers-per-device, --layer-costs FILE) as well, or drop {', '.join(alone)}")
    if not partition_given(args):
        return spec, None
    if args.mem is not None:
        raise ValueError("--mem cannot be combined with the layer partition options (memory then comes from "
                         "the layers); drop --mem or put 'mem' in --layer-costs")
    pplan = partition_from_args(args, spec, schedule, layers=layers)
    return pplan.apply(spec), pplan


#: ``-s torch:NAME`` names one of torch's own schedule classes (pipeloom.integrations.torch)
TORCH_PREFIX = "torch:"


def plan_named(name: str, spec: PlanSpec, *, check: bool = True):
    """:func:`pipeloom.schedule.planning.plan`, or for ``torch:NAME`` the order torch's schedule class NAME
    generates (validated; it needs torch, imported only then)."""
    if not name.startswith(TORCH_PREFIX):
        return plan(name, spec, check=check)
    try:
        from ..integrations.torch import torch_builtin
    except ImportError:
        raise ValueError(f"{name}: torch's schedules need torch (pip install 'pipeloom[torch]')") from None
    if spec.options:
        raise ValueError(f"{name}: torch's schedules take no -O options")
    return torch_builtin(name[len(TORCH_PREFIX):], spec.pp, spec.microbatches, spec.vpp)


def spec_from_args(args, schedule: str | None = None) -> PlanSpec:
    """The :class:`PlanSpec` of the planning options (see :func:`plan_inputs`)."""
    return plan_inputs(args, schedule)[0]


def print_json(obj) -> None:
    """Print ``obj`` as one strict JSON object (RFC 8259: no NaN or Infinity). A non-finite number in a
    result is refused with a one-line error naming where it is, never printed as invalid JSON."""
    sys.stdout.write(json_text(obj) + "\n")


def json_text(obj) -> str:
    """``obj`` as strict JSON text (see :func:`print_json`)."""
    try:
        return json.dumps(obj, allow_nan=False, indent=None if isinstance(obj, dict) and len(obj) < 20 else 1)
    except ValueError:
        where = _non_finite(obj, "")
        raise ValueError(f"the result is not finite at {where or 'a value'}; refusing to print it as JSON "
                         f"(an input is too large or degenerate: scale the costs down or check the inputs)") from None


def _non_finite(obj, path: str) -> str | None:
    """The path (``makespan``, ``peak_memory[2]``) of the first non-finite float in ``obj``, or None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return f"{path or 'the top'} ({obj})"
    if isinstance(obj, dict):
        items = ((f"{path}.{k}" if path else str(k), v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(obj))
    else:
        return None
    for p, v in items:
        found = _non_finite(v, p)
        if found:
            return found
    return None


def print_table(con, table) -> None:
    """Print a rich ``table`` at its natural width, however narrow the terminal or pipe (rich lays out 80
    columns when not on a terminal and would cut numbers to "29.…"); a narrower terminal wraps the lines."""
    from rich.measure import Measurement

    need = Measurement.get(con, con.options.update(width=10_000), table).maximum
    old = con.width
    con.width = max(old, need)  # (print's own width= is capped at the console's)
    try:
        con.print(table, crop=False)
    finally:
        con.width = old


def fmt(x, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)
