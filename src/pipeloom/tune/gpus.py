"""GPU presets and link figures for the tuner (no torch).

Peak dense BF16 tensor-core FLOP/s and HBM sizes are the vendor's datasheet figures (NVIDIA H100 SXM5,
H200 SXM, A100 SXM4 80GB); memory is what ``nvidia-smi`` reports as total. Link defaults: NVLink
bus bandwidth an all-reduce reaches inside a node (NCCL's "busbw", about 80% of the per-direction
NVLink figure) and one InfiniBand NIC per GPU between nodes (400 Gb/s on H100/H200 systems, 200 Gb/s on
A100 DGX). Latencies are per message (one ring step). Every figure can be replaced on the command line
or by a calibration file (see :mod:`pipeloom.tune.calibration`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..sim.dp import Link  # THE link type (bandwidth bytes/s, latency s per message), shared with the dp model

MiB = 1024 ** 2
GiB = 1024 ** 3


class GPUError(ValueError):
    """Unknown preset or a bad figure (one line naming what is allowed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GPU:
    name: str
    peak_flops: float
    """dense BF16 tensor-core FLOP/s"""
    memory: int
    """bytes of device memory"""
    hbm_bandwidth: float
    """bytes/s of device memory (the optimizer step is bound by it)"""
    intra: Link
    """inside a node (NVLink)"""
    inter: Link
    """between nodes (one NIC per GPU)"""
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        if not (self.peak_flops > 0 and self.memory > 0 and self.hbm_bandwidth > 0):
            raise GPUError(f"GPU {self.name}: peak FLOP/s, memory and HBM bandwidth must be > 0")
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise GPUError(f"gpus per node must be an integer >= 1, got {self.gpus_per_node!r}")

    def to_dict(self) -> dict:
        return {"name": self.name, "peak_flops": self.peak_flops, "memory": self.memory,
                "hbm_bandwidth": self.hbm_bandwidth, "gpus_per_node": self.gpus_per_node,
                "intra": {"bandwidth": self.intra.bandwidth, "latency": self.intra.latency},
                "inter": {"bandwidth": self.inter.bandwidth, "latency": self.inter.latency}}


GPUS: dict[str, GPU] = {
    # H100 SXM5: 989.4 TFLOP/s dense BF16, 80 GB HBM3 (81,559 MiB), 3.35 TB/s; NVLink 4 450 GB/s per direction;
    # 8 x 400 Gb/s InfiniBand NDR per node
    "h100": GPU(name="h100", peak_flops=989.4e12, memory=81559 * MiB, hbm_bandwidth=3.35e12,
                intra=Link(bandwidth=360e9, latency=5e-6), inter=Link(bandwidth=45e9, latency=10e-6)),
    # H200 SXM: same compute as H100, 141 GB HBM3e (143,771 MiB), 4.8 TB/s
    "h200": GPU(name="h200", peak_flops=989.4e12, memory=143771 * MiB, hbm_bandwidth=4.8e12,
                intra=Link(bandwidth=360e9, latency=5e-6), inter=Link(bandwidth=45e9, latency=10e-6)),
    # H800 SXM: H100 compute and memory, NVLink cut to 400 GB/s; the figures DeepSeek-V3's report (arXiv 2412.19437,
    # sec. 3.2.2) gives for its cluster: NVLink 160 GB/s and InfiniBand 50 GB/s per GPU achieved
    "h800": GPU(name="h800", peak_flops=989.4e12, memory=81559 * MiB, hbm_bandwidth=3.35e12,
                intra=Link(bandwidth=160e9, latency=5e-6), inter=Link(bandwidth=50e9, latency=10e-6)),
    # A100 SXM4 80GB: 312 TFLOP/s dense BF16, 81,920 MiB, 2.039 TB/s; NVLink 3 300 GB/s per direction;
    # 8 x 200 Gb/s InfiniBand HDR per node
    "a100-80g": GPU(name="a100-80g", peak_flops=312e12, memory=81920 * MiB, hbm_bandwidth=2.039e12,
                    intra=Link(bandwidth=240e9, latency=5e-6), inter=Link(bandwidth=22.5e9, latency=10e-6)),
}


def gpu_preset(name: str) -> GPU:
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise GPUError(f"unknown GPU preset {name!r}; choose one of: {', '.join(GPUS)} (or give --gpu-flops and "
                       f"--gpu-memory)") from None


def with_overrides(gpu: GPU, **kw) -> GPU:
    """``gpu`` with the given fields replaced (None values ignored); links as (bandwidth, latency) pairs."""
    fields = {k: v for k, v in kw.items() if v is not None and k in ("peak_flops", "memory", "hbm_bandwidth",
                                                                     "gpus_per_node", "name")}
    intra, inter = gpu.intra, gpu.inter
    if kw.get("intra_bandwidth") is not None or kw.get("intra_latency") is not None:
        intra = Link(bandwidth=kw.get("intra_bandwidth") or intra.bandwidth,
                     latency=intra.latency if kw.get("intra_latency") is None else kw["intra_latency"])
    if kw.get("inter_bandwidth") is not None or kw.get("inter_latency") is not None:
        inter = Link(bandwidth=kw.get("inter_bandwidth") or inter.bandwidth,
                     latency=inter.latency if kw.get("inter_latency") is None else kw["inter_latency"])
    return replace(gpu, intra=intra, inter=inter, **fields)


#: the plausible range of each hardware figure a user or a calibration file gives (low, high, unit): wide
#: enough for any CPU or accelerator of the next decades, narrow enough that a typo (1e-300, 1e30) is caught
#: before it turns into times that overflow the cost model
FIGURE_RANGES: dict[str, tuple[float, float, str]] = {
    "flops": (1e6, 1e18, "FLOP/s"),          # a slow CPU core .. 1000 x an H100
    "bandwidth": (1e3, 1e15, "bytes/s"),     # 1 KB/s (a loaded CPU run's gloo P2P is ~1e7) .. 1 PB/s
    "latency": (0.0, 10.0, "s"),             # per message
    "efficiency": (1e-4, 1.0, "of peak"),
}


def check_figure(label: str, value: float, kind: str) -> float:
    """``value`` when it lies in :data:`FIGURE_RANGES` ``[kind]``, else a one-line :class:`GPUError` naming
    ``label`` (the option or calibration key) and the range."""
    lo, hi, unit = FIGURE_RANGES[kind]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (lo <= value <= hi):
        shown = f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(value)
        raise GPUError(f"{label} = {shown} is outside the plausible range {lo:g} to {hi:g} {unit}")
    return float(value)


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` >= 1 in increasing order, by trial division up to sqrt(n) (a million steps for
    n = 10^12, where counting to n never ends)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise GPUError(f"divisors of {n!r}: need an integer >= 1")
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


__all__ = ["FIGURE_RANGES", "GPU", "GPUError", "GPUS", "GiB", "Link", "MiB", "check_figure", "divisors", "gpu_preset",
           "with_overrides"]
