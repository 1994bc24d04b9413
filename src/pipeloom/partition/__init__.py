"""Layer partitioning: layers -> chunks -> devices, per-layer costs, cost balancing (no torch).

* :mod:`.layout`      -- :class:`Partition`, uniform / per-device / per-chunk constructors
* :mod:`.layer_costs` -- per-layer F/B/W/memory, embedding and head; reduction to per-chunk Costs
* :mod:`.balance`     -- exact bottleneck DP and makespan local search, optional memory budget
* :mod:`.wiring`      -- :func:`make_partition` (the CLI's ``--layers`` family), :func:`partition_from_settings`
  (a settings file's ``[partition]`` section) and PlanSpec wiring
"""
from .balance import BalanceResult, Evaluation, balance, bottleneck_dp, placement_of
from .layer_costs import (LayerCost, LayerCosts, default_layer_costs, head_ratios, layer_costs_from_csv,
                          layer_costs_from_dict, load_layer_costs)
from .layout import Partition, PartitionError, from_counts, from_layers_per_device, parse_counts, uniform
from .wiring import PartitionPlan, make_partition, partition_from_settings

__all__ = [
    "BalanceResult", "Evaluation", "LayerCost", "LayerCosts", "Partition", "PartitionError", "PartitionPlan",
    "balance", "bottleneck_dp", "default_layer_costs", "from_counts", "from_layers_per_device", "head_ratios",
    "layer_costs_from_csv", "layer_costs_from_dict", "load_layer_costs", "make_partition", "parse_counts",
    "partition_from_settings", "placement_of", "uniform",
]
