"""``pipeloom tune``: search the parallel configuration of a training run (no torch).

* :mod:`.gpus`   -- GPU presets (peak BF16 FLOP/s, memory, HBM and link figures)
* :mod:`.costs`  -- the cost model: per-layer F/B/W seconds from FLOPs, TP/PP/DP collectives, optimizer,
                    and the calibration file
* :mod:`.search` -- enumeration, memory and time lower bounds, simulation in bound order, ranking
* :mod:`.launch` -- the chosen plan as files: schedule, Gantt, pipeloom/torchrun, torchtitan, Megatron-Core
"""
from .costs import Calibration, CalibrationError
from .gpus import GPU, GPUS, GPUError, Link, gpu_preset, with_overrides
from .search import Config, Problem, TuneError, TuneResult, tune

__all__ = ["Calibration", "CalibrationError", "Config", "GPU", "GPUError", "GPUS", "Link", "Problem", "TuneError",
           "TuneResult", "gpu_preset", "tune", "with_overrides"]
