"""Gantt chart of a :class:`~pipeloom.viz.timeline.Timeline` as PNG / SVG / PDF (matplotlib, no pyplot).

Layout: one row per device (or rank); each job a box coloured by kind (F blue, B orange,
W green, BW red) and shaded by local chunk, with its microbatch number when the box is wide
enough; the grey band behind the boxes is idle time. Under every row a thin strip draws the
device's activation memory (units of one full-stage microbatch activation) with its peak;
a dashed line marks the memory limit. The right margin gives each row's bubble (idle share).
Figure size grows with the number of jobs and rows (readable up to pp 16, m 64); a row of more
jobs than a 34-inch strip holds at a readable width (m 32 x vpp 4 has 384 per device) is cut into pages
stacked under each other, each a time window of about ``PAGE_JOBS`` jobs per row, so a box stays wide
enough for its microbatch number. Labels that do not fit their box are left out, and above
``LABEL_LIMIT`` jobs no box is labelled.
Boxes are drawn as one :class:`~matplotlib.collections.PolyCollection` (vertex arrays, not one
patch object per job), so a plan of 65k jobs draws in seconds.
"""
from __future__ import annotations

import os

from ..core.files import atomic_write
from .timeline import IDLE_COLOR, KIND_COLORS, KIND_NAMES, Timeline, shade

MEM_COLOR = "#7b68b5"
DP_COLOR = "#8c564b"
LATE_COLOR = "#d62728"
LATE_EDGE = "#111111"
WAIT_COLOR = "#888888"
LABEL_LIMIT = 20_000
"""above this many jobs no box gets its microbatch label (they would not fit, and text is slow)"""
MAX_WIDTH_IN = 34.0
"""the widest figure; a row with more jobs than fit at ``JOB_IN`` inches each is drawn in pages"""
JOB_IN = 0.115
"""inches per job of the busiest row (one page)"""
PAGE_JOBS = 100
"""jobs of the busiest row per page of a paged chart (about 0.3 inch, 35 px at 110 dpi, each)"""
MAX_PAGES = 12
PAGE_GAP_IN = 0.62
"""room between pages: the time axis of the page above and the next page's caption"""


def _boxes(xywh: list[tuple[float, float, float, float]]):
    """(n, 4, 2) vertices of axis-aligned boxes (x, y, width, height), in a Rectangle's vertex order."""
    import numpy as np

    a = np.asarray(xywh, dtype=float).reshape(-1, 4)
    x, y, w, h = a[:, 0], a[:, 1], a[:, 2], a[:, 3]
    return np.stack([np.stack([x, y], 1), np.stack([x + w, y], 1), np.stack([x + w, y + h], 1),
                     np.stack([x, y + h], 1)], 1)


def _rgba(colors: list[str]):
    """(n, 4) RGBA of colour names, each distinct name converted once (matplotlib would convert each item)."""
    import numpy as np
    from matplotlib.colors import to_rgba

    table = {c: to_rgba(c) for c in set(colors)}
    return np.array([table[c] for c in colors], dtype=float).reshape(-1, 4)


def _luminance(hex_color: str) -> float:
    r, g, b = (int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def legend_cols(n: int, width_in: float) -> int:
    return max(1, min(n, int(width_in // 2.6)))


def _legend_rows(tl: Timeline, width_in: float, with_memory: bool) -> int:
    n = len(tl.kinds()) + (tl.vpp if tl.vpp > 1 else 0) + 1 + (1 if with_memory else 0)
    n += (1 if with_memory and tl.mem_limit is not None else 0)
    n += any(b.wait > 0 for r in tl.rows for b in r.bars) + any(b.late > 0 for r in tl.rows for b in r.bars)
    n += any(tl.dp_bands)
    return -(-n // legend_cols(n, width_in))


def pages_of(tl: Timeline) -> int:
    """How many time windows (pages, stacked in one figure) ``tl`` is drawn in: 1 while the busiest row fits
    ``MAX_WIDTH_IN`` at ``JOB_IN`` per job (or the chart is too big to label anyway), else one per
    ``PAGE_JOBS`` jobs of that row (at most ``MAX_PAGES``)."""
    most = max((len(r.bars) for r in tl.rows), default=1)
    if 2.5 + JOB_IN * most <= MAX_WIDTH_IN or sum(len(r.bars) for r in tl.rows) > LABEL_LIMIT:
        return 1
    return min(MAX_PAGES, -(-most // PAGE_JOBS))


def figure_size(tl: Timeline, with_memory: bool, pages: int = 1) -> tuple[float, float]:
    """Inches: width from the busiest row's job count, height from the row count, pages and legend."""
    most = max((len(r.bars) for r in tl.rows), default=1)
    width = min(MAX_WIDTH_IN, max(10.0, 2.5 + JOB_IN * most))
    per_row = 0.36 + (0.2 if with_memory else 0.0) + 0.08
    if pages == 1:
        return width, 1.55 + per_row * len(tl.rows) + 0.35 + 0.2 * _legend_rows(tl, width, with_memory)
    height = 1.55 + pages * (per_row * len(tl.rows) + 0.35) + (pages - 1) * PAGE_GAP_IN \
        + 0.2 * _legend_rows(tl, width, with_memory)
    return width, height


def draw_gantt(tl: Timeline, path: str, *, dpi: int = 110, memory: bool = True) -> str:
    """Draw ``tl`` into ``path`` (format from the suffix: .png, .svg, .pdf); return the path."""
    from matplotlib.figure import Figure

    fmt = os.path.splitext(path)[1].lower().lstrip(".")
    if fmt not in ("png", "svg", "pdf"):
        raise ValueError(f"cannot draw a Gantt chart as {path!r}: use a .png, .svg or .pdf file name")
    with_mem = memory and any(r.memory for r in tl.rows)
    pages = pages_of(tl)
    w_in, h_in = figure_size(tl, with_mem, pages)
    fig = Figure(figsize=(w_in, h_in), dpi=dpi)
    left_in, right_in = 0.85, 1.25
    top_in, bottom_in = 0.75, 0.75 + 0.2 * _legend_rows(tl, w_in, with_mem)
    page_h = (h_in - top_in - bottom_in - (pages - 1) * PAGE_GAP_IN) / pages
    T0, T1 = tl.t0, tl.t1 if tl.t1 > tl.t0 else tl.t0 + 1.0
    T1 = max([T1] + [e for band in tl.dp_bands for _, e, _ in band])  # a dp tail may end after the last job
    dp_drawn = False
    for page in range(pages):
        if pages == 1:  # (the same floating-point arithmetic as a chart drawn before pages existed)
            rect, t0, t1 = (bottom_in / h_in, 1 - (top_in + bottom_in) / h_in), T0, T1
        else:
            bottom = h_in - top_in - page_h - page * (page_h + PAGE_GAP_IN)
            rect = (bottom / h_in, page_h / h_in)
            t0, t1 = T0 + (T1 - T0) * page / pages, T0 + (T1 - T0) * (page + 1) / pages
        ax = fig.add_axes((left_in / w_in, rect[0], 1 - (left_in + right_in) / w_in, rect[1]))
        dp_drawn |= _draw_page(ax, tl, t0, t1, with_mem, (w_in - left_in - right_in) * dpi, dpi,
                               last=page == pages - 1, clip=pages > 1)
        if pages > 1:
            ax.text(0.0, 1.0, f"part {page + 1} of {pages}: {tl.unit} {t0:.4g} to {t1:.4g}", transform=ax.transAxes,
                    fontsize=7.5, va="bottom", ha="left", color="#333333")
    fig.text(left_in / w_in, 1 - 0.22 / h_in, tl.title, fontsize=11, fontweight="bold", va="top")
    if tl.subtitle:
        fig.text(left_in / w_in, 1 - 0.47 / h_in, tl.subtitle, fontsize=8.5, va="top", color="#333333")
    _legend(fig, tl, w_in, with_mem, dp_drawn)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    import matplotlib

    # SVG keeps its text as text (searchable, smaller) instead of glyph outlines
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        with atomic_write(path, "wb") as fh:
            fig.savefig(fh, format=fmt, dpi=dpi)
    return path


def _draw_page(ax, tl: Timeline, t0: float, t1: float, with_mem: bool, axes_w_px: float, dpi: int, *,
               last: bool, clip: bool) -> bool:
    """Draw the window [t0, t1] of ``tl`` into ``ax`` (the whole chart on one page); True if dp bands were drawn."""
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Rectangle

    span = t1 - t0
    mem_h = 0.55 if with_mem else 0.0
    pitch = 1.0 + (0.12 + mem_h if with_mem else 0.0) + 0.22
    px_per_t = axes_w_px / span
    font = 7.0 if len(tl.rows) <= 8 else 6.5
    char_px = font * 0.62 / 72 * dpi
    peak = max(tl.peak_memory(), tl.mem_limit or 0.0) or 1.0

    rects, colors, edges, lws, waits, dp_rects = [], [], [], [], [], []
    windows = [(s, e) for _, s, e in tl.steps] or [(t0, t1)]
    labels = sum(len(row.bars) for row in tl.rows) <= LABEL_LIMIT
    for r, row in enumerate(tl.rows):
        y = r * pitch
        for s, e in windows:
            ax.add_patch(Rectangle((s, y), e - s, 1.0, facecolor=IDLE_COLOR, edgecolor="none", zorder=1))
        for bar in row.bars:
            if clip and (bar.end < t0 or bar.start > t1):  # on another page
                continue
            h, yb = (1.0, y) if bar.lane == 0 else (0.5, y + (0.0 if bar.lane == 1 else 0.5))
            col = shade(KIND_COLORS.get(bar.kind, "#777777"), bar.local, tl.vpp)
            rects.append((bar.start, yb, bar.end - bar.start, h))
            colors.append(col)
            if bar.wait > 0:
                waits.append((bar.start - bar.wait, y + 0.44, bar.wait, 0.12))
            wpx = (bar.end - bar.start) * px_per_t
            late = bar.late > 0 and wpx >= 5  # a frame would hide a sliver of a box
            edges.append(LATE_EDGE if late else "white")
            lws.append(1.2 if late else 0.35)
            if not labels:
                continue
            fs = font if h == 1.0 else font - 1
            if wpx < len(bar.label) * char_px * fs / font + 1.5:
                fs = fs - 1.5  # one size smaller before giving up on the label
            if wpx >= len(bar.label) * char_px * fs / font + 1.5:
                ax.text((bar.start + bar.end) / 2, yb + h / 2, bar.label, ha="center", va="center",
                        fontsize=fs, color="black" if _luminance(col) > 0.6 else "white", zorder=4,
                        clip_on=True)
        if with_mem and row.memory:
            ym = y + 1.12 + mem_h  # baseline of the strip (y grows downwards)
            xs = [p[0] for p in row.memory]
            ys = [ym - mem_h * p[1] / peak for p in row.memory]
            ax.fill_between(xs, ys, ym, color=MEM_COLOR, alpha=0.45, linewidth=0, zorder=2)
            ax.plot(xs, ys, color=MEM_COLOR, linewidth=0.8, zorder=3)
            ax.plot([t0, t1], [ym, ym], color="#bbbbbb", linewidth=0.5, zorder=1)
            if tl.mem_limit is not None:
                yl = ym - mem_h * tl.mem_limit / peak
                ax.plot([t0, t1], [yl, yl], color=LATE_COLOR, linewidth=0.7, linestyle="--", zorder=3)
            rp = max(p[1] for p in row.memory)
            ax.text(t1 + span * 0.006, ym - mem_h / 2, f"mem peak {rp:.3g}", fontsize=6.5, va="center",
                    ha="left", color=MEM_COLOR, clip_on=False)
        ax.text(t1 + span * 0.006, y + 0.5, f"bubble {100 * tl.bubble(row):.1f}%", fontsize=7, va="center",
                ha="left", clip_on=False)
        if r < len(tl.dp_bands) and tl.dp_bands[r]:  # the dp collectives: a thin band in the gap under the row
            yd = y + pitch - 0.21
            for s, e, _ in tl.dp_bands[r]:
                dp_rects.append((s, yd, e - s, 0.16))
    if rects:
        ax.add_collection(PolyCollection(_boxes(rects), facecolors=_rgba(colors), edgecolors=_rgba(edges),
                                         linewidths=lws,
                                         zorder=3), autolim=False)
    if waits:
        ax.add_collection(PolyCollection(_boxes(waits), facecolors=WAIT_COLOR, edgecolors="none", zorder=2),
                          autolim=False)
    if dp_rects:
        ax.add_collection(PolyCollection(_boxes(dp_rects), facecolors=DP_COLOR, edgecolors="white", linewidths=0.3,
                                         zorder=3, gid="dp-reduction"), autolim=False)
    for step, s, e in tl.steps:
        if e < t0 or s > t1:
            continue
        for x in (s, e):
            ax.axvline(x, color="#555555", linewidth=0.6, linestyle=":", zorder=0)
        ax.text((max(s, t0) + min(e, t1)) / 2, -0.25, f"step {step}", ha="center", va="bottom", fontsize=7.5,
                color="#333333")
    ax.set_xlim(t0, t1)
    ax.set_ylim(len(tl.rows) * pitch - 0.1, -0.35 if tl.steps else -0.15)
    ax.set_yticks([r * pitch + 0.5 for r in range(len(tl.rows))])
    ax.set_yticklabels([row.label for row in tl.rows], fontsize=8 if len(tl.rows) <= 8 else 7)
    ax.tick_params(axis="y", length=0)
    ax.tick_params(axis="x", labelsize=8)
    if last:
        ax.set_xlabel(f"time ({tl.unit})", fontsize=8.5)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    return bool(dp_rects)


def _legend(fig, tl: Timeline, w_in: float, with_mem: bool, dp_drawn: bool) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list = [Patch(facecolor=KIND_COLORS[k], label=f"{k}  {KIND_NAMES[k]}") for k in tl.kinds()]
    if tl.vpp > 1:
        base = "#555555"
        handles += [Patch(facecolor=shade(base, v, tl.vpp), label=f"local chunk {v}" + (" (full colour)" if v == 0 else " (lighter)"))
                    for v in range(tl.vpp)]
    handles.append(Patch(facecolor=IDLE_COLOR, edgecolor="#cccccc", label="idle (bubble)"))
    if with_mem:
        handles.append(Patch(facecolor=MEM_COLOR, alpha=0.45, label="activation memory (units)"))
        if tl.mem_limit is not None:
            handles.append(Line2D([], [], color=LATE_COLOR, linestyle="--", linewidth=0.9,
                                  label=f"memory limit {tl.mem_limit:.3g}"))
    if dp_drawn:
        handles.append(Patch(facecolor=DP_COLOR, label="data-parallel gradient reduction (band under a row)"))
    if any(b.wait > 0 for r in tl.rows for b in r.bars):
        handles.append(Patch(facecolor=WAIT_COLOR, label="logged inside a job, spent waiting for its input"))
    if any(b.late > 0 for r in tl.rows for b in r.bars):
        handles.append(Patch(facecolor="white", edgecolor=LATE_EDGE, linewidth=1.5, label="started late (black frame)"))
    fig.legend(handles=handles, loc="lower center", ncol=legend_cols(len(handles), w_in), fontsize=7.5, frameon=False,
               bbox_to_anchor=(0.5, 0.0), title="box number = microbatch", title_fontsize=7.5)
