"""Check the Megatron-LM arguments `pipeloom tune --out DIR` wrote (DIR/megatron_args.txt) with Megatron-Core's
own code, and print the layer split Megatron will build.

    pip install megatron-core==0.16.1          # imports on CPU; no GPU, Transformer Engine or Apex needed
    python examples/megatron_args.py DIR

1. Megatron-LM's own argument rules (``validate_args`` in megatron/training/arguments.py, which is not in the
   megatron-core package), restated in :func:`megatron_lm_problems`;
2. Megatron-Core's ``TransformerConfig`` built from the arguments as Megatron-LM maps them
   (``core_transformer_config_from_args``: ``--decoder-first-pipeline-num-layers`` ->
   ``num_layers_in_first_pipeline_stage``, ...), which runs Megatron-Core's own checks and parses the layout
   with its ``PipelineParallelLayerLayout``;
3. the decoder layers Megatron-Core builds on every (pipeline rank, virtual stage)
   (``transformer_block.get_num_layers_to_build``, or the parsed layout), compared with the plan's split.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
import warnings

#: where the restated rules come from
MEGATRON_LM_SOURCE = ("NVIDIA/Megatron-LM, megatron/training/arguments.py, validate_args "
                      "(commit 000c4ac24f61159c138b0975def722c65245983c)")


def read_args(path: str) -> dict:
    """``{flag: value}`` of a megatron_args.txt (a flag alone maps to True)."""
    with open(path, encoding="utf-8") as fh:
        toks = shlex.split(fh.read().replace("\\\n", " "))
    out, i = {}, 0
    while i < len(toks):
        flag = toks[i]
        if i + 1 < len(toks) and not toks[i + 1].startswith("--"):
            out[flag] = toks[i + 1]
            i += 2
        else:
            out[flag] = True
            i += 1
    return out


def megatron_lm_problems(a: dict) -> list[str]:
    """Megatron-LM's argument rules for pipeline parallelism, restated (see :data:`MEGATRON_LM_SOURCE`)."""
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    out = []
    pp = int(a.get("--pipeline-model-parallel-size", 1))
    layers = int(a["--num-layers"])
    vstage_flags = [f for f in ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                                "--pipeline-model-parallel-layout") if f in a]
    if len(vstage_flags) > 1:  # "No more than one of the following arguments can be set at the same time"
        out.append(f"more than one of {', '.join(vstage_flags)}")
    vpp = None
    if "--pipeline-model-parallel-layout" in a:
        n = PipelineParallelLayerLayout.get_num_stages_from_str(a["--pipeline-model-parallel-layout"])
        if n % pp:  # "The length of pipeline_model_parallel_layout must be divisible by pipeline_model_parallel_size"
            out.append(f"layout of {n} stages on pp={pp}")
        vpp = n // pp if n // pp > 1 else None
    elif "--num-virtual-stages-per-pipeline-rank" in a:
        vpp = int(a["--num-virtual-stages-per-pipeline-rank"])
        vpp = vpp if vpp > 1 else None
    elif "--decoder-first-pipeline-num-layers" not in a and "--decoder-last-pipeline-num-layers" not in a:
        n = layers + int("--account-for-embedding-in-pipeline-split" in a) + int("--account-for-loss-in-pipeline-split" in a)
        if n % pp:  # "Number of layers should be divisible by the pipeline-model-parallel size"
            out.append(f"{n} layers (with embedding/loss counted) not divisible by pp={pp}")
    if vpp is not None:
        # "When interleaved schedule is used, pipeline-model-parallel size should be greater than 1" (with
        # --overlap-p2p-comm), "... greater than 2 ..." (without)
        if "--overlap-p2p-comm" in a and pp <= 1:
            out.append(f"virtual stages with pp={pp}")
        if "--overlap-p2p-comm" not in a and pp <= 2:
            out.append(f"virtual stages with pp={pp} <= 2 and no --overlap-p2p-comm")
    return out


def transformer_config(a: dict):
    """Megatron-Core's TransformerConfig for the arguments (tiny widths; its __post_init__ checks the split)."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    vpp = a.get("--num-virtual-stages-per-pipeline-rank")
    first, last = a.get("--decoder-first-pipeline-num-layers"), a.get("--decoder-last-pipeline-num-layers")
    return TransformerConfig(
        num_layers=int(a["--num-layers"]), hidden_size=64, num_attention_heads=8, pipeline_dtype=torch.float32,
        tensor_model_parallel_size=int(a.get("--tensor-model-parallel-size", 1)),
        pipeline_model_parallel_size=int(a.get("--pipeline-model-parallel-size", 1)),
        virtual_pipeline_model_parallel_size=int(vpp) if vpp else None,
        pipeline_model_parallel_layout=a.get("--pipeline-model-parallel-layout"),
        num_layers_in_first_pipeline_stage=int(first) if first else None,
        num_layers_in_last_pipeline_stage=int(last) if last else None,
        account_for_embedding_in_pipeline_split="--account-for-embedding-in-pipeline-split" in a,
        account_for_loss_in_pipeline_split="--account-for-loss-in-pipeline-split" in a,
        sequence_parallel="--sequence-parallel" in a)


def layers_per_chunk(cfg) -> list[int]:
    """Decoder layers Megatron-Core builds per global chunk (chunk v * pp + r = virtual stage v of rank r)."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    pp = cfg.pipeline_model_parallel_size
    vpp = cfg.virtual_pipeline_model_parallel_size or 1
    out = [0] * (pp * vpp)
    for r in range(pp):
        for v in range(vpp):
            if cfg.pipeline_model_parallel_layout is not None:
                n = cfg.pipeline_model_parallel_layout.layout[r][v].count(LayerType.decoder)
            else:
                n = get_num_layers_to_build(cfg, vp_stage=v if vpp > 1 else None, pp_rank=r)
            out[v * pp + r] = n
    return out


def check(out_dir: str) -> dict:
    """Check DIR's Megatron arguments; returns what Megatron builds (raises on any problem)."""
    with open(os.path.join(out_dir, "launch.json"), encoding="utf-8") as fh:
        launch = json.load(fh)
    a = read_args(os.path.join(out_dir, "megatron_args.txt"))
    problems = megatron_lm_problems(a)
    assert not problems, f"Megatron-LM would refuse: {'; '.join(problems)}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformer_config(a)
    split = layers_per_chunk(cfg)
    plan = launch["config"]["seg_layer_num"] if launch["config"]["pp"] > 1 else [sum(launch["config"]["seg_layer_num"])]
    assert split == plan, f"Megatron builds {split} layers per chunk; the plan has {plan}"
    vpp = cfg.virtual_pipeline_model_parallel_size or 1
    print(f"Megatron-Core accepts {os.path.join(out_dir, 'megatron_args.txt')}: pp={cfg.pipeline_model_parallel_size} "
          f"virtual stages={vpp}, decoder layers per chunk {split} (the plan's)")
    if launch.get("megatron_note"):
        print(f"note: {launch['megatron_note']}")
    return {"split": split, "vpp": vpp, "pp": cfg.pipeline_model_parallel_size}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    check(sys.argv[1])
