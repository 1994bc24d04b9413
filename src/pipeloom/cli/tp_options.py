"""simulate's tensor-parallel options: --tp-overlap, --tp-comm, --tp-regather, --tp-column-share, --tp-fuse (no torch)."""
from __future__ import annotations

__all__ = ["add_tp_options", "tp_result", "tp_wanted"]


def add_tp_options(p) -> None:
    g = p.add_argument_group(
        "tensor-parallel collectives",
        "Time each B/BW with the column-parallel input-gradient collective of a TP layer and what the runtime's "
        "--tp-overlap mode hides of it, job by job (pipeloom.sim.tp_jobs); --costs F/B/W are the compute. "
        "The forward's and the output-gradient collectives are the same in every mode: fold them into F and B.")
    g.add_argument("--tp-overlap", default=None, metavar="MODE",
                   help="off, async, chunked:K or fill (as 'pipeloom run --tp-overlap'); needs --tp-comm")
    g.add_argument("--tp-comm", default=None, metavar="C",
                   help="the input-gradient collective of one chunk pass in the units of --costs (one value, or "
                        "one per chunk as C0:C1:..)")
    g.add_argument("--tp-regather", default=None, metavar="R",
                   help="with sequence parallelism: the all-gathers of one chunk pass's column-parallel inputs, "
                        "run again for the weight gradients (W double-buffers them; a fused BW starts each before "
                        "its dgrad), in the units of --costs (one value, or R0:R1:.. one per chunk; default 0: "
                        "none, as without SP or with 'run --keep-gathered-input'); needs --tp-comm")
    g.add_argument("--tp-column-share", type=float, default=None, metavar="S",
                   help="share of a B's/W's GEMM time in the column-parallel groups, what can hide the collective "
                        "(default: from --model, else 0.5)")
    g.add_argument("--tp-fuse", action="store_true",
                   help="fuse each split B with its W (one BW job) where the split buys nothing under these TP "
                        "costs: the makespan does not grow and memory stays within --mem-limit "
                        "(pipeloom.schedule.tp_fuse)")


def tp_wanted(args) -> bool:
    given = [f for f, v in (("--tp-overlap", args.tp_overlap), ("--tp-comm", args.tp_comm)) if v is not None]
    if not given and (args.tp_fuse or args.tp_column_share is not None or args.tp_regather is not None):
        raise ValueError("--tp-fuse, --tp-column-share and --tp-regather need --tp-comm C (the collective per chunk "
                         "pass)")
    if given == ["--tp-overlap"]:
        raise ValueError("--tp-overlap needs --tp-comm C: the input-gradient collective of one chunk pass in the "
                         "units of --costs")
    return bool(given)


def _terms(args, nc: int):
    from ..sim.tp_jobs import TPJobTerms
    from ..tune.comm_terms import TPOverlap, TPOverlapError, column_share
    from .common import model_from_args

    try:
        ov = TPOverlap.parse(args.tp_overlap or "async")
    except TPOverlapError as e:
        raise ValueError(f"--tp-overlap: {e}") from None
    vals = _values("--tp-comm", args.tp_comm, nc)
    regather = _values("--tp-regather", args.tp_regather, nc) if args.tp_regather is not None else [0.0]
    share = args.tp_column_share
    if share is None:
        model = model_from_args(args) if getattr(args, "_partition_model", False) else None
        share = column_share(model) if model is not None else 0.5
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"--tp-column-share {share}: give a share between 0 and 1")
    return TPJobTerms(tuple(vals) if len(vals) > 1 else vals[0], share, ov.mode, ov.chunks,
                      regather=tuple(regather) if len(regather) > 1 else regather[0])


def _values(flag: str, text, nc: int) -> list[float]:
    """One value in cost units, or one per chunk (``C0:C1:..``), each finite and >= 0."""
    letter = flag.split("-")[-1][0].upper()
    try:
        vals = [float(x) for x in str(text).split(":")]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: give a number >= 0 in cost units, or {letter}0:{letter}1:.. one per "
                         f"chunk") from None
    if any(not (v >= 0 and v < float("inf")) for v in vals):
        raise ValueError(f"{flag} {text!r}: every value must be a finite number >= 0")
    if len(vals) > 1 and len(vals) != nc:
        raise ValueError(f"{flag} has {len(vals)} values; the plan has {nc} chunks (give one, or one per chunk)")
    return vals


def tp_result(args, sched, spec) -> tuple[object, dict]:
    """``(schedule, {"tp": ...})``: the makespan with the TP collectives per job (and the fused plan with
    --tp-fuse, whose schedule replaces the given one)."""
    from ..schedule.tp_fuse import fuse_for_tp, tp_makespan
    from ..sim.tp_jobs import TPJobTerms

    terms = _terms(args, sched.num_chunks)
    out = {"overlap": f"chunked:{terms.chunks}" if terms.mode == "chunked" else terms.mode,
           "comm": list(terms.comm) if isinstance(terms.comm, tuple) else terms.comm,
           "column_share": terms.col_share,
           "regather": list(terms.regather) if isinstance(terms.regather, tuple) else terms.regather}
    off = TPJobTerms(terms.comm, terms.col_share, "off", regather=terms.regather)
    out["makespan_off"] = tp_makespan(sched, spec.costs, off)[0]
    if args.tp_fuse:
        sched, summ = fuse_for_tp(sched, spec.costs, terms, mem=spec.mem, mem_limit=spec.mem_limit)
        out["fuse"] = summ
    span, detail = tp_makespan(sched, spec.costs, terms)
    out.update(makespan=span, exposed=detail["tp_exposed"], fill_moved=detail["tp_fill_moved"],
               fused_b=detail["tp_fused_b"], regather_exposed=detail["tp_regather_exposed"])
    return sched, {"tp": out}
