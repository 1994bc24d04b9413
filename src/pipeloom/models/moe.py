"""Expert and context parallelism of a mixture-of-experts model: the layout rules, the process-group sizes,
the routed experts' parameters and the load a device's experts carry (no torch).

Layout (Megatron-Core's rank order ``tp-cp-ep-dp-pp``, ``parallel_state.initialize_model_parallel``)::

    world           = tp * cp * dp * pp
    dense layers    tp-way tensor parallel, cp-way context parallel, gradients reduced over dp * cp ranks
    MoE layers      the expert-parallel group of ep ranks is carved out of the dp * cp ranks (EP taken from
                    within DP, as Megatron does): ep must divide dp * cp; each rank holds experts / ep routed
                    experts, still split tp ways (expert tensor parallel = tp); their gradients are reduced
                    over the expert-data-parallel group of dp * cp / ep ranks
    ZeRO-1          dense optimizer states sharded over dp (* cp), expert ones over dp * cp / ep

so that the ep ranks of one group are neighbours after tp: ``min(ep, gpus_per_node / tp)`` of them share a
node (:func:`ep_ranks_per_node`), which is what decides how much of the all-to-all crosses the network.

Load: a rank's experts receive ``tokens * k * load`` token copies per microbatch (``k`` = top-k) where
``load`` (:func:`load_factor`) is

* the **capacity factor** when one is given (GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2021): every
  expert's buffer is padded to ``capacity_factor * tokens * k / experts`` slots, computed and exchanged in
  full, tokens over it dropped;
* else (**dropless**, Megatron's ``--moe-token-dispatcher-type alltoall`` without capacity, DeepSeek-V3) the
  stated **imbalance assumption**: the busiest rank's load over the mean. 1.0 = balanced, which is what an
  auxiliary-loss-free balancer approaches over a step (DeepSeek-V3 report, sec. 2.1.2); every rank is then
  priced at the busiest one, since the all-to-all waits for it.
"""
from __future__ import annotations

import math

from .config import ModelConfig

#: the dispatch all-to-all's value width in bytes under FP8 (DeepSeek-V3 dispatches in FP8, combines in BF16)
FP8_BYTES = 1


class ParallelLayoutError(ValueError):
    """A parallel layout that cannot exist (one line: what is wrong and what is allowed)."""


def _pos_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ParallelLayoutError(f"{name} must be an integer >= 1, got {v!r}")
    return v


def check_ep(model: ModelConfig, *, ep: int, dp: int, cp: int = 1) -> None:
    """Megatron's rules for ``ep`` (module docstring): 1 for a dense model, else dividing the routed experts and
    ``dp * cp`` (the ranks it is carved out of)."""
    _pos_int("ep", ep)
    _pos_int("dp", dp)
    _pos_int("cp", cp)
    if ep == 1:
        return
    if not model.moe:
        raise ParallelLayoutError(f"ep={ep} needs a mixture-of-experts model; {model.name} is dense (ep must be 1)")
    if model.experts % ep:
        ok = [d for d in range(1, model.experts + 1) if model.experts % d == 0 and (dp * cp) % d == 0]
        raise ParallelLayoutError(f"ep={ep} does not divide the {model.experts} routed experts of {model.name}; "
                                  f"ep must divide both the experts and dp*cp={dp * cp}: one of {ok}")
    if (dp * cp) % ep:
        ok = [d for d in range(1, model.experts + 1) if model.experts % d == 0 and (dp * cp) % d == 0]
        raise ParallelLayoutError(f"ep={ep} does not divide dp*cp={dp * cp}: expert parallelism is carved out of the "
                                  f"data-parallel ranks (Megatron); ep must divide both the experts and dp*cp: one "
                                  f"of {ok}")


def group_sizes(*, tp: int = 1, cp: int = 1, ep: int = 1, dp: int = 1, pp: int = 1) -> dict[str, int]:
    """The process groups of a ``tp x cp x ep x dp x pp`` layout and their sizes (module docstring):
    ``world``, ``tp``, ``cp``, ``pp``, ``dp`` (dense gradients: dp * cp ranks), ``ep``, ``expert_dp``
    (expert gradients: dp * cp / ep ranks)."""
    for k, v in (("tp", tp), ("cp", cp), ("ep", ep), ("dp", dp), ("pp", pp)):
        _pos_int(k, v)
    if (dp * cp) % ep:
        raise ParallelLayoutError(f"ep={ep} does not divide dp*cp={dp * cp}")
    return {"world": tp * cp * dp * pp, "tp": tp, "cp": cp, "pp": pp, "dp": dp * cp, "ep": ep,
            "expert_dp": dp * cp // ep}


def ep_ranks_per_node(ep: int, tp: int, gpus_per_node: int, cp: int = 1) -> int:
    """Ranks of one expert-parallel group inside one node: the group's ranks are ``tp * cp`` apart (rank order
    ``tp-cp-ep-dp-pp``), so ``min(ep, gpus_per_node / (tp * cp))`` of them share a node (at least 1)."""
    stride = tp * cp
    return max(1, min(ep, gpus_per_node // stride if stride <= gpus_per_node else 1))


def load_factor(capacity_factor: float | None = None, imbalance: float = 1.0) -> float:
    """Token copies a rank's experts carry over the mean ``tokens * k`` (module docstring): the capacity factor
    if given, else the dropless imbalance assumption."""
    if capacity_factor is not None:
        if isinstance(capacity_factor, bool) or not (isinstance(capacity_factor, (int, float))
                                                     and math.isfinite(capacity_factor) and capacity_factor > 0):
            raise ParallelLayoutError(f"capacity factor must be a number > 0 (or none for dropless), got "
                                      f"{capacity_factor!r}")
        return float(capacity_factor)
    if isinstance(imbalance, bool) or not (isinstance(imbalance, (int, float)) and math.isfinite(imbalance)
                                           and imbalance >= 1):
        raise ParallelLayoutError(f"expert load imbalance (busiest rank over the mean) must be a number >= 1, "
                                  f"got {imbalance!r}")
    return float(imbalance)


# ------------------------------------------------------------------------------------- parameters
def routed_expert_params(model: ModelConfig, tp: int = 1) -> int:
    """Parameters of all routed experts of one MoE layer on one TP rank (0 for a dense layer): ``experts *
    (m*h*f_e [+ biases])`` split tp ways, as :func:`pipeloom.models.flops.mlp_params` counts them."""
    if not model.moe:
        return 0
    m, h, f = model.mlp_matrices, model.hidden, model.expert_ffn
    one = m * h * f // tp
    if model.mlp_bias and not hasattr(model, "kv_lora_rank"):  # DeepSeek's experts have no biases
        one += (m - 1) * f // tp + h
    return model.experts * one


def moe_layers(model: ModelConfig, first: int = 0, count: int | None = None) -> int:
    """MoE layers among the ``count`` layers from ``first`` (DeepSeek's first dense layers are not)."""
    from .flops import layer_groups

    count = model.layers - first if count is None else count
    n, start = 0, 0
    for k, m in layer_groups(model):
        lo, hi = max(start, first), min(start + k, first + count)
        if hi > lo and m.moe:
            n += hi - lo
        start += k
    return n


def expert_params(model: ModelConfig, first: int, count: int, *, tp: int = 1, ep: int = 1) -> int:
    """Routed-expert parameters one rank holds of the ``count`` layers from ``first``: ``experts / ep`` experts
    of each MoE layer, split tp ways."""
    return moe_layers(model, first, count) * routed_expert_params(model, tp) // ep


def ep_saving(model: ModelConfig, first: int, count: int, *, tp: int = 1, ep: int = 1) -> int:
    """Parameters a rank does NOT hold of those layers thanks to expert parallelism: the routed experts of the
    other ``ep - 1`` ranks of its group."""
    return moe_layers(model, first, count) * routed_expert_params(model, tp) - expert_params(
        model, first, count, tp=tp, ep=ep)


def dispatched_values(model: ModelConfig, tokens: float, *, load: float = 1.0) -> float:
    """Values one rank sends in one dispatch (or one combine) all-to-all of one MoE layer for ``tokens`` of its
    own tokens: one ``h``-wide copy per (token, chosen expert), ``tokens * k * h * load``; the fraction that
    leaves the rank is :func:`pipeloom.tune.moe_costs.all_to_all_seconds`' to split."""
    if not model.moe:
        return 0.0
    return float(tokens) * model.experts_per_token * model.hidden * load


__all__ = ["FP8_BYTES", "ParallelLayoutError", "check_ep", "dispatched_values", "ep_ranks_per_node", "ep_saving",
           "expert_params", "group_sizes", "load_factor", "moe_layers", "routed_expert_params"]
