"""Text Gantt chart of a simulated schedule, for terminals (no torch, no matplotlib)."""
from __future__ import annotations

import shutil

from ..sim.simulate import SimResult


def text_gantt(res: SimResult, width: int | None = None) -> str:
    """One row per device; each job a box of its kind letter + microbatch, '.' for idle.

    Time is scaled so the makespan fits ``width`` columns; jobs too short to label show
    just their kind letter (lower case for odd chunks of a device so chunks stay visible).
    """
    sched = res.schedule
    width = width or max(40, shutil.get_terminal_size((120, 20)).columns - 6)
    span = res.makespan or 1.0
    # stretch or compress time so the makespan fills the width (short jobs keep at least one column)
    cols = max(1, int(width))
    scale = cols / span
    lines = []
    for d, seq in enumerate(sched.devices):
        row = ["."] * cols
        local = {c: i for i, c in enumerate(sched.chunks_of(d))}
        for job, s, e in zip(seq, res.start[d], res.end[d]):
            a, b = int(round(s * scale)), max(int(round(e * scale)), int(round(s * scale)) + 1)
            letter = job.kind.value
            if local.get(job.chunk, 0) % 2:
                letter = letter.lower()
            label = f"{letter}{job.mb}"
            box = (label + " " * (b - a))[: b - a] if b - a >= len(label) else letter[: b - a].ljust(b - a, letter[0])
            a = min(a, cols - 1)
            row[a:b] = list(box[: max(1, min(b, cols) - a)])
        lines.append(f"d{d:<3} |" + "".join(row) + "|")
    legend = ("F forward, B input-grad, W weight-grad, BW fused backward; digits = microbatch; "
              "lower case = odd local chunk; '.' idle")
    head = f"{sched.name}  pp={sched.pp} vpp={sched.vpp} m={sched.microbatches}  makespan={res.makespan:g}  " \
           f"bubble={res.bubble:.3f}"
    return "\n".join([head, *lines, legend])
