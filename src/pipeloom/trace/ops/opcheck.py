"""``pipeloom check`` for op traces: read, rebuild the dependencies, replay what-ifs, give verdicts and pictures.

One call, :func:`check_optrace` (a trace file) or :func:`check_ops` (an op trace in memory; run logs come here
through :func:`pipeloom.trace.runops.check_run_whatif`), returns a JSON-ready dict (see docs/diagnose.md
for every field) and writes the pictures: ``heatmap.png`` (workers x steps by S_w), ``timeline.perfetto.json``
(the slowest step as measured and as the what-if ideal replays it, two processes side by side) and, when a
stage is imbalanced, ``layer-costs.json`` for the suggested ``pipeloom partition`` command.
"""
from __future__ import annotations

import os

import numpy as np

from .optrace import OpTrace, read_optrace
from .verdicts import diagnose, write_layer_costs
from .whatif import WhatIfError, analyse, build_model, replay_times, scenario_count


MAX_STEP = (1 << 31) - 1
"""the largest step number ``--steps`` takes"""


def step_ranges(text: str | None) -> list[tuple[int, int]] | None:
    """``5``, ``1,3,5``, ``3:10`` (3..9) or ``3:`` / ``:10`` as half-open ranges ``[lo, hi)``; None = every step."""
    if text is None:
        return None
    out: list[tuple[int, int]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if ":" in part:
                a, b = part.split(":", 1)
                lo = int(a) if a.strip() else 0
                hi = int(b) if b.strip() else MAX_STEP + 1
            else:
                lo = int(part)
                hi = lo + 1
            if hi <= lo or lo < 0 or lo > MAX_STEP:
                raise ValueError
        except ValueError:
            raise ValueError(f"--steps {text!r}: give step numbers like 5, 1,3,5 or A:B (A..B-1) or A: "
                             f"(0 <= A < B, steps up to {MAX_STEP})") from None
        out.append((lo, min(hi, MAX_STEP + 1)))
    if not out:
        raise ValueError(f"--steps {text!r}: give step numbers like 5, 1,3,5 or A:B (A..B-1) or A:")
    return out


def parse_steps(text: str | None) -> list[int] | None:
    """The steps of :func:`step_ranges` listed (an open range ``A:`` as ``-(A + 1)``; at most 10^7 steps a range)."""
    rs = step_ranges(text)
    if rs is None:
        return None
    out: list[int] = []
    for lo, hi in rs:
        out.extend([-(lo + 1)] if hi == MAX_STEP + 1 else range(lo, min(hi, lo + 10_000_000)))
    return out


def describe_steps(have: list[int], limit: int = 8) -> str:
    """``0..3, 7, 9..12`` (runs of consecutive steps; the first ``limit`` runs, then how many more)."""
    runs: list[list[int]] = []
    for x in have:
        if runs and x == runs[-1][1] + 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    text = ", ".join(f"{a}..{b}" if b > a else str(a) for a, b in runs[:limit])
    return text + (f" and {len(runs) - limit} more run(s)" if len(runs) > limit else "")


def select_steps(text: str | None, have: list[int], where: str) -> list[int] | None:
    """The steps of ``have`` that ``--steps text`` asks for (None: all); refuses a selection that matches none
    (naming the steps there are), and one that names a single step that is not there."""
    rs = step_ranges(text)
    if rs is None:
        return None
    arr = np.asarray(have, dtype=np.int64)
    keep = np.zeros(arr.shape, dtype=bool)
    for lo, hi in rs:
        keep |= (arr >= lo) & (arr < hi)
    missing = [lo for lo, hi in rs if hi == lo + 1 and lo not in set(have)]
    if not keep.any() or missing:
        what = f"step(s) {', '.join(map(str, missing[:5]))} are not" if keep.any() else "none of the steps asked for are"
        raise WhatIfError(f"--steps {text!r}: {what} in {where}; it has steps {describe_steps(list(have))}")
    return [int(x) for x in arr[keep]]


MAX_SPAN = 1e15
"""the longest op or step a trace may record, in its time unit (1e15 ns is 11 days)"""
MAX_KEY = (1 << 31) - 1
"""the largest rank, step, chunk or microbatch number a trace may hold"""


def check_plausible(tr: OpTrace) -> None:
    """Refuse an op trace the what-if analysis cannot make sense of, saying what is wrong (rather than tables of
    NaN, numpy warnings or a confident verdict): no compute ops, no time in them, absurd times, keys that are no
    indices."""
    from .whatif import COMPUTE_OPS

    where, unit = tr.path, tr.time_unit
    present = [tr.optypes[c] for c in np.unique(tr.op).tolist() if 0 <= c < len(tr.optypes)]
    codes = [i for i, n in enumerate(tr.optypes) if n in COMPUTE_OPS]
    comp = np.isin(tr.op, codes)
    if not comp.any():
        shown = ", ".join(present[:6]) + (f" and {len(present) - 6} more" if len(present) > 6 else "")
        raise WhatIfError(f"{where} has no compute ops (optypes {', '.join(COMPUTE_OPS)}), only {shown}: the what-if "
                          f"analysis times each worker's compute; name the optypes as docs/diagnose.md lists them")
    if not (tr.dur[comp] > 0).any():
        raise WhatIfError(f"{where}: every compute op lasts 0 {unit}; there is no time to analyse (a duration "
                          f"column of zeros, or a unit too coarse: set time_unit in the meta file)")
    longest = float(tr.dur.max()) if len(tr) else 0.0
    if longest > MAX_SPAN:
        raise WhatIfError(f"{where}: an op lasts {longest:.3g} {unit}, more than {MAX_SPAN:.0e} (a duration in another "
                          f"unit, or garbage): check the duration column and time_unit")
    order = np.argsort(tr.step, kind="stable")
    st, first = np.unique(tr.step[order], return_index=True)
    lo = np.minimum.reduceat(tr.start[order], first)
    hi = np.maximum.reduceat((tr.start + tr.dur)[order], first)
    if (hi - lo > MAX_SPAN).any():
        k = int(st[int(np.argmax(hi - lo))])
        raise WhatIfError(f"{where}: step {k} spans {float((hi - lo).max()):.3g} {unit}, more than {MAX_SPAN:.0e} "
                          f"(start_ts in mixed units, or garbage): check the start_ts column and time_unit")
    for name, col in (("dp_rank", tr.dp), ("stage", tr.stage), ("rank", tr.rank), ("step", tr.step),
                      ("seq_id", tr.seq), ("mc", tr.mc), ("gmc", tr.gmc), ("mb_id", tr.mb)):
        if col.size and (int(col.min()) < -1 or int(col.max()) > MAX_KEY):
            raise WhatIfError(f"{where}: column {name} holds values outside 0..{MAX_KEY} (too large for an index): "
                              f"these columns hold ranks, steps, chunks and microbatches")


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
    """The replay accuracy of :func:`~pipeloom.trace.ops.whatif.replay_accuracy`, JSON-ready."""
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


def check_ops(tr: OpTrace, *, steps: str | None = None, threshold: float = 0.05, layers: int | None = None,
              out_dir: str = "whatif", pictures: bool = True, progress=None,
              layers_per_stage: list[int] | None = None, machines: dict | None = None,
              handoffs: dict | None = None) -> dict:
    """Analyse an op trace already in memory (a file's or a run log's): dependency model, what-if replays,
    verdicts, pictures in ``out_dir``; the JSON-ready dict of ``pipeloom check --json``."""
    def tell(**kw):
        if progress is not None:
            progress(**kw)

    path = tr.path
    check_plausible(tr)
    sel = select_steps(steps, tr.steps, tr.path)
    tell(what="dependency graph")
    with np.errstate(all="ignore"):  # a degenerate replay is refused below, by name, not by numpy warnings
        model = build_model(tr, sel)
        tell(total=scenario_count(model) + 4, what="what-if replays")
        res = analyse(model, threshold=threshold, progress=lambda n: tell(advance=n))
    bad = [k for k, v in (("ideal step time", float(res.t_ideal.mean())), ("measured step time",
                                                                         float(res.t_measured.mean())),
                          ("replayed step time", float(res.t_replay.mean())),
                          ("step time without launch gaps", float(res.t_base.mean()))) if not (v > 0 and np.isfinite(v))]
    if bad:
        raise WhatIfError(f"{path}: the replay of these ops is degenerate ({', '.join(bad)} is zero or not finite): "
                          f"the steps have no time to compare (durations of zero, or ops that overlap nothing)")
    costs_path = os.path.join(out_dir, "layer-costs.json")
    vpp = tr.sizes.get("vpp_size", 1)
    dg = diagnose(res, model, threshold=threshold, layers=layers, layers_per_stage=layers_per_stage, vpp=vpp,
                  costs_path=costs_path, machines=machines, handoffs=handoffs)
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
        "verdict_details": [v.to_dict() for v in dg.items],
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
        from ...viz.heatmap import draw_heatmap, op_timeline_trace

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
