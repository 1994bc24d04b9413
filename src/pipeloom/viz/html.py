"""Self-contained interactive HTML Gantt page (inline SVG drawn by inline JS; no CDN, no network).

Hover a box for its job details (kind, microbatch, chunk, device, start, end, duration,
lateness); mouse wheel zooms around the cursor, drag pans, double click (or "reset") shows
everything again. The same :class:`~pipeloom.viz.timeline.Timeline` feeds the PNG, so both agree.
"""
from __future__ import annotations

import html
import json
import os

from ..core.files import atomic_write
from .timeline import IDLE_COLOR, KIND_COLORS, KIND_NAMES, Timeline, shade


def timeline_data(tl: Timeline) -> dict:
    """The JSON the page draws (also handy for tests and other front ends)."""
    rows = []
    for row in tl.rows:
        rows.append({
            "label": row.label,
            "rank": row.rank,
            "machine": row.machine,
            "device": row.device,
            "bubble": round(tl.bubble(row), 6),
            "peak": round(max((v for _, v in row.memory), default=0.0), 6),
            "bars": [[b.kind, b.mb, b.chunk, b.local, round(b.start, 9), round(b.end, 9), b.lane,
                      round(b.late, 9), b.step, shade(KIND_COLORS.get(b.kind, "#777777"), b.local, tl.vpp),
                      round(b.wait, 9)]
                     for b in row.bars],
            "mem": [[round(t, 9), round(v, 6)] for t, v in row.memory],
        })
    return {"title": tl.title, "subtitle": tl.subtitle, "unit": tl.unit, "t0": tl.t0, "t1": tl.t1,
            "vpp": tl.vpp, "steps": [list(s) for s in tl.steps], "memLimit": tl.mem_limit,
            "peakMem": max(tl.peak_memory(), tl.mem_limit or 0.0), "rows": rows,
            "kinds": {k: [KIND_COLORS[k], KIND_NAMES[k]] for k in tl.kinds()}, "idle": IDLE_COLOR}


_PAGE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>__TITLE__</title>
<style>
 body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:16px;color:#222}
 h1{font-size:18px;margin:0 0 4px} .sub{font-size:13px;color:#444;margin-bottom:8px}
 #bar{font-size:12px;margin:6px 0} #bar button{font-size:12px;margin-right:4px}
 #wrap{position:relative;border:1px solid #ddd;user-select:none;cursor:grab}
 #tip{position:absolute;pointer-events:none;background:rgba(30,30,30,.92);color:#fff;font-size:12px;
      padding:6px 8px;border-radius:4px;display:none;white-space:nowrap;z-index:2}
 .legend span{display:inline-block;margin-right:14px;font-size:12px}
 .legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px;border:1px solid #ccc}
 table{border-collapse:collapse;font-size:12px;margin-top:10px} td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}
</style></head><body>
<h1 id="title"></h1><div class="sub" id="subtitle"></div>
<div id="bar"><button id="reset">reset zoom</button><button id="zin">zoom in</button><button id="zout">zoom out</button>
 <span id="range"></span> &nbsp; wheel: zoom, drag: pan, double click: reset</div>
<div class="legend" id="legend"></div>
<div id="wrap"><svg id="svg" xmlns="http://www.w3.org/2000/svg"></svg><div id="tip"></div></div>
<table id="stats"></table>
<script id="data" type="application/json">__DATA__</script>
<script>
(function(){
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const NS = "http://www.w3.org/2000/svg";
const svg = document.getElementById("svg"), wrap = document.getElementById("wrap"), tip = document.getElementById("tip");
const LEFT = 90, RIGHT = 110, TOP = D.steps.length ? 22 : 8, ROWH = 26, MEMH = 14, GAP = 10, AXIS = 30;
const hasMem = D.rows.some(r => r.mem.length);
const pitch = ROWH + (hasMem ? MEMH + 3 : 0) + GAP;
let v0 = D.t0, v1 = D.t1 > D.t0 ? D.t1 : D.t0 + 1;
const full = [v0, v1];
document.getElementById("title").textContent = D.title;
document.getElementById("subtitle").textContent = D.subtitle;
const KN = {F:"forward",B:"input-grad backward",W:"weight-grad backward",BW:"full backward"};
let leg = "";
for (const k in D.kinds) leg += `<span><i style="background:${D.kinds[k][0]}"></i>${k} ${D.kinds[k][1]}</span>`;
if (D.vpp > 1) leg += `<span>lighter shade = later local chunk (0..${D.vpp - 1})</span>`;
leg += `<span><i style="background:${D.idle}"></i>idle (bubble)</span>`;
if (hasMem) leg += `<span><i style="background:#b9afd9"></i>activation memory (units)</span>`;
if (D.rows.some(r => r.bars.some(b => b[7] > 0))) leg += `<span><i style="background:#fff;border:2px solid #111"></i>started late (black frame)</span>`;
if (D.rows.some(r => r.bars.some(b => b[10] > 0))) leg += `<span><i style="background:#888"></i>waiting for input (logged inside the job)</span>`;
leg += `<span>box number = microbatch</span>`;
document.getElementById("legend").innerHTML = leg;
let st = "<tr><th>row</th><th>bubble</th><th>peak memory</th><th>jobs</th></tr>";
for (const r of D.rows) st += `<tr><td>${esc(r.label)}</td><td>${(100*r.bubble).toFixed(1)}%</td><td>${r.peak.toPrecision(3)}</td><td>${r.bars.length}</td></tr>`;
document.getElementById("stats").innerHTML = st;
function esc(s){return String(s).replace(/[&<>"]/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;"}[c]));}
function el(tag, attrs, parent){const e = document.createElementNS(NS, tag); for (const a in attrs) e.setAttribute(a, attrs[a]); if (parent) parent.appendChild(e); return e;}
function fmt(x){const a = Math.abs(x); return a >= 1000 || a === 0 ? x.toFixed(0) : x.toPrecision(4).replace(/\.?0+$/, "");}
function niceStep(span, n){const raw = span / n, p = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / p;
  return p * (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10);}
function draw(){
  const W = Math.max(400, wrap.clientWidth), plotW = W - LEFT - RIGHT;
  const H = TOP + D.rows.length * pitch + AXIS;
  svg.setAttribute("width", W); svg.setAttribute("height", H); svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const sx = plotW / (v1 - v0), X = t => LEFT + (t - v0) * sx;
  el("clipPath", {id: "clip"}, el("defs", {}, svg)).appendChild(el("rect", {x: LEFT, y: 0, width: plotW, height: H}));
  const g = el("g", {"clip-path": "url(#clip)"}, svg);
  const windows = D.steps.length ? D.steps.map(s => [s[1], s[2]]) : [[D.t0, D.t1]];
  D.rows.forEach((row, r) => {
    const y = TOP + r * pitch;
    const lab = el("text", {x: LEFT - 8, y: y + ROWH / 2 + 4, "text-anchor": "end", "font-size": 12}, svg); lab.textContent = row.label;
    const bt = el("text", {x: W - RIGHT + 6, y: y + ROWH / 2 + 4, "font-size": 11}, svg); bt.textContent = `bubble ${(100*row.bubble).toFixed(1)}%`;
    for (const w of windows) el("rect", {x: X(w[0]), y: y, width: Math.max(0, (w[1]-w[0]) * sx), height: ROWH, fill: D.idle}, g);
    row.bars.forEach((b, i) => {
      if (b[5] < v0 || b[4] > v1) return;
      const h = b[6] ? ROWH / 2 : ROWH, yb = y + (b[6] === 2 ? ROWH / 2 : 0);
      const x = X(b[4]), w = Math.max(0.6, (b[5] - b[4]) * sx);
      const late = b[7] > 0;
      if (b[10] > 0) el("rect", {x: X(b[4] - b[10]), y: y + ROWH * 0.44, width: Math.max(0.6, b[10] * sx), height: ROWH * 0.12, fill: "#888"}, g);
      el("rect", {x: x, y: yb, width: w, height: h, fill: b[9], stroke: late ? "#111" : "#fff",
                  "stroke-width": late ? 2 : 0.5, "data-r": r, "data-i": i, class: "job"}, g);
      const label = String(b[1]);
      if (w >= label.length * 7 + 3) {
        const c = b[9], lum = (0.2126*parseInt(c.substr(1,2),16) + 0.7152*parseInt(c.substr(3,2),16) + 0.0722*parseInt(c.substr(5,2),16)) / 255;
        const t = el("text", {x: x + w / 2, y: yb + h / 2 + 4, "text-anchor": "middle", "font-size": h < ROWH ? 9 : 11,
                              fill: lum > 0.6 ? "#000" : "#fff", "pointer-events": "none"}, g);
        t.textContent = label;
      }
    });
    if (hasMem && row.mem.length) {
      const base = y + ROWH + 3 + MEMH, peak = D.peakMem || 1;
      let pts = `${X(row.mem[0][0])},${base} `;
      for (const p of row.mem) pts += `${X(p[0])},${base - MEMH * p[1] / peak} `;
      pts += `${X(row.mem[row.mem.length - 1][0])},${base}`;
      el("polygon", {points: pts, fill: "#b9afd9", stroke: "#7b68b5", "stroke-width": 0.8}, g);
      if (D.memLimit !== null) el("line", {x1: LEFT, x2: LEFT + plotW, y1: base - MEMH * D.memLimit / peak,
                                            y2: base - MEMH * D.memLimit / peak, stroke: "#d62728", "stroke-dasharray": "4 3", "stroke-width": 0.8}, g);
      const mt = el("text", {x: W - RIGHT + 6, y: base - 2, "font-size": 10, fill: "#7b68b5"}, svg); mt.textContent = `mem peak ${row.peak.toPrecision(3)}`;
    }
  });
  for (const s of D.steps) {
    for (const x of [s[1], s[2]]) el("line", {x1: X(x), x2: X(x), y1: TOP - 4, y2: H - AXIS, stroke: "#555", "stroke-dasharray": "2 3"}, g);
    const t = el("text", {x: X((s[1] + s[2]) / 2), y: 14, "text-anchor": "middle", "font-size": 12}, g); t.textContent = `step ${s[0]}`;
  }
  const ay = H - AXIS + 4, step = niceStep(v1 - v0, Math.max(2, plotW / 90));
  el("line", {x1: LEFT, x2: LEFT + plotW, y1: ay, y2: ay, stroke: "#333"}, svg);
  for (let t = Math.ceil(v0 / step) * step; t <= v1 + 1e-12; t += step) {
    el("line", {x1: X(t), x2: X(t), y1: ay, y2: ay + 5, stroke: "#333"}, svg);
    const tt = el("text", {x: X(t), y: ay + 17, "text-anchor": "middle", "font-size": 11}, svg); tt.textContent = fmt(t);
  }
  const ut = el("text", {x: LEFT + plotW, y: ay + 17, "text-anchor": "start", "font-size": 11, dx: 8}, svg); ut.textContent = D.unit;
  document.getElementById("range").textContent = `showing ${fmt(v0)} .. ${fmt(v1)} ${D.unit}`;
}
function zoom(factor, at){
  const c = at === undefined ? (v0 + v1) / 2 : at;
  let n0 = c - (c - v0) * factor, n1 = c + (v1 - c) * factor;
  const minSpan = (full[1] - full[0]) * 1e-4;
  if (n1 - n0 < minSpan) return;
  if (n1 - n0 > full[1] - full[0]) { n0 = full[0]; n1 = full[1]; }
  if (n0 < full[0]) { n1 += full[0] - n0; n0 = full[0]; }
  if (n1 > full[1]) { n0 -= n1 - full[1]; n1 = full[1]; }
  v0 = Math.max(full[0], n0); v1 = n1; draw();
}
function tAt(ev){const r = svg.getBoundingClientRect(), plotW = r.width - LEFT - RIGHT; return v0 + (ev.clientX - r.left - LEFT) / plotW * (v1 - v0);}
wrap.addEventListener("wheel", ev => { ev.preventDefault(); zoom(ev.deltaY > 0 ? 1.25 : 0.8, tAt(ev)); }, {passive: false});
let drag = null;
wrap.addEventListener("mousedown", ev => { drag = {x: ev.clientX, v0: v0, v1: v1}; wrap.style.cursor = "grabbing"; });
window.addEventListener("mouseup", () => { drag = null; wrap.style.cursor = "grab"; });
window.addEventListener("mousemove", ev => {
  if (!drag) return;
  const plotW = svg.getBoundingClientRect().width - LEFT - RIGHT, dt = (ev.clientX - drag.x) / plotW * (drag.v1 - drag.v0);
  let n0 = drag.v0 - dt, n1 = drag.v1 - dt;
  if (n0 < full[0]) { n1 += full[0] - n0; n0 = full[0]; }
  if (n1 > full[1]) { n0 -= n1 - full[1]; n1 = full[1]; }
  v0 = n0; v1 = n1; draw();
});
wrap.addEventListener("dblclick", () => { v0 = full[0]; v1 = full[1]; draw(); });
document.getElementById("reset").onclick = () => { v0 = full[0]; v1 = full[1]; draw(); };
document.getElementById("zin").onclick = () => zoom(0.5);
document.getElementById("zout").onclick = () => zoom(2);
svg.addEventListener("mousemove", ev => {
  const t = ev.target;
  if (!t.classList || !t.classList.contains("job")) { tip.style.display = "none"; return; }
  const row = D.rows[+t.getAttribute("data-r")], b = row.bars[+t.getAttribute("data-i")];
  let s = `<b>${b[0]}${b[1]}${b[2] >= 0 ? "." + b[2] : ""}</b> ${KN[b[0]] || b[0]}<br>${esc(row.label)}, microbatch ${b[1]}, chunk ${b[2]} (local ${b[3]})`;
  s += `<br>start ${fmt(b[4])}, end ${fmt(b[5])}, duration ${fmt(b[5] - b[4])} ${esc(D.unit)}`;
  if (b[8] !== null) s += `<br>step ${b[8]}`;
  if (b[10] > 0) s += `<br>waited ${fmt(b[10])} ${esc(D.unit)} for its input before this (logged as part of the job)`;
  if (b[7] > 0) s += `<br><span style="color:#ff8a80">started ${fmt(b[7])} ${esc(D.unit)} late</span>`;
  tip.innerHTML = s; tip.style.display = "block";
  const r = wrap.getBoundingClientRect();
  let x = ev.clientX - r.left + 14; if (x + tip.offsetWidth > r.width) x = ev.clientX - r.left - tip.offsetWidth - 14;
  tip.style.left = x + "px"; tip.style.top = (ev.clientY - r.top + 14) + "px";
});
svg.addEventListener("mouseleave", () => { tip.style.display = "none"; });
window.addEventListener("resize", draw);
draw();
})();
</script></body></html>
"""


def write_html(tl: Timeline, path: str) -> str:
    """Write the interactive page for ``tl`` to ``path``; return the path."""
    data = json.dumps(timeline_data(tl), separators=(",", ":")).replace("</", "<\\/")
    page = _PAGE.replace("__TITLE__", html.escape(tl.title)).replace("__DATA__", data)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_write(path) as fh:
        fh.write(page)
    return path
