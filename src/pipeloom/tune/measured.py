"""A calibration file from a measured run: what ``pipeloom run --calibrate FILE`` writes (no torch).

Inputs: the run's job logs (:mod:`pipeloom.trace`), the model it trained (a
:class:`~pipeloom.models.config.ModelConfig`), its micro-batch size and sequence length, and what the run's
ranks measured besides the jobs (the device, and with dp > 1 a timed all-reduce of a rank's gradient
bytes over its dp group: :func:`pipeloom.runtime.driver._measure_links`).

* **Achieved FLOP/s per pass.** Every chunk's F, B and W seconds are the medians of its timed jobs
  (:func:`pipeloom.trace.check.fit_chunk_costs`, the fit ``pipeloom run --costs measured`` plans with; a
  fused BW is split half and half); their FLOPs come from :mod:`pipeloom.models.flops` (the chunk's
  layers, plus the head's pass on the last chunk), as the tuner counts them. Achieved FLOP/s of a kind =
  its FLOPs over all chunks / its seconds over all chunks; ``achieved_flops`` = all FLOPs / all seconds.
* **P2P.** The comm latency the same fit gives (seconds added on a dependency between devices) for one
  activation message of ``micro-batch x seq x hidden`` values: seconds per byte = latency / bytes. One
  message size cannot separate a fixed latency from a bandwidth, so all of it is charged per byte.
* **DP all-reduce.** Bus bandwidth of the timed all-reduce: ``2 (d-1)/d bytes / seconds`` (the ring
  all-reduce formula of :func:`pipeloom.tune.costs.all_reduce` without its latency term).

The links of one machine are the tuner's ``intra`` link (its bandwidth from the DP all-reduce when the run
had dp > 1, else from the P2P figure; latency 0: already in the per-byte figure); nothing is measured
between machines. The device is recorded; how the tuner uses the figures (an efficiency of the GPU
preset's peak when the run was on that GPU, else the measured FLOP/s themselves) is
:meth:`pipeloom.tune.costs.Calibration.for_gpu`.
"""
from __future__ import annotations

from ..models import flops as _flops
from ..models.config import ModelConfig

#: bytes of one activation value on the wire, by the run's parameter dtype
WIRE_BYTES = {"fp32": 4, "bf16": 2}


def calibration_from_run(run_log, model: ModelConfig, *, microbatch_size: int, seq_len: int, dtype: str,
                         layers_per_chunk: list[int], device: dict, dp_allreduce: dict | None = None,
                         what: str = "") -> dict:
    """The calibration JSON object (see :class:`pipeloom.tune.costs.Calibration`) of one measured run."""
    from ..trace.check import fit_chunk_costs

    costs = fit_chunk_costs(run_log, unit=1.0)  # seconds per chunk pass
    nc = len(layers_per_chunk)
    dF, dB, dW = costs.per_chunk(nc)
    tokens = microbatch_size * seq_len
    lf = _flops.layer_flops(model, tokens, seq=seq_len)
    hf = _flops.head_flops(model, tokens)
    flops = {k: 0.0 for k in "FBW"}
    secs = {"F": sum(dF), "B": sum(dB), "W": sum(dW)}
    for c, n in enumerate(layers_per_chunk):
        for i, k in enumerate("FBW"):
            flops[k] += n * lf[i] + (hf[i] if c == nc - 1 else 0.0)
    per_kind = {k: flops[k] / secs[k] for k in "FBW" if secs[k] > 0}
    total = sum(flops.values()) / sum(secs.values())
    measured: dict = {"flops_per_s": per_kind, "seconds_per_chunk_pass": {"F": dF, "B": dB, "W": dW},
                      "hidden": model.hidden,  # where the run sits on tune.costs.shape_efficiency's curve
                      "flops_per_chunk_pass": {k: flops[k] / nc for k in "FBW"}}
    link = None
    if costs.comm > 0:
        nbytes = tokens * model.hidden * WIRE_BYTES.get(dtype, 4)
        measured["p2p"] = {"bytes": nbytes, "seconds": costs.comm, "seconds_per_byte": costs.comm / nbytes}
        link = nbytes / costs.comm
    if dp_allreduce:
        n, nbytes, t = dp_allreduce["ranks"], dp_allreduce["bytes"], dp_allreduce["seconds"]
        bus = 2 * (n - 1) / n * nbytes / t
        measured["dp_allreduce"] = {**dp_allreduce, "seconds_per_byte": t / nbytes, "bus_bandwidth": bus}
        link = bus
    out = {"achieved_flops": total, "device": device, "measured": measured,
           "source": f"pipeloom run --calibrate{': ' + what if what else ''} on {device.get('type', '?')} "
                     f"({device.get('name', '?')})"}
    if link is not None:
        out["intra"] = {"bandwidth": link, "latency": 0.0}
    return out


__all__ = ["WIRE_BYTES", "calibration_from_run"]
