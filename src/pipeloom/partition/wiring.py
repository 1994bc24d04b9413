"""From loose inputs (CLI options, config) to a partition and the per-chunk PlanSpec it implies."""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from ..core.ir import Placement
from ..schedule.registry import PlanSpec
from ..core.costs import Costs
from ..core.limits import MAX_EVALS, MAX_LAYERS, check_at_most
from ..models.config import ModelConfig
from .balance import BalanceResult, balance as _balance
from .layer_costs import LayerCosts, default_layer_costs, load_layer_costs
from .layout import Partition, PartitionError, from_counts, from_layers_per_device, parse_counts, uniform


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    """A partition, the layer costs it was made from, and the balancer's report if one ran."""

    partition: Partition
    layer_costs: LayerCosts
    how: str
    """'uniform', 'layers-per-device' or 'balanced (<objective>)'"""
    balance: BalanceResult | None = None

    def costs(self, base: Costs | None = None) -> Costs:
        base = base or Costs()
        out = self.layer_costs.costs(self.partition, comm=base.comm, overlap=base.overlap)
        if isinstance(base.a2a_F, (int, float)) and isinstance(base.a2a_B, (int, float)) and (base.a2a_F or base.a2a_B):
            # the all-to-all of an average chunk (docs/moe.md), shared out by each chunk's layers like its compute
            n = [len(ch) for ch in self.partition.chunks]
            avg = sum(n) / len(n)
            out = replace(out, a2a_F=tuple(base.a2a_F * k / avg for k in n),
                          a2a_B=tuple(base.a2a_B * k / avg for k in n))
        return out

    def apply(self, spec: PlanSpec) -> PlanSpec:
        """``spec`` with per-chunk costs and memory from this partition (comm, overlap, limit kept)."""
        if spec.pp != self.partition.pp or spec.vpp != self.partition.vpp:
            raise PartitionError(f"partition is for pp={self.partition.pp} vpp={self.partition.vpp} but the plan "
                                 f"asks pp={spec.pp} vpp={spec.vpp}")
        return replace(spec, costs=self.costs(spec.costs), mem=self.layer_costs.mem_model(self.partition))


def make_partition(*, pp: int, vpp: int = 1, placement: Placement | str = Placement.INTERLEAVED,
                   layers: int | None = None, layers_per_device: Sequence[int] | str | None = None,
                   layers_per_chunk: Sequence[int] | str | None = None, layer_costs: LayerCosts | str | None = None, base_costs: Costs | None = None,
                   vocab: int | None = None, hidden: int | None = None, seq: int | None = None,
                   model: ModelConfig | None = None, balance: str | None = None, schedule: str | None = None, microbatches: int | None = None,
                   mem_limit: float | None = None, embedding: bool = True, head: bool = True,
                   max_evals: int = 400, options: dict | None = None,
                   progress: Callable[[int], None] | None = None) -> PartitionPlan:
    """Resolve the partition options (the ``--layers ...`` family) into a :class:`PartitionPlan`.

    Layer count: ``layers``, else the length of ``layers_per_device``' sum, else of the cost file.
    Layer costs: the file, else :func:`default_layer_costs` from ``base_costs`` (+ vocab/hidden, or
    ``model``: a :class:`~pipeloom.models.config.ModelConfig` whose layer count is the default).
    Split: ``layers_per_chunk`` (every global chunk's count, e.g. the split ``tune`` chose),
    ``layers_per_device`` (dealt round-robin over each device's chunks), ``balance`` ('bottleneck' or
    'makespan', see :mod:`.balance`), else uniform (counts differ by at most one, extras first).
    """
    placement = Placement(placement)
    nc = pp * vpp
    if isinstance(layers_per_device, str):
        layers_per_device = parse_counts(layers_per_device)
    if isinstance(layers_per_chunk, str):
        layers_per_chunk = parse_counts(layers_per_chunk)
    if layers_per_chunk is not None:
        if layers_per_device is not None or balance:
            raise PartitionError("--layers-per-chunk gives the split itself; drop --layers-per-device and --balance")
        if len(layers_per_chunk) != nc:
            raise PartitionError(f"--layers-per-chunk gives {len(layers_per_chunk)} counts but pp*vpp = {pp}*{vpp} = "
                                 f"{nc} chunks; give one count per global chunk")
        if layers is None and layer_costs is None and model is None:
            layers = sum(layers_per_chunk)
    if isinstance(layer_costs, str):
        layer_costs = load_layer_costs(layer_costs)
    if model is not None:
        if layer_costs is not None:
            raise PartitionError("--model costs the layers; --layer-costs gives them from a file: use one of the two")
        if vocab is not None or hidden is not None:
            raise PartitionError("--model gives the vocabulary and hidden size; drop --vocab/--hidden")
        if layers is not None and layers != model.layers:
            raise PartitionError(f"--layers is {layers} but model {model.name} has {model.layers} layers; drop "
                                 f"--layers (the model's count is used)")
        if layers_per_device is None:
            layers = model.layers
    elif seq is not None and vocab is None and hidden is None:
        raise PartitionError("--seq only refines the head cost made from --vocab and --hidden; give them too "
                             "(or drop --seq)")
    if layers is not None and (not isinstance(layers, int) or isinstance(layers, bool) or layers < 1):
        raise PartitionError(f"--layers must be an integer >= 1, got {layers!r}")
    if layers is not None:
        check_at_most("--layers", layers, MAX_LAYERS)
    check_at_most("--max-evals", max_evals, MAX_EVALS)
    if layer_costs is not None:
        if base_costs is not None and not base_costs.is_uniform():
            raise PartitionError("--costs gives per-chunk F/B/W lists but --layer-costs sets every chunk's costs; "
                                 "give only comm (and overlap) in --costs")
        if vocab is not None or hidden is not None:
            raise PartitionError("--vocab/--hidden cost the head only without --layer-costs; put the head in the "
                                 "layer-cost file instead")
        if layers is not None and layers != layer_costs.num_layers:
            raise PartitionError(f"--layers is {layers} but the layer-cost file lists {layer_costs.num_layers} "
                                 f"layers; make them agree (or drop --layers)")
        layers = layer_costs.num_layers
    if layers is None and layers_per_device is not None:
        layers = sum(layers_per_device)
    if layers is None:
        raise PartitionError("give the layer count: --layers L, --layers-per-device or --layer-costs FILE")
    if layers < nc:
        raise PartitionError(f"{layers} layers cannot fill pp*vpp = {pp}*{vpp} = {nc} chunks (each needs >= 1 "
                             f"layer); use --layers >= {nc} or fewer devices/chunks")
    if layer_costs is None:
        if model is not None:
            if layers != model.layers:
                raise PartitionError(f"--layers-per-device sums to {layers} layers but model {model.name} has "
                                     f"{model.layers}; make them agree")
            layer_costs = default_layer_costs(layers, nc, base_costs, model=model, seq=seq)
        else:
            layer_costs = default_layer_costs(layers, nc, base_costs, vocab=vocab, hidden=hidden, seq=seq)
    base = base_costs or Costs()
    if balance:
        if layers_per_device is not None:
            raise PartitionError("--balance chooses the layer counts itself; drop --layers-per-device (or --balance)")
        res = _balance(layer_costs, pp, vpp, placement, objective=balance, schedule=schedule,
                       microbatches=microbatches, comm=base.comm, overlap=base.overlap, mem_limit=mem_limit,
                       embedding=embedding, head=head, max_evals=max_evals, options=options, progress=progress)
        return PartitionPlan(res.partition, layer_costs, f"balanced ({balance})", res)
    if layers_per_chunk is not None:
        if sum(layers_per_chunk) != layers:
            raise PartitionError(f"--layers-per-chunk sums to {sum(layers_per_chunk)} layers but the model has "
                                 f"{layers}; make them agree")
        part = from_counts(layers_per_chunk, pp, vpp, placement, embedding=embedding, head=head)
        return PartitionPlan(part, layer_costs, "layers-per-chunk")
    if layers_per_device is not None:
        part = from_layers_per_device(layers_per_device, pp, vpp, placement, num_layers=layers,
                                      embedding=embedding, head=head)
        return PartitionPlan(part, layer_costs, "layers-per-device")
    return PartitionPlan(uniform(layers, pp, vpp, placement, embedding=embedding, head=head), layer_costs, "uniform")


def partition_from_settings(settings, *, pp: int, vpp: int = 1, placement: Placement | str = Placement.INTERLEAVED,
                            base_costs: Costs | None = None, schedule: str | None = None,
                            microbatches: int | None = None, mem_limit: float | None = None,
                            options: dict | None = None, model: ModelConfig | None = None,
                            progress: Callable[[int], None] | None = None) -> PartitionPlan:
    """:func:`make_partition` of a settings file's ``[partition]`` section
    (:class:`pipeloom.core.config.PartitionSection`: what to cut and how) for a pipeline (``pp``, ``vpp``,
    placement, and the schedule a balance simulates). ``settings.model`` (a preset or a config.json) is
    resolved here unless ``model`` gives the :class:`~pipeloom.models.config.ModelConfig`. Errors name the
    section's fields."""
    from ..core.config import ConfigError, PartitionSection

    if not isinstance(settings, PartitionSection):
        raise ConfigError(f"expected a PartitionSection, got {type(settings).__name__}")
    if model is None and settings.model is not None:
        from ..models.hf_config import resolve_model
        try:
            model = resolve_model(settings.model)
        except ValueError as e:
            raise ConfigError(f"partition.model: {e}") from None
    balance = settings.balance
    if balance == "auto":
        balance = "makespan" if schedule else "bottleneck"
    try:
        return make_partition(pp=pp, vpp=vpp, placement=placement, layers=settings.layers,
                              layers_per_device=settings.layers_per_device,
                              layers_per_chunk=settings.layers_per_chunk, layer_costs=settings.layer_costs,
                              base_costs=base_costs, vocab=settings.vocab, hidden=settings.hidden, seq=settings.seq,
                              model=model, balance=balance, schedule=schedule, microbatches=microbatches,
                              mem_limit=mem_limit, options=options, progress=progress)
    except PartitionError as e:  # the keyword's flag name -> the section's field
        msg = re.sub(r"--([a-z-]+)", lambda m: "partition." + m.group(1).replace("-", "_"), str(e))
        raise ConfigError(msg) from None
