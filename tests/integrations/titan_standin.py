"""torchtitan 0.3.0's ``Trainer.Config`` as far as a pipeline plan sets it, for loading pipeloom's torchtitan files
through torchtitan's own ``ConfigManager`` here.

``torchtitan.trainer`` itself cannot be imported without its trainer dependencies (torchdata, triton, datasets;
the ``titan`` extra installs torchtitan without them), so this config keeps torchtitan's own section classes
(``TrainingConfig``, ``ParallelismConfig``, the ``activation_checkpoint`` union) and restates the checks
``Trainer.Config.__post_init__`` makes on them (torchtitan 0.3.0, ``torchtitan/trainer.py``)."""
from __future__ import annotations

from dataclasses import dataclass, field

from torchtitan.config import ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import ActivationCheckpointingConfig, SelectiveAC


@dataclass(kw_only=True, slots=True)
class StandInConfig:
    hf_assets_path: str = "."
    """ConfigManager._validate_config reads it"""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    activation_checkpoint: ActivationCheckpointingConfig = field(default_factory=SelectiveAC.Config)

    def __post_init__(self):
        # trainer.py, Trainer.Config.__post_init__ (torchtitan 0.3.0)
        mbs = self.parallelism.pipeline_parallel_microbatch_size
        if mbs <= 0:
            raise ValueError("parallelism.pipeline_parallel_microbatch_size must be greater than 0.")
        if self.parallelism.pipeline_parallel_degree > 1 and self.training.local_batch_size % mbs != 0:
            raise ValueError("training.local_batch_size must be evenly divisible by "
                             "parallelism.pipeline_parallel_microbatch_size when pipeline parallelism is enabled.")
        # trainer.py, Trainer.Config._validate_cuda_graphs
        if not self.training.disable_cuda_graphs and self.parallelism.pipeline_parallel_degree > 1:
            raise ValueError("CUDA graphs do not support pipeline parallelism yet. Set --training.disable_cuda_graphs.")


def base() -> StandInConfig:
    """A config function as torchtitan's registries hold them (``--module titan_standin --config base``)."""
    return StandInConfig()
