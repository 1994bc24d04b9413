"""The expert / context parallel and FP8 arguments pipeloom writes for Megatron-LM, checked by Megatron-Core's own
``TransformerConfig.__post_init__`` (its rules for ``--overlap-moe-expert-parallel-comm``: expert parallelism,
the alltoall dispatcher, virtual stages when pp > 1, no full recompute, bf16). Skipped where megatron-core is not
installed (the ``megatron`` extra)."""
from __future__ import annotations

import dataclasses
import warnings

import pytest

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("megatron.core.transformer.transformer_config")

from pipeloom.core.ir import Placement  # noqa: E402
from pipeloom.integrations.megatron import megatron_args, parse_args  # noqa: E402

from test_megatron_args import EX  # noqa: E402


def _config(args: list[str]):
    """Megatron-Core's TransformerConfig for the written arguments with a 64-expert MoE (FP8 left to Transformer
    Engine, which is not installed here)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    a = parse_args(args)
    assert not EX.megatron_lm_problems(a), EX.megatron_lm_problems(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = EX.transformer_config(a)
        kw = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init}
        kw.update(num_moe_experts=64, moe_router_topk=2, bf16="--bf16" in a, params_dtype=torch.bfloat16,
                  expert_model_parallel_size=int(a.get("--expert-model-parallel-size", 1)),
                  context_parallel_size=int(a.get("--context-parallel-size", 1)),
                  moe_token_dispatcher_type=a.get("--moe-token-dispatcher-type", "allgather"),
                  moe_grouped_gemm="--moe-grouped-gemm" in a,
                  overlap_moe_expert_parallel_comm="--overlap-moe-expert-parallel-comm" in a,
                  delay_wgrad_compute="--delay-wgrad-compute" in a,
                  recompute_granularity=a.get("--recompute-granularity"), recompute_method=a.get("--recompute-method"),
                  recompute_num_layers=int(a["--recompute-num-layers"]) if "--recompute-num-layers" in a else None)
        return TransformerConfig(**kw)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("schedule,pp,vpp,placement", [("dualpipev", 4, 2, Placement.V), ("1f1b", 4, 1, Placement.INTERLEAVED),
                                                       ("dualpipev", 1, 2, Placement.V)])
def test_megatron_core_accepts_the_moe_arguments(recompute, schedule, pp, vpp, placement):
    mg = megatron_args(pp=pp, vpp=vpp, placement=placement, seg_layer_num=[6] * (pp * vpp), schedule=schedule,
                       microbatches=32, recompute=recompute, ep=8, cp=2, fp8=True)
    cfg = _config(mg.args)
    assert cfg.expert_model_parallel_size == 8 and cfg.context_parallel_size == 2
    a = parse_args(mg.args)
    assert a["--fp8-format"] == "hybrid"
    # the pairs of a DualPipeV plan become Megatron-Core's EP A2A overlap where it allows it
    assert cfg.overlap_moe_expert_parallel_comm == (schedule == "dualpipev" and recompute != "full")


def test_no_moe_arguments_without_expert_parallelism():
    mg = megatron_args(pp=2, vpp=1, placement=Placement.INTERLEAVED, seg_layer_num=[4, 4], schedule="1f1b",
                       microbatches=8)
    assert not any("expert" in x or "context-parallel" in x or "fp8" in x for x in mg.args)
