"""torch's multi-stage schedule classes against pipeloom's best schedule at torch's peak memory, same placement.

For every torch class (Interleaved1F1B, InterleavedZeroBubble, LoopedBFS: looped placement; ZBVZeroBubble,
DualPipeV: V placement), pp 2/4/8, m = pp, 2pp, 3pp, 4pp, vpp 2 and three cost sets, the order the class
generates (``pipeloom.integrations.torch.torch_builtin``, no processes) is timed by pipeloom's simulator,
with the memory model of torch's runtime (``runtime_mem_model("torch")``: B frees nothing, W frees the
chunk's activation). Its per-device peak P (the largest over devices) is then the memory limit for pipeloom:
every pipeloom builder of the same placement is planned at limit P under the same memory model (the
memory-aware ones honour it, the others count only where their own peak fits), every result is validated
under P, and the shortest is pipeloom's best.

    python bench/torch_schedules.py [--out docs/bench/torch_schedules.md] [--pp 2 4 8] [--json FILE]
                                    [--prove SECONDS] [--prove-jobs N]

A tie (pipeloom's best exactly as long as torch's) whose makespan no lower bound meets is handed to the
exact solver (the ``optimal`` builder: CP-SAT on pipeloom's own timing model, same placement, limit P and
memory model, started from torch's order) for at most ``--prove`` seconds on shapes of at most
``--prove-jobs`` jobs: where it proves that optimum, no schedule of that placement under P is shorter, so
torch's order is optimal and "strictly better" impossible; where it finds a shorter one, that is reported.

Cost sets (per chunk pass): ``equal`` F=B=W=1, comm 0; ``uneven`` F=1, B=1.5, W=0.7, comm 0.2;
``heavy-last`` F=B=W=1 and comm 0.1, the last chunk (loss and head) twice as long in F, B and W.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict

from pipeloom.core.costs import Costs, runtime_mem_model
from pipeloom.core.errors import ScheduleError
from pipeloom.core.files import atomic_write
from pipeloom.integrations.torch import torch_builtin
from pipeloom.schedule.planning import make_spec, plan
from pipeloom.schedule.search.bounds import lower_bound
from pipeloom.schedule.validate import validate
from pipeloom.sim.simulate import simulate

LOOPED = ("Interleaved1F1B", "InterleavedZeroBubble", "LoopedBFS")
V = ("ZBVZeroBubble", "DualPipeV")
#: pipeloom's builders per placement (all of those the registry has for it at vpp 2)
OURS = {"looped": ("zbvpp", "interleaved"), "v": ("zbv", "vhalf", "vmin", "dualpipev")}
#: tried only where the default builders tie torch's order and no bound proves the tie optimal: a builder with
#: options that spend more time (planning seconds reported per row)
SECOND = {"v": (("dualpipev", {"overlap_pairs": False, "reorder": 300.0}),)}


def second_effort(placement: str, pp: int, m: int, costs: Costs, mem, limit: float):
    """(label, makespan, peak, seconds) of the best SECOND builder under ``limit``, or None."""
    best = None
    for name, opts in SECOND.get(placement, ()):
        t0 = time.process_time()
        try:
            s = plan(name, make_spec(pp=pp, microbatches=m, vpp=VPP, costs=costs, mem=mem, mem_limit=limit,
                                     options=opts))
        except (ScheduleError, ValueError):
            continue
        if validate(s, mem=mem, mem_limit=limit):
            continue
        r = simulate(s, costs, mem)
        label = name + " -O " + ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else format(v, 'g')}"
                                          for k, v in opts.items())
        if best is None or r.makespan < best[1] - 1e-9:
            best = (label, r.makespan, max(r.peak_memory), time.process_time() - t0)
    return best
VPP = 2


def cost_sets(nc: int) -> dict[str, Costs]:
    heavy = tuple([1.0] * (nc - 1) + [2.0])
    return {"equal": Costs(F=1, B=1, W=1, comm=0),
            "uneven": Costs(F=1, B=1.5, W=0.7, comm=0.2),
            "heavy-last": Costs(F=heavy, B=heavy, W=heavy, comm=0.1)}


def ours_at(names, pp: int, m: int, costs: Costs, mem, limit: float, cache: dict):
    """(best name, makespan, peak, planning seconds of each) of pipeloom's builders at ``limit``."""
    best, secs = None, {}
    for name in names:
        key = (name, pp, m, id(costs), limit)
        if key not in cache:
            t0 = time.process_time()
            try:
                s = plan(name, make_spec(pp=pp, microbatches=m, vpp=VPP, costs=costs, mem=mem, mem_limit=limit))
                if validate(s, mem=mem, mem_limit=limit):
                    raise ScheduleError("over the limit")
                r = simulate(s, costs, mem)
                cache[key] = (r.makespan, max(r.peak_memory), time.process_time() - t0, s.meta.get("lower_bound"))
            except (ScheduleError, ValueError):
                cache[key] = None  # (a builder without a memory limit whose own peak is above P)
        res = cache[key]
        if res is None:
            continue
        secs[name] = res[2]
        if best is None or res[0] < best[1] - 1e-9:
            best = (name, res[0], res[1], res[3])
    return best, secs


def prove(row: dict, costs: Costs, mem, seconds: float, max_jobs: int) -> None:
    """Exact CP-SAT run on a tie no bound closes (see the module docstring); fills row['proof'] and, when
    proven, row['bound'] (the optimum); row['exact'] holds the solver's best makespan and status."""
    pp, m = row["pp"], row["m"]
    if 3 * m * pp * VPP > max_jobs or seconds <= 0:
        return
    ts = torch_builtin(row["torch"], pp, m, VPP)
    placement = "interleaved" if row["placement"] == "looped" else "v"
    t0 = time.perf_counter()
    s = plan("optimal", make_spec(pp=pp, microbatches=m, vpp=VPP, costs=costs, mem=mem, mem_limit=row["torch_peak"],
                                  options={"placement": placement, "time_limit": seconds, "workers": 2,
                                           "formulation": "interval", "hints": False, "allow_large": True,
                                           "start_from": [ts]}))
    if validate(s, mem=mem, mem_limit=row["torch_peak"]):
        raise ScheduleError("optimal: over the limit")  # plan() validates; kept as a guard
    span = simulate(s, costs, mem).makespan
    row["exact"] = {"status": s.meta["status"], "makespan": span, "bound": s.meta["best_bound"],
                    "seconds": round(time.perf_counter() - t0, 1)}
    if s.meta["status"] == "OPTIMAL" and span >= row["torch_makespan"] - 1e-9:
        row["bound"], row["proof"] = span, f"CP-SAT {row['exact']['seconds']:g} s"


def rows(pps, progress=True, prove_s: float = 0.0, prove_jobs: int = 0) -> list[dict]:
    mem = runtime_mem_model("torch")
    out, cache = [], {}
    for pp in pps:
        sets = cost_sets(pp * VPP)
        for cname, costs in sets.items():
            for m in (pp, 2 * pp, 3 * pp, 4 * pp):
                for cls in LOOPED + V:
                    placement = "looped" if cls in LOOPED else "v"
                    row = {"torch": cls, "placement": placement, "pp": pp, "m": m, "costs": cname}
                    try:
                        ts = torch_builtin(cls, pp, m, VPP)
                    except ScheduleError as e:
                        row["error"] = str(e)
                        out.append(row)
                        continue
                    tr = simulate(ts, costs, mem)
                    limit = max(tr.peak_memory)
                    best, secs = ours_at(OURS[placement], pp, m, costs, mem, limit, cache)
                    row.update(torch_makespan=tr.makespan, torch_peak=limit)
                    if best is None:
                        row["ours"] = None
                    else:
                        row.update(ours=best[0], ours_makespan=best[1], ours_peak=best[2],
                                   plan_s=max(secs.values()))
                        if best[3] is None:  # (a builder that reports none): pipeloom's analytic bound
                            spec = make_spec(pp=pp, microbatches=m, vpp=VPP, costs=costs, mem=mem, mem_limit=limit)
                            row["bound"] = lower_bound(spec, ts.placement).value if 3 * m * pp * VPP <= 5000 else None
                        else:
                            row["bound"] = best[3]
                        if row.get("bound") is not None and best[1] <= row["bound"] + 1e-6:
                            row["proof"] = "bound"
                        elif best[1] >= tr.makespan - 1e-9:
                            more = second_effort(placement, pp, m, costs, mem, limit)
                            if more is not None and more[1] < best[1] - 1e-9:
                                row.update(ours=more[0], ours_makespan=more[1], ours_peak=more[2],
                                           second_s=more[3])
                        if not row.get("proof") and abs(row["ours_makespan"] - tr.makespan) <= 1e-9:
                            prove(row, costs, mem, prove_s, prove_jobs)
                    out.append(row)
                    if progress:
                        print(f"\r{len(out)} rows (pp {pp}, {cname}, m {m})", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return out


def verdict(r: dict) -> str:
    if r.get("ours") is None:
        return "no fit"
    if r["ours_makespan"] < r["torch_makespan"] - 1e-9:
        return "better"
    if r["ours_makespan"] > r["torch_makespan"] + 1e-9:
        return "worse"
    if r.get("proof"):
        return "equal (optimal)"
    return "equal (open)"


def markdown(rs: list[dict], argv: list[str], prove_s: float = 0.0, prove_jobs: int = 0) -> str:
    PROVE_TEXT = f"{prove_s:g} s on shapes of at most {prove_jobs} jobs"
    lines = ["# torch's multi-stage schedules vs pipeloom at torch's peak memory", "",
             "Command (CPU, Python 3.11, default planning effort; `plan s` is the CPU time, `time.process_time`, of "
             "the slowest of pipeloom's builders tried for the shape, each with its default options):", "", "```", "python bench/torch_schedules.py " + " ".join(argv), "```", "",
             "Each torch class's own order (built by `torch_builtin`, torch 2.13) is timed by pipeloom's "
             "simulator with torch's runtime memory model (`--runtime torch`: B frees nothing, W frees the "
             "activation). Its peak P (largest over devices, in units of one full-stage microbatch activation) "
             "is the limit for pipeloom's builders of the same placement (looped: `zbvpp`, `interleaved`; "
             "V: `zbv`, `vhalf`, `vmin`, `dualpipev`), planned with the same costs and memory model; every "
             "result is validated under P and the shortest counts. vpp 2. Cost sets: `equal` F=B=W=1, comm 0; "
             "`uneven` F=1, B=1.5, W=0.7, comm 0.2; `heavy-last` F=B=W=1, comm 0.1, the last chunk twice as "
             "long. Where the default builders only tie torch's order and no bound proves the tie optimal, "
             "`dualpipev -O overlap_pairs=false,reorder=300` is tried as well: DualPipeV's order without its F&B "
             "pairs (at overlap 0 they hide nothing and only make an F wait for a B), then single jobs moved within "
             "their device under P by the simulator-timed local search (`pipeloom.schedule.search.reorder`) while "
             "the makespan or the sum of finish times shrinks; its CPU seconds show as (+N) in `plan s`.", ""]
    shorter = [r for r in rs if r.get("exact") and r["exact"]["makespan"] < r["torch_makespan"] - 1e-9]
    if shorter:
        lines += ["The exact solver found schedules shorter than torch's (and than pipeloom's default plan) at: "
                  + "; ".join(f"{r['torch']} pp {r['pp']} m {r['m']} {r['costs']}: {r['exact']['makespan']:.4g} "
                              f"({r['exact']['status']}, {r['exact']['seconds']:g} s)" for r in shorter) + ".", ""]
    unproven = [r for r in rs if r.get("exact") and not r.get("proof") and r not in shorter]
    if unproven:
        lines += ["Ties the exact solver could not close in its time (no shorter schedule found, the gap stays "
                  "open): " + "; ".join(f"{r['torch']} pp {r['pp']} m {r['m']} {r['costs']}: {r['torch_makespan']:.4g}, "
                                        f"bound {r['exact']['bound']:.4g} ({r['exact']['seconds']:g} s)"
                                        for r in unproven) + ".", ""]
    agg = defaultdict(lambda: defaultdict(int))
    gain = defaultdict(float)
    for r in rs:
        if "error" in r:
            agg[(r["torch"], r["costs"])]["n/a"] += 1
            continue
        v = verdict(r)
        agg[(r["torch"], r["costs"])][v] += 1
        if v != "no fit":
            k = (r["torch"], r["costs"])
            gain[k] = max(gain[k], 1 - r["ours_makespan"] / r["torch_makespan"])
    lines += ["## Summary", "", "\"equal (optimal)\": no schedule of that placement can be shorter under P, so torch's "
              "order is optimal there and \"strictly better\" is impossible. Proof (column `proof` below): `bound`, the "
              "makespan meets a proven lower bound at P (`meta['lower_bound']` of the builder, else "
              "`pipeloom.schedule.search.bounds.lower_bound`, shapes of at most 5 000 jobs); `CP-SAT`, the exact solver "
              "(`optimal` builder, interval model, 2 workers, same placement, limit and memory model, started from "
              "torch's order; at most "
              f"{PROVE_TEXT}) proved that makespan optimal. \"equal (open)\": a shorter one might exist.", "",
              "| torch class | costs | shapes | better | equal (optimal) | equal (open) | worse | no fit | "
              "torch cannot plan | largest gain |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for cls in LOOPED + V:
        for cname in ("equal", "uneven", "heavy-last"):
            a = agg.get((cls, cname))
            if not a:
                continue
            n = sum(a.values())
            lines.append(f"| {cls} | {cname} | {n} | {a['better']} | {a['equal (optimal)']} | {a['equal (open)']} | "
                         f"{a['worse']} | {a['no fit']} | "
                         f"{a['n/a']} | {100 * gain.get((cls, cname), 0):.1f}% |")
    lines += ["", "## Every shape", "",
              "| torch class | pp | m | costs | torch makespan | torch peak P | pipeloom best (at <= P) | makespan "
              "| peak | ours/torch | bound | proof | plan s |", "|---|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---|---:|"]
    for r in rs:
        if "error" in r:
            lines.append(f"| {r['torch']} | {r['pp']} | {r['m']} | {r['costs']} | torch cannot plan this shape | "
                         f"| | | | | | | |")
            continue
        if r.get("ours") is None:
            lines.append(f"| {r['torch']} | {r['pp']} | {r['m']} | {r['costs']} | {r['torch_makespan']:.4g} | "
                         f"{r['torch_peak']:g} | none fits | | | | | | |")
            continue
        lines.append(f"| {r['torch']} | {r['pp']} | {r['m']} | {r['costs']} | {r['torch_makespan']:.4g} | "
                     f"{r['torch_peak']:g} | {r['ours']} | {r['ours_makespan']:.4g} | {r['ours_peak']:g} | "
                     f"{r['ours_makespan'] / r['torch_makespan']:.3f} | "
                     f"{'' if r.get('bound') is None else format(r['bound'], '.4g')} | {r.get('proof', '')} | "
                     f"{r['plan_s']:.2f}" + (f" (+{r['second_s']:.0f})" if r.get("second_s") else "") + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pp", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--out", help="write the markdown page here (else print it)")
    ap.add_argument("--json", help="also write the rows as JSON here")
    ap.add_argument("--prove", type=float, default=120.0,
                    help="CP-SAT seconds (2 workers) per tie that no bound closes (0: none; default 120)")
    ap.add_argument("--prove-jobs", type=int, default=100, help="largest shape (jobs) the exact solver gets")
    args = ap.parse_args(argv)
    rs = rows(args.pp, prove_s=args.prove, prove_jobs=args.prove_jobs)
    shown = [a for a in (argv if argv is not None else sys.argv[1:])]
    md = markdown(rs, shown, args.prove, args.prove_jobs)
    if args.out:
        with atomic_write(args.out) as f:
            f.write(md)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(md)
    if args.json:
        with atomic_write(args.json) as f:
            json.dump(rs, f, indent=1, allow_nan=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
