"""The Megatron-LM arguments pipeloom writes, checked by Megatron's own code: Megatron-Core's
``TransformerConfig`` (its ``__post_init__`` checks of the split, virtual stages and layout) and
``PipelineParallelLayerLayout`` parser, and Megatron-LM's training-argument rules, restated in
``examples/megatron_args.py`` from NVIDIA/Megatron-LM ``megatron/training/arguments.py`` (``validate_args``,
commit 000c4ac24f61159c138b0975def722c65245983c; that file is not in the megatron-core package). The layers
Megatron-Core builds per (rank, virtual stage) must be the plan's. Skipped where megatron-core is not installed
(the ``megatron`` extra)."""
from __future__ import annotations

import importlib.util
import itertools
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed": not needed here
    pytest.importorskip("megatron.core.transformer.transformer_config")

from pipeloom.core.ir import Placement  # noqa: E402
from pipeloom.integrations.megatron import MEGATRON_ORDERS, megatron_args, megatron_counts  # noqa: E402
from pipeloom.integrations.megatron import parse_args as _parse  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "megatron_args.py"


def _example():
    spec = importlib.util.spec_from_file_location("megatron_args_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


EX = _example()


def _megatron_split(args: list[str]) -> tuple[list[int], int]:
    a = _parse(args)
    assert not EX.megatron_lm_problems(a), EX.megatron_lm_problems(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = EX.transformer_config(a)
    return EX.layers_per_chunk(cfg), cfg.virtual_pipeline_model_parallel_size or 1


def _cases():
    """(pp, vpp, split) over even splits, the shapes the named flags express, and arbitrary ones."""
    out = []
    for pp, vpp in itertools.product((1, 2, 3, 4, 8), (1, 2, 3, 4)):
        n = pp * vpp
        out.append((pp, vpp, [4] * n))                                     # even
        if n > 1:
            out.append((pp, vpp, [3] + [4] * (n - 2) + [3]))                # embedding and loss counted as layers
            out.append((pp, vpp, [3] * (n // 2) + [2] * (n - n // 2)))      # tune's 70B pick
            out.append((pp, vpp, [1 + (k * 7) % 5 for k in range(n)]))     # arbitrary
        if pp > 2:
            out.append((pp, vpp, [2 * (c % pp == 0) + 4 for c in range(n)]))  # a heavier first rank
    return out


CASES = _cases()


@pytest.mark.parametrize("pp, vpp, split", CASES, ids=[f"pp{p}-vpp{v}-{'.'.join(map(str, s))}" for p, v, s in CASES])
def test_megatron_accepts_the_arguments_and_builds_the_plans_split(pp, vpp, split):
    for placement, schedule in ((Placement.INTERLEAVED, "interleaved" if vpp > 1 else "1f1b"),
                                (Placement.V, "zbv")):
        if placement is Placement.V and vpp != 2:
            continue
        mg = megatron_args(pp=pp, vpp=vpp, placement=placement, seg_layer_num=split, schedule=schedule,
                           microbatches=2 * pp)
        a = _parse(mg.args)
        assert sum(f in a for f in ("--num-virtual-stages-per-pipeline-rank", "--pipeline-model-parallel-layout",
                                    "--num-layers-per-virtual-pipeline-stage")) <= 1
        got, got_vpp = _megatron_split(mg.args)
        if pp == 1:  # no pipeline: no virtual stages, one chunk (Megatron's non-pipelined schedule refuses more)
            assert got == [sum(split)] and got_vpp == 1 and "--num-virtual-stages-per-pipeline-rank" not in a
            continue
        assert got == split and got_vpp == vpp == mg.vpp  # a V plan keeps its chunks per rank
        assert mg.split == split


def test_the_simplest_form_is_written():
    def flags(split, pp, vpp=1):
        return set(_parse(megatron_args(pp=pp, vpp=vpp, placement=Placement.INTERLEAVED, seg_layer_num=split,
                                        schedule="interleaved", microbatches=8).args))

    assert "--pipeline-model-parallel-layout" not in flags([4] * 8, 4, 2)
    f = flags([3, 4, 4, 3], 4)
    assert {"--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"} <= f
    f = flags([6, 4, 4, 6], 4)
    assert {"--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"} <= f
    assert "--pipeline-model-parallel-layout" in flags([1, 2, 3, 4], 4)


def test_pp2_with_virtual_stages_gets_overlap_p2p_comm():
    mg = megatron_args(pp=2, vpp=4, placement=Placement.INTERLEAVED, seg_layer_num=[4] * 8, schedule="interleaved",
                       microbatches=8)
    assert "--overlap-p2p-comm" in _parse(mg.args)
    a = _parse(mg.args)
    del a["--overlap-p2p-comm"]
    assert EX.megatron_lm_problems(a)  # Megatron-LM refuses it without


def test_megatron_counts_restates_megatron_core():
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig
    import torch

    for pp, vpp, L in itertools.product((2, 3, 4), (1, 2), (10, 12, 22)):
        for kw in ({}, {"embedding": True, "loss": True}, {"first": 4, "last": 2}, {"first": 6}):
            want = megatron_counts(L, pp, vpp, **kw)
            ck = dict(num_layers=L, hidden_size=64, num_attention_heads=8, pipeline_dtype=torch.float32,
                      pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
                      num_layers_in_first_pipeline_stage=kw.get("first"),
                      num_layers_in_last_pipeline_stage=kw.get("last"),
                      account_for_embedding_in_pipeline_split=kw.get("embedding", False),
                      account_for_loss_in_pipeline_split=kw.get("loss", False))
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    cfg = TransformerConfig(**ck)
                got = [get_num_layers_to_build(cfg, vp_stage=(c // pp) if vpp > 1 else None, pp_rank=c % pp)
                       for c in range(pp * vpp)]
            except (ValueError, AssertionError):
                got = None
            assert want == got, (pp, vpp, L, kw)


def test_orders_megatron_runs_are_named_and_the_others_say_so():
    assert set(MEGATRON_ORDERS) == {"1f1b", "interleaved"}
    for sched in ("zbv", "zbvpp", "zbh1", "dualpipev"):
        mg = megatron_args(pp=4, vpp=2, placement=Placement.V if sched in ("zbv", "dualpipev") else
                           Placement.INTERLEAVED, seg_layer_num=[2] * 8, schedule=sched, microbatches=8)
        assert any(f"Megatron has no {sched} order" in n for n in mg.notes)
    mg = megatron_args(pp=4, vpp=2, placement=Placement.INTERLEAVED, seg_layer_num=[2] * 8, schedule="interleaved",
                       microbatches=8)
    assert mg.notes == []
