"""Load what `pipeloom tune --out DIR` wrote for torchtitan through torchtitan's own config code, and run the
plan's first step with torchtitan's own pipeline code on CPU/gloo ranks, with a tiny model of the plan's depth.

    pipeloom tune --model llama3-70b --gpus 512 --global-batch 512 --out plan/
    python examples/torchtitan_plan.py plan/

What it does, as torchtitan 0.3's trainer does it:

1. ``ConfigManager().parse_args(["--module", "pipeloom_torchtitan", "--config", "pipeloom_plan"])`` with DIR on
   ``sys.path``: torchtitan imports the config module pipeloom wrote and parses the config with tyro;
2. ``ParallelDims.from_config`` checks the degrees against the plan's world size (tp x pp x dp);
3. ``pipeline_llm`` (torchtitan/distributed/pipeline_parallel.py) splits a model into stages, places them on
   the ranks and builds the schedule from the plan's CSV; one step runs on pp gloo ranks (tp and dp are not run).

Rank 0 prints each rank's stages and layers, checks them against the plan (plan.json), and checks the losses
against the same model in one process.

The config starts from ``tiny_base`` below (``PIPELOOM_TORCHTITAN_BASE``), not from torchtitan's ``llama3_70b``:
torchtitan's ``Trainer.Config`` needs torchtitan's whole trainer installed (torchdata, triton, datasets, ...).
``TinyConfig`` holds the sections a pipeline plan sets (torchtitan's own ``TrainingConfig``,
``ParallelismConfig`` and ``activation_checkpoint`` choice) and makes ``Trainer.Config``'s checks on them.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import ActivationCheckpointingConfig, SelectiveAC

HERE = os.path.dirname(os.path.abspath(__file__))
DIM, VOCAB, SEQ = 8, 32, 4


@dataclass(kw_only=True, slots=True)
class TinyConfig:
    """The sections of torchtitan 0.3's ``Trainer.Config`` that a pipeline plan sets."""

    hf_assets_path: str = "."
    """read by ConfigManager's checks"""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    activation_checkpoint: ActivationCheckpointingConfig = field(default_factory=SelectiveAC.Config)

    def __post_init__(self):  # Trainer.Config.__post_init__'s checks on these sections (torchtitan 0.3.0)
        mbs = self.parallelism.pipeline_parallel_microbatch_size
        if mbs <= 0 or (self.parallelism.pipeline_parallel_degree > 1 and self.training.local_batch_size % mbs):
            raise ValueError("training.local_batch_size must be divisible by pipeline_parallel_microbatch_size > 0")
        if self.parallelism.pipeline_parallel_degree > 1 and not self.training.disable_cuda_graphs:
            raise ValueError("CUDA graphs do not support pipeline parallelism yet. Set --training.disable_cuda_graphs.")


def tiny_base() -> TinyConfig:
    """A config function as torchtitan's registries hold them."""
    return TinyConfig()


class TinyDecoder(nn.Module):
    """A decoder with torchtitan's module names (tok_embeddings, layers.N, norm, lm_head) whose forward
    tolerates the parts torchtitan's stage split removes."""

    def __init__(self, layers: int):
        super().__init__()
        torch.manual_seed(0)
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) for i in range(layers)})
        self.norm = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB)

    def forward(self, h):
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(h)
        for layer in self.layers.values():
            h = h + layer(h)
        if self.norm is not None:
            h = self.norm(h)
        return self.lm_head(h) if self.lm_head is not None else h


def loss_fn(logits, target):
    """torchtitan's loss functions return (loss, extra)."""
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1)), None


def data(batch: int):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (batch, SEQ), generator=g), torch.randint(0, VOCAB, (batch, SEQ), generator=g)


def load_config(out_dir: str):
    """The plan's config, loaded by torchtitan's ConfigManager from the files in ``out_dir``."""
    from torchtitan.config import ConfigManager

    for p in (HERE, os.path.abspath(out_dir)):
        if p not in sys.path:
            sys.path.insert(0, p)
    sys.modules.pop("pipeloom_torchtitan", None)  # another folder's module may be loaded already
    os.environ.setdefault("PIPELOOM_TORCHTITAN_BASE", "torchtitan_plan:tiny_base")
    return ConfigManager().parse_args(["--module", "pipeloom_torchtitan", "--config", "pipeloom_plan"])


class _PipelineDims:
    """What ``pipeline_llm`` reads of torchtitan's ``ParallelDims``: the pp degree and the pp mesh."""

    def __init__(self, pp: int, mesh):
        self.pp, self.mesh = pp, mesh

    def get_mesh(self, dims):
        return self.mesh


def rank_main(out_dir: str):
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.distributed.pipeline_parallel import pipeline_llm

    cfg = load_config(out_dir)
    par = cfg.parallelism
    depth = _layers_of_config()  # the model's depth: the plan's layer count
    mesh = init_device_mesh("cpu", (par.pipeline_parallel_degree,), mesh_dim_names=("pp",))
    schedule, parts, has_first, has_last = pipeline_llm(
        TinyDecoder(depth), parallel_dims=_PipelineDims(par.pipeline_parallel_degree, mesh), training=cfg.training,
        parallelism=par, compile_config=CompileConfig(), ac_config=None, dump_folder="", device=torch.device("cpu"),
        model_config=SimpleNamespace(layers=[None] * depth), parallelize_fn=lambda m, **kw: m, loss_fn=loss_fn)
    x, y = data(cfg.training.local_batch_size)
    losses: list = []
    schedule.step(*((x,) if has_first else ()), **({"target": y, "losses": losses} if has_last else {}))
    stages = [{"stage": st.stage_index, "layers": sorted(int(k) for k in part.layers.keys())}
              for st, part in zip(schedule._stages, parts)]
    mine = {"rank": dist.get_rank(), "stages": stages, "losses": [float(v.detach()) for v in losses],
            "class": type(schedule).__name__, "schedule_name": par.pipeline_parallel_schedule}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def _layers_of_config() -> int:
    import pipeloom_torchtitan

    return pipeloom_torchtitan.LAYERS


def check(out_dir: str, every: list) -> dict:
    """Compare what torchtitan built and ran with the plan; returns the facts (raises on a mismatch)."""
    from pipeloom.schedule.io import load

    plan = load(os.path.join(out_dir, "plan.json"))
    split = _launch(out_dir)["seg_layer_num"]
    starts = [sum(split[:k]) for k in range(len(split))]
    for r in every:
        got = [s["stage"] for s in r["stages"]]
        want = plan.chunks_of(r["rank"])
        assert sorted(got) == want, f"rank {r['rank']}: torchtitan built stages {got}; the plan places {want}"
        for s in r["stages"]:
            k = s["stage"]
            assert s["layers"] == list(range(starts[k], starts[k] + split[k])), \
                f"stage {k}: torchtitan gave layers {s['layers']}; the plan {split[k]} from layer {starts[k]}"
        print(f"rank {r['rank']}: stages {got}, layers per stage {[len(s['layers']) for s in r['stages']]}")
    # the same step in one process (torchtitan sums the microbatches' gradients: scale_grads=False)
    cfg_m = plan.microbatches
    model = TinyDecoder(sum(split))
    x, y = data(cfg_m * _launch(out_dir)["microbatch_size"])
    ref = [float(loss_fn(model(xm), ym)[0].detach()) for xm, ym in zip(x.chunk(cfg_m), y.chunk(cfg_m))]
    losses = [v for r in every for v in r["losses"]]
    diff = max(abs(a - b) for a, b in zip(losses, ref))
    assert len(losses) == cfg_m and diff < 1e-5, f"losses {losses} vs one process {ref}"
    print(f"torchtitan ran {every[0]['class']} ({every[0]['schedule_name']} placement) with {len(split)} stages "
          f"on {plan.pp} ranks, {cfg_m} microbatches; losses equal one process (largest difference {diff:.1e})")
    return {"stages": {r["rank"]: [s["stage"] for s in r["stages"]] for r in every}, "split": split,
            "losses": losses, "class": every[0]["class"]}


def _launch(out_dir: str) -> dict:
    """The plan's configuration as tune wrote it (launch.json)."""
    with open(os.path.join(out_dir, "launch.json"), encoding="utf-8") as fh:
        return json.load(fh)["config"]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    out_dir = argv[0]
    from pipeloom.runtime.launch import spawn
    from torchtitan.distributed import ParallelDims

    cfg = load_config(out_dir)
    par = cfg.parallelism
    launch = _launch(out_dir)
    world = launch["tp"] * launch["pp"] * launch["dp"]
    ParallelDims.from_config(par, world_size=world)  # torchtitan's own check of the degrees
    print(f"torchtitan loaded {out_dir}: pp={par.pipeline_parallel_degree} tp={par.tensor_parallel_degree} "
          f"dp_replicate={par.data_parallel_replicate_degree} dp_shard={par.data_parallel_shard_degree} "
          f"(world {world}), schedule CSV {os.path.basename(par.pipeline_parallel_schedule_csv)}, "
          f"{len(par.module_fqns_per_model_part or [])} stages named")
    every = spawn(rank_main, par.pipeline_parallel_degree, (out_dir,), timeout_s=300)
    check(out_dir, every)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
