"""Bench of ``pipeloom tune``: best configurations of published models on 64 / 256 / 1,024 H100s, the gain of
zero-bubble / V schedules over the best 1F1B/interleaved-only configuration, and predictions of published runs.

    python bench/tune.py [--out docs/bench/tune.md] [--gpus 64,256,1024] [--models ...]

Prints a markdown document (the tables of docs/bench/tune.md). Every search runs with --top 1 (only the best
is needed), micro-batch sizes 1 and 2, recompute none/selective/full, ZeRO-1 on/off, the uniform and balanced
partitions (tune's defaults before --zero 0,1,2 and the 'ends' partition became its defaults: the table stays
comparable with its earlier runs), every registered builder but optimal. Published runs: see PUBLISHED below (sources in the output).
"""
from __future__ import annotations

import argparse
import sys
import time

from pipeloom.models.config import ModelConfig
from pipeloom.models.hf_config import resolve_model
from pipeloom.tune import Calibration, Problem, TuneError, gpu_preset, tune

CLASSIC = ("1f1b", "interleaved")

LLAMA3_405B = ModelConfig(name="llama3-405b", hidden=16384, layers=126, heads=128, kv_heads=8, ffn=53248,
                          vocab=128256, seq=8192, rope_theta=500000.0)
MODELS = {
    "llama2-7b": ("llama2-7b", 1024), "llama2-70b": ("llama2-70b", 1024), "llama3-8b": ("llama3-8b", 512),
    "llama3-70b": ("llama3-70b", 512), "llama3-405b": (LLAMA3_405B, 2048), "mixtral-8x7b": ("Mixtral-8x7B-v0.1", 1024),
    "qwen3-30b-a3b": ("Qwen3-30B-A3B", 1024),
}


def gpt(h, L, a):
    # Narayanan et al. SC'21, Table 1: GPT, seq 2048, vocabulary 51,200, ffn = 4h
    return ModelConfig(name=f"gpt-{L}x{h}", hidden=h, layers=L, heads=a, ffn=4 * h, vocab=51200, seq=2048,
                       mlp="gelu", norm="layernorm", bias=True, learned_positions=True)


#: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC'21,
#: Table 1 (A100 80GB, 1F1B, micro-batch 1, full recompute): (model, tp, pp, gpus, global batch, TFLOP/s per GPU)
#: TFLOP/s there count 4 passes (forward, recompute, backward x2): 96 B s l h^2 (1 + s/6h + V/16lh).
NARAYANAN = [
    (gpt(2304, 24, 24), 1, 1, 32, 512, 137), (gpt(3072, 30, 32), 2, 1, 64, 512, 138),
    (gpt(4096, 36, 32), 4, 1, 128, 512, 142), (gpt(6144, 40, 48), 8, 1, 256, 1024, 135),
    (gpt(8192, 48, 64), 8, 2, 512, 1536, 138), (gpt(10240, 60, 80), 8, 4, 1024, 1792, 140),
    (gpt(12288, 80, 96), 8, 8, 1536, 2304, 148), (gpt(16384, 96, 128), 8, 16, 1920, 2160, 155),
]
#: Llama 3 (Dubey et al. 2024, Table 4): 405B, TP8 PP16, seq 8192, 16M tokens per batch: BF16 MFU
LLAMA3_RUNS = [(8192, 0.43), (16384, 0.41)]


def run(prob: Problem):
    t = time.perf_counter()
    try:
        res = tune(prob)
    except TuneError as e:
        return None, str(e), time.perf_counter() - t
    return res, None, time.perf_counter() - t


def _fmt(c) -> str:
    return (f"tp{c.tp} pp{c.pp} vpp{c.vpp} dp{c.dp}{f' ep{c.ep}' if c.ep > 1 else ''}"
            f"{f' cp{c.cp}' if c.cp > 1 else ''} mbs{c.microbatch_size} m{c.microbatches} {c.schedule}"
            f"{' lim ' + format(c.mem_limit, '.3g') if c.mem_limit is not None else ''} rc={c.recompute}"
            f" z{c.zero}")


def best_table(models, gpus_list, eff, pairs=None, max_vpp=4) -> list[str]:
    rows = ["| model | GPUs | best config (all families) | MFU | best 1F1B/interleaved only | MFU | ZB/V gain | "
            "search s |", "|---|---|---|---|---|---|---|---|"]
    todo = pairs or [(k, n) for k in models for n in gpus_list]
    for key, n in todo:
        spec, gb = MODELS[key]
        model = spec if isinstance(spec, ModelConfig) else resolve_model(spec)
        if True:
            base = dict(model=model, gpus=n, gpu=gpu_preset("h100"), global_batch=gb, seq=model.seq, top=1,
                        max_microbatch_size=2, max_vpp=max_vpp, calibration=Calibration(efficiency=eff, source="bench"),
                        zero=(0, 1), partitions=("uniform", "balanced"))
            a, ea, ta = run(Problem(**base))
            b, eb, tb = run(Problem(**base, schedules=CLASSIC))
            ca = a.best if a else None
            cb = b.best if b else None
            gain = f"{(cb.step_time_s / ca.step_time_s - 1) * 100:+.1f}%" if ca and cb else "-"
            rows.append(f"| {key} (gb {gb}) | {n} | {_fmt(ca) if ca else 'fits nowhere'} | "
                        f"{ca.mfu * 100:.1f}% | " if ca else f"| {key} (gb {gb}) | {n} | fits nowhere: "
                        f"{(ea or '')[:90]} | - | ")
            rows[-1] += (f"{_fmt(cb)} | {cb.mfu * 100:.1f}% | {gain} | {ta:.0f} |" if cb else f"- | - | - | {ta:.0f} |")
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def narayanan_step(model, gb, gpus, tflops):
    s, h, L, V = model.seq, model.hidden, model.layers, model.vocab
    flops = 96 * gb * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    return flops / (gpus * tflops * 1e12)


def predict_fixed(model, tp, pp, gpus, gb, eff, gpu="a100-80g", schedules=("1f1b",), recompute=("full",), mbs=(1,),
                  zero=(0,)):
    prob = Problem(model=model, gpus=gpus, gpu=gpu_preset(gpu), global_batch=gb, seq=model.seq, tp=tp, pp=pp, top=1,
                   schedules=schedules, recompute=recompute, zero=zero, microbatch_sizes=mbs, max_microbatch_size=max(mbs),
                   calibration=Calibration(efficiency=eff, source="bench"), partitions=("uniform",))
    return tune(prob).best


def calibrate(model, tp, pp, gpus, gb, target_step, **kw) -> float:
    lo, hi = 0.05, 1.0
    for _ in range(18):
        mid = (lo + hi) / 2
        c = predict_fixed(model, tp, pp, gpus, gb, mid, **kw)
        if c.step_time_s > target_step:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def published_tables(narayanan: bool = True) -> tuple[list[str], float]:
    out = [] if not narayanan else ["### Narayanan et al. SC'21, Table 1 (GPT, A100 80GB, 1F1B, micro-batch 1, full recompute)", "",
           "Efficiency calibrated on the 18B row (TP8 PP1, 256 GPUs), every other row predicted.", "",
           "| model | TP | PP | GPUs | batch | published TFLOP/s/GPU | published step s | predicted step s | error |",
           "|---|---|---|---|---|---|---|---|---|"]
    cal_row = NARAYANAN[3]
    m, tp, pp, g, gb, tf = cal_row
    if narayanan:
        eff = calibrate(m, tp, pp, g, gb, narayanan_step(m, gb, g, tf))
        out.insert(3, f"Calibrated efficiency: **{eff:.3f}** of A100 peak (312 TFLOP/s).")
    for m, tp, pp, g, gb, tf in (NARAYANAN if narayanan else []):
        pub = narayanan_step(m, gb, g, tf)
        try:
            c = predict_fixed(m, tp, pp, g, gb, eff)
            pred = c.step_time_s
            err = f"{(pred / pub - 1) * 100:+.1f}%" + (" (calibration row)" if (m, tp, pp) == cal_row[:3] else "")
            out.append(f"| {m.name} | {tp} | {pp} | {g} | {gb} | {tf} | {pub:.2f} | {pred:.2f} | {err} |")
        except TuneError as e:
            out.append(f"| {m.name} | {tp} | {pp} | {g} | {gb} | {tf} | {pub:.2f} | - | {str(e)[:80]} |")
        print(out[-1], file=sys.stderr, flush=True)
    out += ["", "### Llama 3 405B (Dubey et al. 2024, Table 4: TP8 PP16, seq 8192, 16M-token batches, H100)", "",
            "Same efficiency as calibrated above would be for A100; here calibrated on the 8,192-GPU run "
            "(43% MFU), the 16,384-GPU run predicted. Search restricted to TP8 PP16, interleaved/1F1B, "
            "micro-batch 1, any vpp, recompute and ZeRO-1.", "",
            "| GPUs | DP | published MFU | predicted MFU | error | predicted config |", "|---|---|---|---|---|---|"]
    m = LLAMA3_405B
    gpus0, mfu0 = LLAMA3_RUNS[0]
    gb = 16 * 1024 * 1024 // m.seq
    lo, hi = 0.05, 1.0
    kw = dict(gpu="h100", schedules=CLASSIC, recompute=("none", "selective", "full"), zero=(0, 1))
    for _ in range(14):
        mid = (lo + hi) / 2
        c = predict_fixed(m, 8, 16, gpus0, gb, mid, **kw)
        lo, hi = (mid, hi) if c.mfu < mfu0 else (lo, mid)
    eff3 = (lo + hi) / 2
    for g, mfu in LLAMA3_RUNS:
        c = predict_fixed(m, 8, 16, g, gb, eff3, **kw)
        out.append(f"| {g} | {g // 128} | {mfu * 100:.0f}% | {c.mfu * 100:.1f}% | "
                   f"{(c.mfu / mfu - 1) * 100:+.1f}%{' (calibration run)' if g == gpus0 else ''} | {_fmt(c)} |")
        print(out[-1], file=sys.stderr, flush=True)
    out.insert(-len(LLAMA3_RUNS) - 2, f"Calibrated efficiency: **{eff3:.3f}** of H100 peak (989 TFLOP/s).")
    print(out[-len(LLAMA3_RUNS) - 3], file=sys.stderr, flush=True)
    return out, eff3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", default="64,256,1024")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--skip-published", action="store_true")
    ap.add_argument("--pairs", default=None, help="model:gpus,... instead of every model x --gpus")
    ap.add_argument("--max-vpp", type=int, default=4)
    ap.add_argument("--efficiency", type=float, default=None, help="skip the Narayanan table; use this efficiency "
                    "for the best-configuration table (the Llama 3 rows still calibrate their own)")
    a = ap.parse_args()
    lines = ["# pipeloom tune: bench", "", "Command: `python bench/tune.py " + " ".join(sys.argv[1:]) + "`", ""]
    eff = a.efficiency or 0.5
    if not a.skip_published:
        pub, eff3 = published_tables(narayanan=a.efficiency is None)
        eff = a.efficiency or eff3
        lines += ["## Against published runs", ""] + pub + [""]
    lines += ["## Best configurations on H100 (efficiency %.3f, from the Llama 3 calibration)" % eff, "",
              "Global batch in sequences (gb), sequence length = the model's. ZB/V gain = step time of the best "
              "1F1B/interleaved-only configuration / best overall - 1.", ""]
    pairs = [(p.split(":")[0], int(p.split(":")[1])) for p in a.pairs.split(",")] if a.pairs else None
    lines += best_table(a.models.split(","), [int(x) for x in a.gpus.split(",")], eff, pairs, a.max_vpp)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
