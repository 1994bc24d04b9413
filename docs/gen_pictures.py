"""Draw every picture of the docs with pipeloom itself, so that none of them can go stale.

Run by ``make docs`` (and ``make test``) before ``mkdocs build``::

    python docs/gen_pictures.py            # the site's pictures and table into docs/gen/ (gitignored)
    python docs/gen_pictures.py --readme   # redraw the README picture docs/img/zbv-vs-1f1b.png (then commit it)

Writes:

* ``docs/img/zbv-vs-1f1b.png`` (``--readme`` only) -- the README picture, committed because GitHub shows
  the README without building anything; ``tests/test_docs.py`` redraws it into a temporary folder and
  fails when it differs from the committed one (so the build never overwrites it);
* ``docs/gen/families/<name>.png`` -- one Gantt chart per schedule family, pp 4, m 8;
* ``docs/gen/families.md`` -- the table of those plans' makespan, bubble, peak memory and
  point-to-point transfers, included by ``docs/schedules.md``;
* ``docs/gen/layers.png`` -- the layer diagram of ``docs/architecture.md``.

Everything is planned and simulated by pipeloom (``pipeloom.api``) and drawn by ``pipeloom.viz``;
only the layer diagram and the stacking of the README's two charts use matplotlib directly.
Takes a few seconds.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
GEN = DOCS / "gen"
README_PNG = DOCS / "img" / "zbv-vs-1f1b.png"

# pp 4, m 8 and the cost model of the README's "memory against speed" table: F=B=W=1 per chunk pass
# of a vpp-2 schedule, comm 0; one-chunk-per-device schedules run the same network, so their
# per-stage passes cost twice as much (F=B=W=2).
PP, M = 4, 8
CHUNK_COSTS = "F=1,B=1,W=1,comm=0"
STAGE_COSTS = "F=2,B=2,W=2,comm=0"

#: (name, vpp, memory limit, extra options) of each family picture, in the order of docs/schedules.md.
FAMILIES = [
    ("fthenb", 1, None, {}),
    ("1f1b", 1, None, {}),
    ("eager1f1b", 1, None, {}),
    ("interleaved", 2, None, {}),
    ("zbh1", 1, None, {}),
    ("zbh2", 1, None, {}),
    ("zbv", 2, "1p", {}),
    ("vhalf", 2, None, {"polish": 0}),  # the greedy alone: the default CP-SAT polish takes seconds
    ("vmin", 2, None, {"polish": 0}),
    ("dualpipev", 2, None, {}),
]
#: the exact solver only takes small shapes: pp 2, m 4, vpp 2, comm 1 (the optimum docs/optimal-dualpipe.md proves)
OPTIMAL = ("optimal", 2, 4, 2, "1p", {"time_limit": 20, "workers": 1, "seed": 0}, "F=1,B=1,W=1,comm=1")


def _plan(name: str, pp: int, m: int, vpp: int, mem_limit, options: dict, costs: str | None = None):
    from pipeloom import api

    costs = costs or (CHUNK_COSTS if vpp > 1 else STAGE_COSTS)
    spec = api.make_spec(pp=pp, microbatches=m, vpp=vpp, costs=costs, mem_limit=mem_limit, options=options or None)
    sched = api.plan(name, spec)
    return spec, sched, api.simulate(sched, spec.costs, spec.mem)


def transfers(sched) -> int:
    """Point-to-point messages of one step: an activation for every chunk boundary crossed by a
    forward and a gradient back for every one crossed by a backward (a V turn stays on its device)."""
    per_mb = sum(1 for k in range(sched.num_chunks - 1) if sched.device_of(k) != sched.device_of(k + 1))
    return 2 * per_mb * sched.microbatches


def _timeline(res, spec, t1: float | None = None):
    from pipeloom.viz.timeline import from_sim

    tl = from_sim(res, mem=spec.mem, mem_limit=spec.mem_limit)
    if t1 is not None:  # the same time axis for charts that are compared; the step window keeps the bubbles
        tl.steps = [(0, tl.t0, tl.t1)]
        tl.t1 = t1
    return tl


def readme_picture(path: Path = README_PNG) -> Path:
    """1F1B above ZB-V at the same memory (1p), one time axis: the README's picture."""
    import matplotlib.image as mpimg
    import numpy as np
    from pipeloom.viz.gantt import draw_gantt

    s1, _, r1 = _plan("1f1b", PP, M, 1, "1p", {})
    s2, _, r2 = _plan("zbv", PP, M, 2, "1p", {})
    t1 = max(r1.makespan, r2.makespan)
    with tempfile.TemporaryDirectory() as tmp:
        parts = []
        for i, (spec, res) in enumerate(((s1, r1), (s2, r2))):
            p = os.path.join(tmp, f"{i}.png")
            draw_gantt(_timeline(res, spec, t1), p, dpi=90)
            parts.append(mpimg.imread(p))
    width = max(p.shape[1] for p in parts)
    padded = [np.pad(p, ((0, 0), (0, width - p.shape[1]), (0, 0)), constant_values=1.0) for p in parts]
    path.parent.mkdir(parents=True, exist_ok=True)
    mpimg.imsave(path, np.concatenate(padded, axis=0), metadata={"Software": None})
    return path


def family_pictures(out: Path) -> list[dict]:
    """One Gantt chart per family into ``out``; returns a row of numbers per plan."""
    from pipeloom.viz.gantt import draw_gantt

    out.mkdir(parents=True, exist_ok=True)
    rows = []
    shapes = [(n, PP, M, v, lim, o, None) for n, v, lim, o in FAMILIES] + [OPTIMAL]
    for name, pp, m, vpp, lim, opts, costs in shapes:
        spec, sched, res = _plan(name, pp, m, vpp, lim, opts, costs)
        draw_gantt(_timeline(res, spec), str(out / f"{name}.png"), dpi=80)
        rows.append({"name": name, "pp": pp, "m": m, "vpp": sched.vpp, "limit": lim or "none",
                     "makespan": res.makespan, "bubble": res.bubble, "peak": max(res.peak_memory),
                     "p2p": transfers(sched), "placement": str(sched.placement),
                     "costs": costs or (CHUNK_COSTS if sched.vpp > 1 else STAGE_COSTS),
                     "options": ",".join(f"{k}={v}" for k, v in opts.items() if k == "polish")})
    return rows


def families_table(rows: list[dict]) -> str:
    """The markdown table of :func:`family_pictures`'s numbers."""
    lines = ["| schedule | pp, m, vpp (placement) | costs per chunk pass | memory limit | makespan | bubble "
             "| peak memory (units) | p2p messages per step |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        opt = f" `-O {r['options']}`" if r["options"] else ""
        lines.append(f"| `{r['name']}`{opt} | {r['pp']}, {r['m']}, {r['vpp']} ({r['placement']}) | {r['costs']} "
                     f"| {r['limit']} | {r['makespan']:.4g} | {100 * r['bubble']:.1f}% | {r['peak']:.3g} | {r['p2p']} |")
    return "\n".join(lines) + "\n"


#: (layer, folders, what lives there), lowest first: the order tests/test_layers.py enforces.
LAYERS = [
    ("core", "core/", "schedule value (ir), dependency + memory rules, costs, errors"),
    ("sim", "sim/", "event simulator, metrics, replay of measured orders"),
    ("schedule", "schedule/", "registry, validator, planning, families; search/ engines + C pass; io/ file formats"),
    ("models", "models/", "what pipeloom knows of a model: architecture registry, families; tiny Llama (torch)"),
    ("autograd", "autograd/", "split backward: weight grads deferred from B to W (torch), for runtime and memory"),
    ("partition", "partition/", "layers -> devices x chunks, per-chunk costs, balancing"),
    ("viz", "viz/", "drawing only: Gantt PNG/SVG, HTML, Perfetto trace, text Gantt"),
    ("trace/ops", "trace/ops/", "op traces of any trainer, what-if straggler analysis, verdicts"),
    ("trace", "trace/", "job logs: writer/reader, formats, bubble check, synthetic runs; runs as op traces"),
    ("memory", "memory/", "analytic estimator; traced estimator (torch)"),
    ("runtime", "runtime/", "torch.distributed executor, driver, launch, p2p, comm plan (torch)"),
    ("integrations", "integrations/", "other runtimes: pipeloom plans in torch.distributed.pipelining (torch)"),
    ("tune", "tune/", "parallel-configuration search: cost model, bounds, launch files"),
    ("api", "api.py", "the facade: the few calls users start from"),
    ("cli", "cli/, demo.py", "one module per command: parse, call one library function, print; make demo"),
]
TORCH_FREE = {"core", "sim", "schedule", "partition", "viz", "trace/ops", "trace", "api", "cli"}


def layer_diagram(path: Path) -> Path:
    """The layer stack, lowest at the bottom; an arrow says imports only point down."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    n = len(LAYERS)
    fig = Figure(figsize=(10, 0.52 * n + 0.9), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.6, n + 0.3)
    ax.axis("off")
    for i, (name, folder, what) in enumerate(LAYERS):
        torch_free = name in TORCH_FREE
        face = "#dbe9f6" if torch_free else "#fde2c8"
        ax.add_patch(FancyBboxPatch((0.9, i + 0.08), 8.6, 0.8, boxstyle="round,pad=0.02,rounding_size=0.12",
                                    facecolor=face, edgecolor="#5b6b7b", linewidth=0.8))
        ax.text(1.1, i + 0.48, name, fontsize=11, fontweight="bold", va="center")
        ax.text(2.3, i + 0.48, folder, fontsize=9, family="monospace", va="center", color="#333333")
        ax.text(3.75, i + 0.48, what, fontsize=8.5, va="center", color="#222222")
    ax.add_patch(FancyArrowPatch((0.45, n - 0.1), (0.45, 0.1), arrowstyle="-|>", mutation_scale=14,
                                 color="#5b6b7b", linewidth=1.2))
    ax.text(0.28, n / 2, "imports point down", rotation=90, va="center", ha="center", fontsize=8.5,
            color="#5b6b7b")
    ax.add_patch(FancyBboxPatch((1.0, -0.45), 0.3, 0.25, boxstyle="round,pad=0.01", facecolor="#dbe9f6",
                                edgecolor="#5b6b7b", linewidth=0.6))
    ax.text(1.4, -0.33, "never imports torch", fontsize=8, va="center")
    ax.add_patch(FancyBboxPatch((3.4, -0.45), 0.3, 0.25, boxstyle="round,pad=0.01", facecolor="#fde2c8",
                                edgecolor="#5b6b7b", linewidth=0.6))
    ax.text(3.8, -0.33, "holds the torch modules (runtime/, memory/traced.py, models/llama.py, "
                        "models/slicing.py)", fontsize=8, va="center")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format=path.suffix.lstrip("."), metadata={"Software": None} if path.suffix == ".png" else None)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readme", action="store_true", help="redraw the committed README picture instead")
    args = ap.parse_args(argv)
    if args.readme:
        print(f"wrote {readme_picture().relative_to(DOCS.parent)}")
        return 0
    rows = family_pictures(GEN / "families")
    (GEN / "families.md").write_text(families_table(rows))
    layer_diagram(GEN / "layers.png")
    print(f"wrote {GEN.relative_to(DOCS.parent)}/ ({len(rows)} family charts, their table, the layer diagram)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
