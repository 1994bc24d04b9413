"""Pictures of a what-if straggler analysis: a workers x steps heatmap (matplotlib, imported when drawing)
and measured vs what-if op timelines as one Chrome/Perfetto trace (plain JSON).

Drawing only: the numbers come from :mod:`pipeloom.trace.ops.whatif`.
"""
from __future__ import annotations

import json
import os

from ..core.files import atomic_write
from .perfetto import _meta, _thread

# chrome://tracing reserved colour names per optype family
_OP_CNAME = {"forward-compute": "rail_response", "backward-compute": "rail_animation", "forward-send": "grey",
             "backward-send": "grey", "forward-recv": "light_memory_dump", "backward-recv": "light_memory_dump",
             "grads-reduce-scatter": "terrible", "params-all-gather": "bad", "optimizer": "good"}


def draw_heatmap(path: str, values, row_labels: list[str], steps: list[int], *, title: str = "",
                 marked: list[int] | None = None) -> str:
    """Workers (rows) x steps (columns) coloured by slowdown (1 = white, darker = slower); ``marked`` rows are
    labelled in red. ``values``: 2-D array-like (rows x steps). Writes PNG/SVG/PDF by extension."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    v = np.asarray(values, dtype=float)
    rows, cols = v.shape
    h = min(40.0, max(2.5, 0.22 * rows + 1.5))
    w = min(30.0, max(5.0, 0.25 * cols + 3.0))
    fig, ax = plt.subplots(figsize=(w, h))
    top = max(1.05, float(np.nanmax(v)) if v.size else 1.05)
    im = ax.imshow(v, aspect="auto", cmap="Reds", vmin=1.0, vmax=top, interpolation="nearest")
    every_r = max(1, rows // 60)
    every_c = max(1, cols // 40)
    ax.set_yticks(range(0, rows, every_r))
    ax.set_yticklabels([row_labels[i] for i in range(0, rows, every_r)], fontsize=7)
    ax.set_xticks(range(0, cols, every_c))
    ax.set_xticklabels([str(steps[i]) for i in range(0, cols, every_c)], fontsize=7)
    for lab, i in zip(ax.get_yticklabels(), range(0, rows, every_r)):
        if marked and i in marked:
            lab.set_color("red")
    ax.set_xlabel("step")
    ax.set_ylabel("worker (dp / pp)")
    ax.set_title(title or "slowdown the worker alone causes (S_w per step)", fontsize=9)
    fig.colorbar(im, ax=ax, label="S_w")
    fig.tight_layout()
    import io

    ext = os.path.splitext(path)[1].lower().lstrip(".") or "png"
    buf = io.BytesIO()
    try:
        fig.savefig(buf, dpi=110, format=ext)  # drawn whole in memory first: a failed write leaves the old file
    finally:
        plt.close(fig)
    with atomic_write(path, "wb") as fh:
        fh.write(buf.getvalue())
    return path


def op_timeline_trace(path: str, tracks: list[tuple[str, list[str], list[list[tuple]]]], *,
                      us_per_unit: float = 1000.0, info: dict | None = None) -> str:
    """Write a Chrome/Perfetto trace with one process per track (e.g. "measured", "what-if ideal"), one thread
    per worker; each op ``(name, start, end, args)`` is a complete event. Times in trace units (ms -> 1000)."""
    events: list[dict] = []
    for pid, (title, labels, rows) in enumerate(tracks):
        events += _meta(pid, title, pid)
        for tid, (label, ops) in enumerate(zip(labels, rows)):
            events += _thread(pid, tid, label, tid)
            for name, s, e, args in ops:
                events.append({"name": name, "cat": name, "ph": "X", "pid": pid, "tid": tid,
                               "ts": round(s * us_per_unit, 3), "dur": round((e - s) * us_per_unit, 3),
                               "cname": _OP_CNAME.get(name, "generic_work"), "args": args})
    data = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"generator": "pipeloom", **(info or {})}}
    with atomic_write(path) as fh:
        fh.write(json.dumps(data, separators=(",", ":")))  # dumps: the C encoder (json.dump streams in Python)
    return path
