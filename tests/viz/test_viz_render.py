"""Pictures and traces: PNG/SVG Gantt, interactive HTML (run under node when present), Chrome trace, CLI."""
import json
import re
import shutil
import subprocess

import pytest

from pipeloom import make_spec, plan, simulate
from pipeloom.cli import main
from pipeloom.schedule import registry
from pipeloom.viz import render_plan, write_outputs
from pipeloom.trace.check import check_run
from pipeloom.trace.timelines import measured_timeline, planned_timeline
from pipeloom.viz.gantt import figure_size
from pipeloom.trace.reader import read_logs
from pipeloom.trace.synth import SynthConfig, write_logs
from pipeloom.viz.timeline import KIND_COLORS, from_sim, memory_deltas, shade
from pipeloom.viz.perfetto import chrome_trace
from pipeloom.schedule import io as schedule_io


def _res(name="1f1b", pp=4, m=8, vpp=1, costs="F=1,B=1,W=1,comm=0"):
    spec = make_spec(pp=pp, microbatches=m, vpp=vpp, costs=costs)
    s = plan(name, spec)
    return simulate(s, spec.costs, spec.mem)


def test_render_plan_writes_png_svg_html_trace(tmp_path):
    from PIL import Image

    name = "zbv" if "zbv" in registry.names() else "interleaved"
    res = _res(name, 4, 8, 2)
    paths = render_plan(res, str(tmp_path), mem_limit=4.0)
    assert [p.rsplit(".", 2)[-2] + "." + p.rsplit(".", 1)[-1] for p in paths] == [
        "gantt.png", "gantt.svg", "gantt.html", "trace.json"]
    img = Image.open(paths[0]).convert("RGB")
    w_in, h_in = figure_size(from_sim(res), True)
    assert img.size[0] == pytest.approx(w_in * 110, abs=1) and img.size[1] == pytest.approx(h_in * 110, abs=1)
    colors = {"#%02x%02x%02x" % c for _, c in img.getcolors(1 << 20)}
    kinds = {j.kind.value for _, _, j in res.schedule.jobs()}
    for k in kinds:  # every kind drawn, in both chunk shades
        assert KIND_COLORS[k] in colors
        assert shade(KIND_COLORS[k], 1, 2) in colors
    svg = open(paths[1]).read()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert "memory limit 4" in svg and "bubble" in svg


def _svg_labels(path):
    return len(re.findall(r">\s*(\d+)\s*</text>", open(path).read()))


def test_labels_shown_when_they_fit_hidden_when_not(tmp_path):
    small = _res("1f1b", 2, 3)
    p1 = write_outputs([str(tmp_path / "small.svg")], timeline=from_sim(small))[0]
    # every job box carries its microbatch number (plus the axis tick labels)
    assert _svg_labels(p1) >= small.schedule.num_jobs
    big = _res("1f1b", 16, 64)
    w_in, h_in = figure_size(from_sim(big), True)
    assert 10 <= w_in <= 34 and h_in <= 16  # bounded size for pp 16, m 64
    assert figure_size(from_sim(_res("1f1b", 4, 64)), True)[0] > figure_size(from_sim(_res("1f1b", 4, 4)), True)[0]
    # narrow boxes (two-digit microbatches in one-unit forwards at pp 8, m 64) lose their labels
    dense = _res("1f1b", 8, 64)
    p2 = write_outputs([str(tmp_path / "dense.svg")], timeline=from_sim(dense))[0]
    assert 0 < _svg_labels(p2) < dense.schedule.num_jobs


def test_gantt_rejects_unknown_suffix(tmp_path):
    with pytest.raises(ValueError, match=r"\.png, \.svg"):
        write_outputs([str(tmp_path / "x.bmp")], timeline=from_sim(_res()))


def test_html_is_self_contained_and_carries_every_job(tmp_path):
    res = _res("interleaved", 4, 8, 2)
    tl = from_sim(res, mem_limit=4)
    path = write_outputs([str(tmp_path / "g.html")], timeline=tl)[0]
    page = open(path).read()
    assert "<script src" not in page and "<link" not in page and "cdn" not in page.lower()
    data = json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S).group(1))
    jobs = {(r["device"], f"{b[0]}{b[1]}.{b[2]}") for r in data["rows"] for b in r["bars"]}
    assert jobs == {(d, str(j)) for d, _, j in res.schedule.jobs()}


def test_html_page_data_matches_a_hand_timed_1f1b(tmp_path):
    """The page carries the bars and memory curve worked out by hand (not by the code that draws them):
    1F1B, pp 2, m 2, F 1, BW 2 (B 1 + W 1), no comm; one unit per forward (vpp 1), BW frees it."""
    spec = make_spec(pp=2, microbatches=2, costs="F=1,B=1,W=1,comm=0")
    res = simulate(plan("1f1b", spec), spec.costs, spec.mem)
    path = write_outputs([str(tmp_path / "g.html")], timeline=from_sim(res, mem_limit=4))[0]
    page = open(path).read()
    data = json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S).group(1))
    bars = {r["device"]: [(b[0], b[1], b[2], b[4], b[5]) for b in r["bars"]] for r in data["rows"]}
    # dev 0: F0 0-1, F1 1-2, BW0 waits for dev 1's BW0 (2-4): 4-6, BW1 waits for dev 1's BW1 (5-7): 7-9
    assert bars == {0: [("F", 0, 0, 0, 1), ("F", 1, 0, 1, 2), ("BW", 0, 0, 4, 6), ("BW", 1, 0, 7, 9)],
                    1: [("F", 0, 1, 1, 2), ("BW", 0, 1, 2, 4), ("F", 1, 1, 4, 5), ("BW", 1, 1, 5, 7)]}
    mem = {r["device"]: [tuple(p) for p in r["mem"]] for r in data["rows"]}
    assert mem[0] == [(0, 0), (1, 1), (2, 2), (4, 2), (6, 1), (7, 1), (9, 0)]
    assert mem[1] == [(1, 0), (2, 1), (4, 0), (5, 1), (7, 0)]
    assert [r["peak"] for r in data["rows"]] == [2, 1]
    assert data["t1"] == 9 and "makespan 9 " in data["subtitle"]


def test_memory_deltas_follow_the_rule_and_refuse_bad_jobs():
    # vpp 2: a = 1/2 per chunk, b = a/2: F +0.5, B -0.25, W -0.25, BW -0.5 (written out, not computed)
    assert memory_deltas([("F", 0), ("B", 1), ("W", 3), ("BW", 2)], 4, 2) == [0.5, -0.25, -0.25, -0.5]
    with pytest.raises(ValueError, match=r"chunk 4.*0\.\.3"):
        memory_deltas([("F", 4)], 4, 2)  # formerly clamped to chunk 3 without a word
    with pytest.raises(ValueError, match="chunk -1"):
        memory_deltas([("B", -1)], 4, 2)
    with pytest.raises(ValueError, match="'X'"):
        memory_deltas([("X", 0)], 4, 2)


NODE_SHIM = r"""
const fs = require("fs");
const page = fs.readFileSync(process.argv[2], "utf8");
const data = page.match(/<script id="data" type="application\/json">([\s\S]*?)<\/script>/)[1];
const code = page.match(/<script>([\s\S]*?)<\/script>/)[1];
const handlers = {};
function mk(tag) {
  const e = {tag, attrs: {}, children: [], style: {}, textContent: "", innerHTML: "", clientWidth: 1200,
    offsetWidth: 120, parentNode: null,
    setAttribute(k, v) { this.attrs[k] = String(v); }, getAttribute(k) { return this.attrs[k]; },
    appendChild(c) { c.parentNode = this; this.children.push(c); return c; },
    removeChild(c) { this.children.splice(this.children.indexOf(c), 1); },
    get firstChild() { return this.children[0] || null; },
    addEventListener(t, f) { (handlers[(this.id || tag) + ":" + t] = f); },
    getBoundingClientRect() { return {left: 0, top: 0, width: 1200, height: 600}; },
    classList: {contains(c) { return e.attrs["class"] === c; }}};
  return e;
}
const byId = {};
for (const id of ["svg", "wrap", "tip", "title", "subtitle", "legend", "stats", "range", "reset", "zin", "zout"]) {
  byId[id] = mk(id); byId[id].id = id;
}
byId["data"] = {textContent: data};
global.document = {getElementById: id => byId[id], createElementNS: (ns, tag) => mk(tag)};
global.window = {addEventListener: (t, f) => { handlers["window:" + t] = f; }};
eval(code);
function all(e, out) { out.push(e); for (const c of e.children) all(c, out); return out; }
const jobs = () => all(byId.svg, []).filter(e => e.attrs["class"] === "job");
const n0 = jobs().length;
const texts0 = all(byId.svg, []).filter(e => e.tag === "text").length;
// hover the first job: the tooltip names it
const j = jobs()[0];
handlers["svg:mousemove"]({target: j, clientX: 300, clientY: 40});
const tip = byId.tip.innerHTML;
// zoom in 8x around x=0: fewer boxes drawn, axis relabelled
for (let i = 0; i < 10; i++) handlers["wrap:wheel"]({deltaY: -1, clientX: 100, preventDefault() {}});
const n1 = jobs().length;
const range = byId.range.textContent;
handlers["wrap:dblclick"]({});
const n2 = jobs().length;
console.log(JSON.stringify({n0, n1, n2, tip, range, texts0, title: byId.title.textContent}));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node not installed")
def test_html_page_script_draws_hovers_and_zooms(tmp_path):
    res = _res("1f1b", 4, 16)
    path = write_outputs([str(tmp_path / "g.html")], timeline=from_sim(res))[0]
    shim = tmp_path / "shim.js"
    shim.write_text(NODE_SHIM)
    out = subprocess.run(["node", str(shim), path], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["n0"] == res.schedule.num_jobs
    assert 0 < r["n1"] < r["n0"]  # zoomed in: only the visible boxes
    assert r["n2"] == r["n0"]  # double click resets
    first = res.schedule.devices[0][0]
    assert f"{first.kind.value}{first.mb}.{first.chunk}" in r["tip"] and "duration" in r["tip"]
    lo, hi = (float(x) for x in re.match(r"showing (\S+) \.\. (\S+) cost units", r["range"]).groups())
    assert 0 <= lo < hi and hi - lo < res.makespan / 5  # ten wheel steps: zoomed well in, near the left edge
    assert r["title"].startswith("1f1b")


def test_chrome_trace_plan_beside_run(tmp_path):
    sched = plan("1f1b", make_spec(pp=4, microbatches=8))
    write_logs(str(tmp_path), sched, SynthConfig(machines=2, skew={1: 4.0}, slow={1: 1.5}))
    run = read_logs(str(tmp_path))
    rep = check_run(run)
    tr = chrome_trace(measured_timeline(run, late=rep.late_by_job), planned_timeline(run, rep))
    ev = tr["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs[0] == "machine 0" and procs[1] == "machine 1" and procs[1000].startswith("plan")
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {threads[(r.machine, r.rank)] for r in run.ranks} == {f"m{r.machine} rank {r.rank}" for r in run.ranks}
    jobs = [e for e in ev if e["ph"] == "X" and e["cat"] in ("F", "B", "W", "BW")]
    measured = [e for e in jobs if e["pid"] != 1000]
    planned = [e for e in jobs if e["pid"] == 1000]
    assert len(measured) == len(planned) == 2 * sched.num_jobs
    # per rank the measured jobs never overlap and follow the logged times (ms -> us)
    for r in run.ranks:
        mine = sorted((e["ts"], e["ts"] + e["dur"]) for e in measured if e["tid"] == r.rank)
        assert all(a[1] <= b[0] + 0.01 for a, b in zip(mine, mine[1:]))  # rounded to ns
    t0 = run.t0()
    first = min(j.start for j in run.ranks[0].jobs)
    assert min(e["ts"] for e in measured if e["tid"] == 0) == pytest.approx((first - t0) * 1e6, abs=1)
    assert any("late_ms" in e["args"] for e in measured)
    steps = [e for e in ev if e.get("cat") == "step"]
    assert {e["args"]["step"] for e in steps} == {3, 4}
    json.dumps(tr)  # serialisable


# ------------------------------------------------------------------------------------ CLI
def test_show_cli_writes_pictures_and_text(tmp_path, capsys):
    f = tmp_path / "s.json"
    schedule_io.save(plan("1f1b", make_spec(pp=2, microbatches=4)), str(f))
    assert main(["show", str(f), "--width", "60"]) == 0
    assert "d0" in capsys.readouterr().out
    outs = [str(tmp_path / n) for n in ("g.png", "g.html", "t.json")]
    assert main(["show", str(f), "--mem-limit", "1p"] + sum((["--out", o] for o in outs), [])) == 0
    printed = capsys.readouterr().out
    for o in outs:
        assert f"wrote {o}" in printed
    tr = json.load(open(outs[2]))
    assert sum(e["ph"] == "X" for e in tr["traceEvents"]) == 2 * 4 * 2
    assert main(["show", str(f), "--out", str(tmp_path / "g.gif")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeloom: error:") and ".png" in err
    assert main(["show", str(f), "--out", str(f)]) == 2  # never overwrite the schedule with a trace
    assert "would replace that input" in capsys.readouterr().err
    assert json.load(open(f))["name"] == "1f1b"


def test_trace_cli(tmp_path, capsys):
    logs = tmp_path / "logs"
    sched = plan("1f1b", make_spec(pp=4, microbatches=8))
    write_logs(str(logs), sched, SynthConfig(machines=2, skew={1: 1.0}, malformed=1))
    out = tmp_path / "trace.json"
    html = tmp_path / "g.html"
    assert main(["trace", str(logs), "--out", str(out), "--html", str(html), "--step", "4"]) == 0
    printed = capsys.readouterr().out
    assert "skipped 8 malformed" in printed and "clocks aligned by sync" in printed
    assert f"wrote {out}" in printed and f"wrote {html}" in printed
    tr = json.load(open(out))
    steps = {e["args"]["step"] for e in tr["traceEvents"] if e["ph"] == "X" and "step" in e["args"]}
    assert steps == {4}
    assert main(["trace", str(logs), "--out", str(out), "--step", "9"]) == 2
    assert "not among the profiled steps" in capsys.readouterr().err
    assert main(["trace", str(logs), "--out", str(tmp_path / "t.txt")]) == 2


def test_viz_imports_neither_torch_nor_matplotlib():
    import sys

    code = ("import sys, pipeloom.viz, pipeloom.trace.check, pipeloom.trace.reader, pipeloom.viz.gantt, "
            "pipeloom.viz.html, pipeloom.viz.perfetto, pipeloom.cli.trace_cmd, pipeloom.cli.check_cmd; "
            "print('torch' in sys.modules, 'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "False"], out.stderr
