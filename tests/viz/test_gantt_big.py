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


@pytest.mark.slow  # 8-45 s on 2 busy cores: make test runs it, make test-fast does not
def test_long_rows_are_paged_so_every_box_keeps_its_number(tmp_path):
    """m 32 x vpp 4 with split backward is 384 jobs per device: on one 34-inch strip a box was ~8 px, too narrow
    for its microbatch number (a strip of slivers). In pages every box is wide enough for its label."""
    spec = make_spec(pp=4, microbatches=32, vpp=4, costs="F=1,B=1,W=1,comm=0")
    sched = plan("zbv", spec)
    tl = from_sim(simulate(sched, spec.costs, spec.mem))
    jobs = sum(len(r.bars) for r in tl.rows)
    assert max(len(r.bars) for r in tl.rows) == 384
    out = draw_gantt(tl, str(tmp_path / "big.svg"))
    svg = open(out).read()
    numbers = sum(t.strip().isdigit() for t in _texts(svg))
    assert numbers >= 0.95 * jobs, (numbers, jobs)
    assert "part 1 of 4" in svg and "part 4 of 4" in svg
    width_pt = float(re.search(r'<svg[^>]*width="([\d.]+)pt"', svg).group(1))
    assert width_pt <= 34 * 72 + 1  # no wider than before, taller instead


def test_render_plan_in_seconds(tmp_path):
    """tune's Gantt was in cost units while its table is in seconds: with seconds_per_unit every axis is in s."""
    import json

    from pipeloom.viz import render_plan

    spec = make_spec(pp=2, microbatches=4, costs="F=1,B=2,W=1,comm=0")
    sim = simulate(plan("1f1b", spec), spec.costs, spec.mem)
    paths = render_plan(sim, str(tmp_path), stem="p", seconds_per_unit=0.25)
    svg = open(next(p for p in paths if p.endswith(".svg"))).read()
    assert "time (s)" in svg and f"makespan {sim.makespan * 0.25:.4g} s" in svg
    trace = json.load(open(next(p for p in paths if p.endswith(".json"))))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    durs = sorted(e["dur"] for e in events if e.get("ph") == "X")
    assert durs[0] == pytest.approx(0.25e6)  # an F of 1 unit = 0.25 s = 250000 us
    plain = render_plan(sim, str(tmp_path / "u"), stem="p")
    assert "time (cost units)" in open(next(p for p in plain if p.endswith(".svg"))).read()
