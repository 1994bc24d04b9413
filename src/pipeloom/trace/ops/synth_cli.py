"""``python -m pipeloom.trace.ops.synth_cli``: write a synthetic op trace (Parquet/CSV) and its meta YAML (no torch).

Either format: pipeloom's own (:mod:`.synth`) or, with ``--real``, a Megatron-style trainer's (:mod:`.synth_real`).

    python -m pipeloom.trace.ops.synth_cli OUT.parquet --dp 4 --pp 8 --tp 4 --steps 40 --cause slow_worker
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict

from .synth import CAUSES, OpSynthConfig, generate, write
from .synth_real import REAL_CAUSES, RealSynthConfig, generate_real


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeloom.trace.ops.synth_cli",
                                description="Write a synthetic op trace (Parquet/CSV) and its meta YAML.")
    p.add_argument("out", help="OUT.parquet or OUT.csv; the meta goes to OUT.meta.yaml")
    for k in ("dp", "pp", "tp", "vpp", "steps", "seed"):
        p.add_argument(f"--{k}", type=int, default=getattr(OpSynthConfig(), k))
    p.add_argument("--microbatches", "-m", type=int, default=None)
    p.add_argument("--real", action="store_true",
                   help="the real trainer format (blocking P2P pairs, no-op records, overlapped reduce-scatter, "
                        "--cp context ranks, --skew ms clock offsets per machine); causes also slow_link")
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--skew", type=float, default=0.0)
    p.add_argument("--cause", choices=sorted(set(CAUSES) | set(REAL_CAUSES)), default="none")
    p.add_argument("--factor", type=float, default=2.0)
    p.add_argument("--where", default="0,0", help="dp_rank,stage of the cause (stage -1 = last)")
    p.add_argument("--jitter", type=float, default=0.02)
    p.add_argument("--all-tp-ranks", action="store_true")
    a = p.parse_args(argv)
    d, s = (int(x) for x in a.where.split(","))
    if a.real:
        if a.cause not in REAL_CAUSES or a.tp != 1:
            p.error(f"--real takes tp 1 and a cause of {', '.join(REAL_CAUSES)}")
        rcfg = RealSynthConfig(dp=a.dp, pp=a.pp, cp=a.cp, vpp=a.vpp, steps=a.steps, seed=a.seed,
                               microbatches=a.microbatches,
                               cause=a.cause, factor=a.factor, where=(d, s), jitter=a.jitter, skew=a.skew)
        res = generate_real(rcfg)
        stem = a.out[: -len(".csv.gz")] if a.out.endswith(".csv.gz") else os.path.splitext(a.out)[0]
        write(a.out, res, meta_path=stem + ".meta.yaml")
        print(json.dumps({"out": a.out, "meta": stem + ".meta.yaml", "ops": int(len(res.columns["step"])),
                          "planted_slowdown": round(res.planted_slowdown, 4), "config": asdict(rcfg)}))
        return 0
    if a.cause not in CAUSES:
        p.error(f"cause {a.cause} needs --real")
    cfg = OpSynthConfig(dp=a.dp, pp=a.pp, tp=a.tp, vpp=a.vpp, steps=a.steps, seed=a.seed, microbatches=a.microbatches,
                        cause=a.cause, factor=a.factor, where=(d, s), jitter=a.jitter, all_tp_ranks=a.all_tp_ranks)
    res = generate(cfg)
    stem = a.out[: -len(".csv.gz")] if a.out.endswith(".csv.gz") else os.path.splitext(a.out)[0]
    write(a.out, res, meta_path=stem + ".meta.yaml")
    print(json.dumps({"out": a.out, "meta": stem + ".meta.yaml", "ops": int(len(res.columns["step"])),
                      "planted_slowdown": round(res.planted_slowdown, 4), "config": asdict(cfg)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
