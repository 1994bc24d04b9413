"""Gantt drawing of big plans: boxes as one collection of vertex arrays, no labels above the limit."""
from __future__ import annotations

import re
import time

import pytest

from pipeloom import make_spec, plan, simulate
from pipeloom.viz.gantt import LABEL_LIMIT, _boxes, draw_gantt
from pipeloom.viz.timeline import from_sim


def _timeline(pp, m):
    spec = make_spec(pp=pp, microbatches=m, costs="F=1,B=1,W=1,comm=0")
    sched = plan("1f1b", spec)
    return from_sim(simulate(sched, spec.costs, spec.mem))


def test_boxes_have_the_vertices_of_matplotlib_rectangles():
    from matplotlib.patches import Rectangle

    xywh = [(0.0, 0.0, 1.0, 1.0), (2.5, 3.0, 0.25, 0.5), (-1.0, 7.0, 3.0, 0.12)]
    got = _boxes(xywh)
    for box, (x, y, w, h) in zip(got, xywh):
        r = Rectangle((x, y), w, h)
        want = r.get_patch_transform().transform(r.get_path().vertices[:4])
        assert [tuple(v) for v in box] == [pytest.approx(tuple(v)) for v in want]


def _texts(svg: str) -> list[str]:
    return re.findall(r"<text\b[^>]*>([^<]*)</text>", svg)


def test_small_plan_keeps_its_microbatch_labels(tmp_path):
    tl = _timeline(4, 8)
    out = draw_gantt(tl, str(tmp_path / "s.svg"))
    texts = _texts(open(out).read())
    jobs = sum(len(r.bars) for r in tl.rows)
    # every box of this small plan is wide enough for its number: one label per job
    assert sum(t.strip().isdigit() for t in texts) >= jobs


@pytest.mark.slow
def test_big_plan_draws_quickly_without_labels(tmp_path):
    tl = _timeline(4, LABEL_LIMIT // 8 + 100)  # F and B per microbatch on 4 devices: over the limit
    assert sum(len(r.bars) for r in tl.rows) > LABEL_LIMIT
    t0 = time.perf_counter()
    out = draw_gantt(tl, str(tmp_path / "b.svg"))
    elapsed = time.perf_counter() - t0
    svg = open(out).read()
    assert len(_texts(svg)) < 100  # the axes, legend and side notes only
    assert svg.count("<path") > 0
    assert elapsed < 60, elapsed  # one patch object per job took minutes at 65k jobs


def test_no_labels_above_the_limit(tmp_path, monkeypatch):
    from pipeloom.viz import gantt

    tl = _timeline(4, 8)
    jobs = sum(len(r.bars) for r in tl.rows)

    def numbers(name):
        return sum(t.strip().isdigit() for t in _texts(open(draw_gantt(tl, str(tmp_path / name))).read()))
    labelled = numbers("a.svg")
    monkeypatch.setattr(gantt, "LABEL_LIMIT", jobs - 1)
    # every box of this small plan fits its number: exactly one label per job goes (the axis ticks stay)
    assert labelled - numbers("b.svg") == jobs
