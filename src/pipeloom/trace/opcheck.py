"""``pipeloom check`` for op traces: read, rebuild the dependencies, replay what-ifs, give verdicts and pictures.

One call, :func:`check_optrace` (a trace file) or :func:`check_run_whatif` (a run log read by
:mod:`.reader`, turned into an op trace by :mod:`.runops`), returns a JSON-ready dict (see docs/diagnose.md
for every field) and writes the pictures: ``heatmap.png`` (workers x steps by S_w), ``timeline.perfetto.json``
(the slowest step as measured and as the what-if ideal replays it, two processes side by side) and, when a
stage is imbalanced, ``layer-costs.json`` for the suggested ``pipeloom partition`` command.
"""
from __future__ import annotations

import os

import numpy as np

from .optrace import OpTrace, read_optrace
from .verdicts import diagnose, write_layer_costs
from .whatif import analyse, build_model, replay_times, scenario_count


def parse_steps(text: str | None) -> list[int] | None:
    """``5``, ``1,3,5``, ``3:10`` (3..9) or ``3:`` / ``:10``; None = every step. ``:`` forms need the trace's steps."""
    if text is None:
        return None
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if ":" in part:
                a, b = part.split(":", 1)
                lo = int(a) if a.strip() else 0
                hi = int(b) if b.strip() else 1 << 40
                if hi <= lo or lo < 0:
                    raise ValueError
                out.extend(range(lo, min(hi, lo + 10_000_000)) if b.strip() else [-(lo + 1)])
            else:
                out.append(int(part))
                if out[-1] < 0:
                    raise ValueError
        except ValueError:
            raise ValueError(f"--steps {text!r}: give step numbers like 5, 1,3,5 or A:B (A..B-1) or A:") from None
    return out


def _resolve_steps(spec: list[int] | None, tr: OpTrace) -> list[int] | None:
    if spec is None:
        return None
    have = tr.steps
    out = set()
    for s in spec:
        if s < 0:  # "A:" open range
            out.update(x for x in have if x >= -s - 1)
        else:
            out.add(s)
    return sorted(out)


def _num(x) -> float | None:
    return None if not np.isfinite(x) else float(x)


def _by_rank(tr: OpTrace, steps: list[int] | None, scores: np.ndarray, pp: int) -> list[dict]:
    """Every recorded global rank with its worker's score (TP ranks of one worker share it)."""
    keep = tr.rank >= 0
    if steps is not None:
        keep &= np.isin(tr.step, steps)
    w = tr.dp[keep] * pp + tr.stage[keep]
    r = tr.rank[keep]
    if not r.size:
        return []
    pairs = np.unique(r * (int(w.max()) + 1) + w)
    return [{"rank": int(x // (int(w.max()) + 1)), "dp_rank": int(x % (int(w.max()) + 1)) // pp,
             "stage": int(x % (int(w.max()) + 1)) % pp, "score": float(scores[int(x % (int(w.max()) + 1))])}
            for x in pairs]


def _replay_block(res) -> dict:
    """The replay accuracy of :func:`~pipeloom.trace.whatif.replay_accuracy`, JSON-ready."""
    acc = dict(res.replay)
    acc["per_step"] = [{"step": s, "measured": float(res.t_measured[i]), "replayed": float(res.t_base[i]),
                        "error": _num(acc["per_step"][i])} for i, s in enumerate(res.steps)]
    acc["error"] = _num(acc["error"])
    acc["error_max_step"] = _num(acc["error_max_step"])
    acc["with_launch_gaps_error"] = _num(acc["with_launch_gaps_error"])
    return acc


def _replay_warning(res) -> list[str]:
    """One line when the what-if figures cannot be trusted (the replay of the measured durations is off)."""
    acc = res.replay
    if acc["reliable"]:
        return []
    worst = acc["disagrees_most"]
    how = ("shorter: waits the dependency model does not explain" if acc["replay_shorter"]
           else "longer: dependencies that ended after their dependant started")
    return [f"the what-if figures are unreliable: the replay of the measured durations is "
            f"{100 * acc['error']:.1f}% off the measured step (tolerance {100 * acc['tolerance']:.0f}%; {how})"
            + (f"; the dependency kind that disagrees most: {worst}" if worst else "")]


MIN_STEPS = 3
"""fewer analysed steps than this get a warning: the persistence rules of the verdicts need several steps"""


def default_out_dir(path: str) -> str:
    """``X.whatif`` beside the trace file or log directory ``X`` (extension dropped)."""
    path = os.path.abspath(path)
    base = os.path.basename(path)
    for ext in (".csv.gz", ".parquet", ".pq", ".csv"):
        if base.lower().endswith(ext):
            base = base[: -len(ext)]
            break
    return os.path.join(os.path.dirname(os.path.abspath(path)), base + ".whatif")


def check_optrace(path: str, *, meta: str | None = None, steps: str | None = None, threshold: float = 0.05,
                  layers: int | None = None, out_dir: str | None = None, pictures: bool = True,
                  progress=None) -> dict:
    """The whole analysis of one op trace; ``progress(total=None, advance=0, what=None)`` is told how far."""
    if progress is not None:
        progress(what="reading trace")
    tr = read_optrace(path, meta)
    return check_ops(tr, steps=steps, threshold=threshold, layers=layers, out_dir=out_dir or default_out_dir(path),
                     pictures=pictures, progress=progress)


def check_run_whatif(run, *, steps: str | None = None, threshold: float = 0.05, layers: int | None = None,
                     out_dir: str | None = None, pictures: bool = True, progress=None) -> dict:
    """The same analysis of a run log (:class:`~pipeloom.trace.run.RunLog`: pipeloom's job logs, seed-003 text
    logs, torch profiler traces), through :func:`~pipeloom.trace.runops.optrace_of_run`; pictures go to
    ``out_dir`` (default ``LOGDIR.whatif/`` beside the log directory)."""
    from .runops import optrace_of_run

    tr = optrace_of_run(run)
    d = check_ops(tr, steps=steps, threshold=threshold, layers=layers, out_dir=out_dir or default_out_dir(run.root),
                  pictures=pictures, progress=progress)
    d["source"] = "run logs"
    return d


def check_ops(tr: OpTrace, *, steps: str | None = None, threshold: float = 0.05, layers: int | None = None,
              out_dir: str = "whatif", pictures: bool = True, progress=None) -> dict:
    """Analyse an op trace already in memory (a file's or a run log's): dependency model, what-if replays,
    verdicts, pictures in ``out_dir``; the JSON-ready dict of ``pipeloom check --json``."""
    def tell(**kw):
        if progress is not None:
            progress(**kw)

    path = tr.path
    sel = _resolve_steps(parse_steps(steps), tr)
    tell(what="dependency graph")
    model = build_model(tr, sel)
    tell(total=scenario_count(model) + 4, what="what-if replays")
    res = analyse(model, threshold=threshold, progress=lambda n: tell(advance=n))
    costs_path = os.path.join(out_dir, "layer-costs.json")
    vpp = tr.sizes.get("vpp_size", 1)
    dg = diagnose(res, model, threshold=threshold, layers=layers, vpp=vpp, costs_path=costs_path)
    pp, W = res.pp, res.W
    label = [f"dp {w // pp} / pp {w % pp}" for w in range(W)]
    swk = res.worker_slowdown_step()
    d = {
        "trace": path,
        "sizes": tr.sizes,
        "inferred_sizes": tr.inferred,
        "time_unit": tr.time_unit,
        "ops": int(model.n),
        "malformed_rows": tr.malformed,
        "malformed_examples": tr.examples,
        "steps": res.steps,
        "step_time_measured": float(res.t_measured.mean()),
        "step_time_replayed": float(res.t_replay.mean()),
        "step_time_no_launch_gaps": float(res.t_base.mean()),
        "step_time_ideal": float(res.t_ideal.mean()),
        "replay_error": res.replay_error,
        "replay_error_max_step": res.replay_error_max_step,
        "launch_slowdown": res.launch_slowdown,
        "slowdown": res.slowdown,
        "mw": res.mw,
        "mw_workers": [{"dp_rank": w // pp, "stage": w % pp} for w in res.mw_workers],
        "ms": res.ms,
        "by_worker": [{"dp_rank": w // pp, "stage": w % pp, "slowdown": res.worker_slowdown(w),
                       "exact": w in res.worker_exact, "score": float(dg.scores[w]),
                       "compute_ratio": float(np.nanmedian(res.compute_ratio[w]))
                       if np.isfinite(res.compute_ratio[w]).any() else None} for w in range(W)],
        "by_stage": [{"stage": s, "slowdown": float(res.by_stage[s])} for s in range(pp)],
        "by_dp_rank": [{"dp_rank": x, "slowdown": float(res.by_dp[x])} for x in range(res.dp)],
        "by_optype": [{"optype": t, "slowdown": v} for t, v in sorted(res.by_optype.items(), key=lambda kv: -kv[1])],
        "replay": _replay_block(res),
        "whatif_reliable": res.replay["reliable"],
        "per_step": [{"step": s, "measured": float(res.t_measured[i]), "replayed": float(res.t_replay[i]),
                      "replayed_no_launch_gaps": float(res.t_base[i]),
                      "replay_error": _num(res.replay["per_step"][i]), "ideal": float(res.t_ideal[i]),
                      "slowdown": float(res.step_slowdown[i]),
                      "mw": _num(res.mw_step[i]), "ms": _num(res.ms_step[i]),
                      "slowest_worker": {"dp_rank": int(np.argmax(swk[:, i])) // pp,
                                         "stage": int(np.argmax(swk[:, i])) % pp}}
                     for i, s in enumerate(res.steps)],
        "by_rank": _by_rank(tr, sel, dg.scores, pp),
        "stragglers": [{"dp_rank": a, "stage": b} for a, b in dg.stragglers],
        "imbalanced_stages": dg.imbalanced_stages,
        "slow_optypes": dg.slow_optypes,
        "no_fixed_straggler": dg.no_fixed_straggler,
        "verdicts": dg.verdicts,
        "partition_command": dg.partition_command,
        "threshold": threshold,
        "model": {"pipeline_edges": model.pipeline_edges, "p2p_pairs": model.p2p_pairs,
                  "collectives": model.collectives, "levels": len(model.levels),
                  "tp_rows_merged": model.merged_tp_rows, "scenarios": res.scenarios,
                  "placement": model.placement, "clock_alignment": model.clock},
        "warnings": tr.warnings + model.warnings + _replay_warning(res) + ([
            f"only {len(res.steps)} step(s) analysed: whether a slow worker is slow in every step (a straggler) or "
            f"only in some (no fixed straggler) rests on {len(res.steps)} step(s); analyse {MIN_STEPS} or more"]
            if len(res.steps) < MIN_STEPS else []),
        "pictures": {},
    }
    if dg.layer_costs:
        write_layer_costs(costs_path, dg.layer_costs)
        d["pictures"]["layer_costs"] = costs_path
    if pictures:
        tell(what="pictures")
        from ..viz.heatmap import draw_heatmap, op_timeline_trace

        marked = [dd * pp + s for dd, s in dg.stragglers]
        marked += [w for w in range(W) if w % pp in dg.imbalanced_stages]
        d["pictures"]["heatmap"] = draw_heatmap(
            os.path.join(out_dir, "heatmap.png"), swk, label, res.steps, marked=marked,
            title=f"S_w per step (slowdown the worker alone causes); overall S = {res.slowdown:.2f}x")
        i = int(np.argmax(res.step_slowdown))
        sel_ops = np.flatnonzero(model.k == i)
        ist, ien = replay_times(model, model.dt)
        bst, ben = replay_times(model, model.dm)

        def rows(st, en):
            out = [[] for _ in range(W)]
            for j in sel_ops[np.argsort(st[sel_ops], kind="stable")].tolist():
                out[int(model.worker[j])].append((model.optypes[int(model.op[j])], float(st[j]), float(en[j]),
                                                  {"mb": int(model.mb[j]), "gmc": int(model.gmc[j])}))
            return out

        scale = {"s": 1e6, "ms": 1e3, "us": 1.0, "ns": 1e-3}[tr.time_unit]
        d["pictures"]["timeline"] = op_timeline_trace(
            os.path.join(out_dir, "timeline.perfetto.json"),
            [(f"measured, step {res.steps[i]}", label, rows(model.rel_start, model.rel_end)),
             (f"replayed, measured durations without launch gaps, step {res.steps[i]}", label, rows(bst, ben)),
             (f"what-if ideal (typical durations), step {res.steps[i]}", label, rows(ist, ien))],
            us_per_unit=scale, info={"step": res.steps[i], "slowdown": float(res.step_slowdown[i])})
    return d
