"""What ``pipeloom simulate --tp-overlap`` predicts for the three comparisons of bench/tp_overlap.py, beside
what that bench measured on the emulated link (its committed table, docs/bench/tp_overlap.md).

    python bench/tp_overlap_predict.py [--table docs/bench/tp_overlap.md]

The prediction takes only the component times the bench measured (its footer): the link delay D of one
collective, the wgrad GEMMs of the two column-parallel groups (q/k/v, w1/w3) and one whole W. One chunk pass
of the bench's layer: a B's dgrad GEMMs cost what its W's wgrad GEMMs do (B = W), the input-gradient
collective is the two groups' collectives one after the other on the one link (comm = 2 D), and the column
share is (q/k/v + w1/w3) / W. Each comparison is a one-device plan timed job by job with the durations
of :mod:`pipeloom.sim.tp_jobs` (the same function ``simulate --tp-overlap`` uses):

* fused BW: ``F0 BW0``, the BW under ``async`` against ``off``;
* split B: ``F0 F1 B0 B1 W0 W1``, B1 (no W of its own after it) under ``chunked:K`` against ``off``;
* fill: the same plan, B1 + W0 under ``fill`` (B1 runs W0 while its collective is in flight) against ``off``.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from pipeloom.core.ir import Job, Kind, Placement, Schedule  # noqa: E402
from pipeloom.sim.tp_jobs import TPJobTerms, tp_job_durations  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = os.path.join(HERE, "..", "docs", "bench", "tp_overlap.md")
#: the comparisons of bench/tp_overlap.py: (row prefix in its table, overlap mode)
ROWS = (("fused BW", "async"), ("split B", "chunked"), ("B(1) + W(0)", "fill"))


def measured(text: str) -> dict:
    """From the committed table: per comparison the emulated link's overlap/control ratio (median of pairs),
    and the components (ms): delay D, q/k/v and w1/w3 wgrad GEMMs, one W, and K of chunked."""
    out: dict = {"ratios": {}}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 5 or not cells[1].startswith("emulated"):
            continue
        for prefix, mode in ROWS:
            if cells[0].startswith(prefix):
                out["ratios"][mode] = float(cells[4])
                out["delay_ms"] = float(re.search(r"emulated, ([0-9.]+) ms", cells[1]).group(1))
                k = re.search(r"chunked:(\d+)", cells[0])
                if k:
                    out["chunks"] = int(k.group(1))
    m = re.search(r"one w1/w3 group's wgrad GEMMs ([0-9.]+) ms, one q/k/v group's ([0-9.]+) ms, one W \(every "
                  r"GEMM\) ([0-9.]+) ms", text)
    if not m or len(out["ratios"]) != len(ROWS):
        raise ValueError("the table has no emulated-link rows or no component times (bench/tp_overlap.py output?)")
    out["w13_ms"], out["qkv_ms"], out["w_ms"] = (float(x) for x in m.groups())
    return out


def _durations(jobs: list[Job], w: float, terms: TPJobTerms) -> list[float]:
    sched = Schedule(name="bench", pp=1, vpp=1, microbatches=2, placement=Placement.INTERLEAVED,
                     devices=(tuple(jobs),))
    return tp_job_durations(sched, [0.0], [w], [w], terms)[0][0]


def predict(m: dict) -> dict:
    """Per mode: (overlap ms, control ms, ratio) that the job durations of pipeloom.sim.tp_jobs give."""
    w, comm, k = m["w_ms"], 2 * m["delay_ms"], m.get("chunks", 2)
    share = (m["qkv_ms"] + m["w13_ms"]) / w
    F, B, W, BW = Kind.F, Kind.B, Kind.W, Kind.BW

    def terms(mode):
        return TPJobTerms(comm, share, mode, k if mode == "chunked" else 1)

    out = {}
    fused = [Job(F, 0, 0), Job(BW, 0, 0)]
    on, off = _durations(fused, w, terms("async"))[1], _durations(fused, w, terms("off"))[1]
    out["async"] = (on, off)
    split = [Job(F, 0, 0), Job(F, 1, 0), Job(B, 0, 0), Job(B, 1, 0), Job(W, 0, 0), Job(W, 1, 0)]
    on, off = _durations(split, w, terms("chunked")), _durations(split, w, terms("off"))
    out["chunked"] = (on[3], off[3])
    on, off = _durations(split, w, terms("fill")), _durations(split, w, terms("off"))
    out["fill"] = (on[3] + on[4], off[3] + off[4])
    return {mode: (a, b, a / b) for mode, (a, b) in out.items()}


def table(text: str) -> str:
    m = measured(text)
    p = predict(m)
    names = {"async": "fused BW: async vs blocking", "chunked": f"split B: chunked:{m.get('chunks', 2)} vs blocking",
             "fill": "B(1) + W(0): fill vs B then W"}
    rows = ["| comparison | predicted overlap (ms) | predicted control (ms) | predicted ratio | measured ratio "
            "(emulated link) | same side of 1 |", "|---|---|---|---|---|---|"]
    for _, mode in ROWS:
        a, b, r = p[mode]
        got = m["ratios"][mode]
        rows.append(f"| {names[mode]} | {a:.1f} | {b:.1f} | {r:.3f} | {got:.3f} | {'yes' if (r < 1) == (got < 1) else 'NO'} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", default=TABLE, help="bench/tp_overlap.py's table (default: the committed one)")
    a = ap.parse_args()
    with open(a.table, encoding="utf-8") as f:
        print(table(f.read()))


if __name__ == "__main__":
    main()
