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

* **Tensor parallelism** (``--tp N``): each rank runs ``1/N`` of every GEMM (column/row-parallel linears,
  the vocabulary-parallel head), so a rank's FLOPs are the layer's over ``N``. The seconds per chunk pass stay
  the measured job times (as without TP; per chunk and kind the slowest TP rank's,
  :func:`pipeloom.trace.tp_costs.fit_tp_chunk_costs`); the FLOP/s are computed from them minus the time the jobs waited on
  tensor-parallel collectives (the ``tp_comm`` of each job in the logs, :func:`tp_wait_per_chunk_pass`), which
  is recorded apart under ``measured.tp`` so that the tuner's TP terms do not count it twice.

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
                         what: str = "", tp: int = 1, tp_wait: dict | None = None,
                         tp_info: dict | None = None) -> dict:
    """The calibration JSON object (see :class:`pipeloom.tune.costs.Calibration`) of one measured run; with
    ``tp > 1`` the FLOPs are one TP rank's and ``tp_wait`` ({kind: seconds per chunk pass}, from
    :func:`tp_wait_per_chunk_pass`) is taken out of the compute seconds and recorded with ``tp_info``."""
    from ..trace.tp_costs import fit_tp_chunk_costs

    costs = fit_tp_chunk_costs(run_log, tp, unit=1.0)  # seconds per chunk pass (with TP: the slowest TP rank's)
    nc = len(layers_per_chunk)
    dF, dB, dW = costs.per_chunk(nc)
    tokens = microbatch_size * seq_len
    lf = _flops.layer_flops(model, tokens, seq=seq_len)
    hf = _flops.head_flops(model, tokens)
    flops = {k: 0.0 for k in "FBW"}
    secs = {"F": sum(dF), "B": sum(dB), "W": sum(dW)}
    for c, n in enumerate(layers_per_chunk):
        for i, k in enumerate("FBW"):
            flops[k] += (n * lf[i] + (hf[i] if c == nc - 1 else 0.0)) / tp
    waited = {k: sum((tp_wait or {}).get(k, [])) for k in "FBW"}
    raw = dict(secs)
    secs = {k: secs[k] - waited[k] if secs[k] > waited[k] else secs[k] for k in "FBW"}  # compute, not the wait
    per_kind = {k: flops[k] / secs[k] for k in "FBW" if secs[k] > 0}
    total = sum(flops.values()) / sum(secs.values())
    measured: dict = {"flops_per_s": per_kind, "seconds_per_chunk_pass": {"F": dF, "B": dB, "W": dW},
                      "hidden": model.hidden,  # where the run sits on tune.costs.shape_efficiency's curve
                      "flops_per_chunk_pass": {k: flops[k] / nc for k in "FBW"}}
    if tp > 1:
        measured["tp"] = {"ranks": tp, **(tp_info or {}),
                          "wait_seconds_per_chunk_pass": {k: list((tp_wait or {}).get(k, [0.0] * nc)) for k in "FBW"},
                          "wait_share": {k: waited[k] / raw[k] for k in "FBW" if raw[k] > 0}}
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


def tp_wait_per_chunk_pass(root: str, nchunks: int) -> dict[str, list[float]]:
    """{kind: [per chunk]} median seconds a job waited on tensor-parallel collectives (the ``tp_comm`` of the
    job events in the worker logs under ``root``; a fused BW counts half to B, half to W, as the job fit does);
    0 where no job of that kind and chunk logged a wait."""
    import json
    import statistics

    from ..core.files import read_input
    from ..trace.reader import find_worker_logs
    seen: dict[tuple[str, int], list[float]] = {}
    for _, _, path in find_worker_logs(root):
        for line in str(read_input(path, "worker log")).splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if not isinstance(ev, dict) or ev.get("event") != "job" or "tp_comm" not in ev:
                continue
            kind, chunk, w = ev.get("kind"), ev.get("chunk"), float(ev["tp_comm"])
            for k, share in ((("B", 0.5), ("W", 0.5)) if kind == "BW" else ((kind, 1.0),)):
                if k in ("F", "B", "W") and isinstance(chunk, int) and 0 <= chunk < nchunks:
                    seen.setdefault((k, chunk), []).append(w * share)
    return {k: [statistics.median(seen[(k, c)]) if (k, c) in seen else 0.0 for c in range(nchunks)] for k in "FBW"}


__all__ = ["WIRE_BYTES", "calibration_from_run", "tp_wait_per_chunk_pass"]
