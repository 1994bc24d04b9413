"""Bench: pipeloom's step-time model at the configurations of published dense training runs.

    python bench/published_runs.py [--out docs/bench/published_runs.md] [--json FILE]

Every row is a published run: its model, GPU, tensor / pipeline / data parallel degrees, global batch and
achieved throughput. pipeloom predicts the step at exactly that configuration (``pipeloom.tune`` with every
degree pinned) and the table compares predicted with published throughput per GPU. Per group of runs (a GPU
type), two calibrations are fitted: ONE flat efficiency (the fraction of peak FLOP/s every layer reaches), and
the efficiency curve of the hidden size (:func:`pipeloom.tune.costs.shape_efficiency`: one efficiency for wide
layers and the hidden size at which half of it is reached); each fit makes the largest over- and
under-prediction equal (minimax of the relative error). The rest of the model is not fitted: link figures are
the GPU presets' (pipeloom.tune.gpus), the TP overlap is Megatron's default (``async``), the DP reduction uses
Megatron-Core's default buckets on as many NICs as the DP group has ranks in a node.

Sources (figures copied, never derived):

* Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC'21,
  Table 1 (A100 80GB, GPT with seq 2048 and vocabulary 51,200). Its TFLOP/s count four passes (forward,
  recompute, two backward): ``96 B s l h^2 (1 + s/6h + V/16lh)`` per step; the published step time is that
  count / (GPUs x TFLOP/s). The table does not give the micro-batch size or schedule: we take micro-batch 1,
  1F1B and full recompute (the paper's Sec. 5.1 setting). The 530B and 1T rows are not included: no text copy
  of their shapes could be found to check them against.
* Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 4; the same figures in Balaji, SC'24):
  405B, TP8 CP1 PP16, seq 8192, 16M tokens per batch; 8,192 H100s at 430 TFLOP/s per GPU, 16,384 H100s at
  400. TFLOP/s there are model FLOPs (no recompute counted); the schedule is interleaved (vpp as the search
  picks, at most 4), micro-batch 1, no activation recompute (the paper), ZeRO-1 (a gradient-sharded run is
  a memory question: docs/memory.md). Whether these two fit in 80 GB is the memory model's question, not this
  bench's: they are predicted on a GPU of the H100's speed and unbounded memory.

* torchtitan's docs/performance.md (pytorch/torchtitan): Llama 3 8B and 70B, Llama 2 13B and 70B with FSDP2
  (ZeRO-3) on 64 A100 80GB, local batch 1 or 2 (no gradient accumulation), the activation checkpointing named
  there, tokens per second per GPU (WPS). 2024 software (FlashAttention, FSDP2): fitted as their own group, and
  also shown at the efficiency of the 2021 Megatron rows on the same GPU. Their "selective op" checkpointing is
  run as pipeloom's selective recompute (the attention core), which is not the same set of ops. Memory is not
  checked for them either (pipeloom's ZeRO-3 memory holds a whole chunk's gathered parameters, FSDP one layer's).

Not found as text (so not used): the Megatron-LM README's H100 weak-scaling table (an image) and torchtitan's
405B figures.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _harness import write_json, write_text  # noqa: E402

from pipeloom.models.config import ModelConfig  # noqa: E402
from pipeloom.tune import Calibration, Problem, TuneError, gpu_preset, tune, with_overrides  # noqa: E402


def gpt(h: int, L: int, a: int) -> ModelConfig:
    """Narayanan et al. 2021 Table 1's GPT: seq 2048, vocabulary 51,200, ffn = 4h, GeLU, LayerNorm, biases."""
    return ModelConfig(name=f"gpt-{L}x{h}", hidden=h, layers=L, heads=a, ffn=4 * h, vocab=51200, seq=2048,
                       mlp="gelu", norm="layernorm", bias=True, learned_positions=True)


LLAMA3_405B = ModelConfig(name="llama3-405b", hidden=16384, layers=126, heads=128, kv_heads=8, ffn=53248,
                          vocab=128256, seq=8192, rope_theta=500000.0)


@dataclass(frozen=True)
class Run:
    label: str
    model: "ModelConfig | str"
    """the model, or a preset name"""
    gpu: str
    tp: int
    pp: int
    gpus: int
    global_batch: int
    tflops: float
    """published TFLOP/s per GPU"""
    source: str
    counts_recompute: bool
    """the published TFLOP/s count the recompute forward (Narayanan et al.'s 4-pass count)"""
    schedules: tuple = ("1f1b",)
    recompute: tuple = ("full",)
    zero: tuple = (0,)
    extra: dict = field(default_factory=dict)
    tokens_per_gpu_s: float | None = None
    """published tokens per second per GPU (torchtitan's WPS), when that is what the source gives"""
    group: str | None = None
    """the rows fitted together (default: the GPU type)"""
    microbatch: int = 1

    def published_step(self) -> float:
        """Seconds per step implied by the published throughput."""
        m = _model(self)
        if self.tokens_per_gpu_s is not None:
            return self.global_batch * m.seq / (self.tokens_per_gpu_s * self.gpus)
        s, h, L, V = m.seq, m.hidden, m.layers, m.vocab
        if self.counts_recompute:  # Narayanan et al. 2021, Sec. 5.1 / appendix: 4 passes
            flops = 96 * self.global_batch * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
        else:  # model FLOPs: pipeloom's count of one step without recompute
            from pipeloom.tune.costs import step_model_flops
            flops = step_model_flops(m, self.global_batch, s)
        return flops / (self.gpus * self.tflops * 1e12)


#: the half hidden sizes of the efficiency curve tried (0: one efficiency for every width)
HALF_HIDDEN = (0.0, 250.0, 500.0, 750.0, 1000.0, 1500.0, 2000.0, 3000.0)
NARAYANAN = "Narayanan et al. 2021 (SC'21), Table 1"
LLAMA3 = "Dubey et al. 2024 (Llama 3), Table 4"
TITAN = "torchtitan docs/performance.md (FSDP2, 64 A100)"
TITAN_GROUP = "a100-80g, torchtitan FSDP2"
RUNS = [
    Run("1.7B", gpt(2304, 24, 24), "a100-80g", 1, 1, 32, 512, 137, NARAYANAN, True),
    Run("3.6B", gpt(3072, 30, 32), "a100-80g", 2, 1, 64, 512, 138, NARAYANAN, True),
    Run("7.5B", gpt(4096, 36, 32), "a100-80g", 4, 1, 128, 512, 142, NARAYANAN, True),
    Run("18.4B", gpt(6144, 40, 48), "a100-80g", 8, 1, 256, 1024, 135, NARAYANAN, True),
    Run("39.1B", gpt(8192, 48, 64), "a100-80g", 8, 2, 512, 1536, 138, NARAYANAN, True),
    Run("76.1B", gpt(10240, 60, 80), "a100-80g", 8, 4, 1024, 1792, 140, NARAYANAN, True),
    Run("145.6B", gpt(12288, 80, 96), "a100-80g", 8, 8, 1536, 2304, 148, NARAYANAN, True),
    Run("310.1B", gpt(16384, 96, 128), "a100-80g", 8, 16, 1920, 2160, 155, NARAYANAN, True),
    Run("405B 8K GPUs", LLAMA3_405B, "h100", 8, 16, 8192, 2048, 430, LLAMA3, False, ("interleaved",), ("none",),
        (1,), {"ignore_memory": True}),
    Run("405B 16K GPUs", LLAMA3_405B, "h100", 8, 16, 16384, 2048, 400, LLAMA3, False, ("interleaved",), ("none",),
        (1,), {"ignore_memory": True}),
    # torchtitan, FSDP2 (ZeRO-3) on 64 A100 80GB, local batch = micro-batch, no gradient accumulation; WPS per GPU.
    # "selective op" checkpointing is not pipeloom's selective (attention core): the 8B row is run with selective
    Run("Llama 3 8B", "llama3-8b", "a100-80g", 1, 1, 64, 64, 0, TITAN, False, ("1f1b",), ("selective",), (3,),
        tokens_per_gpu_s=2973, group=TITAN_GROUP, extra={"ignore_memory": True}),
    Run("Llama 3 70B", "llama3-70b", "a100-80g", 1, 1, 64, 64, 0, TITAN, False, ("1f1b",), ("full",), (3,),
        tokens_per_gpu_s=331, group=TITAN_GROUP, extra={"ignore_memory": True}),
    Run("Llama 2 13B", "llama2-13b", "a100-80g", 1, 1, 64, 128, 0, TITAN, False, ("1f1b",), ("none",), (3,),
        tokens_per_gpu_s=2162, group=TITAN_GROUP, microbatch=2,
        extra={"ignore_memory": True}),
    Run("Llama 2 70B", "llama2-70b", "a100-80g", 1, 1, 64, 128, 0, TITAN, False, ("1f1b",), ("full",), (3,),
        tokens_per_gpu_s=353, group=TITAN_GROUP, microbatch=2,
        extra={"ignore_memory": True}),
]


def predict(run: Run, eff: float, *, tp_overlap: str = "async", half_hidden: float = 0.0):
    """The best configuration pipeloom finds at the run's published degrees (its step time and its plan)."""
    gpu = gpu_preset(run.gpu)
    model = _model(run)
    if run.extra.get("ignore_memory"):  # a time question: whether the run fits is the memory model's (docs/memory.md)
        gpu = with_overrides(gpu, memory=1024 ** 4)
    prob = Problem(model=model, gpus=run.gpus, gpu=gpu, global_batch=run.global_batch,
                   seq=model.seq, tp=run.tp, pp=run.pp, top=1, schedules=run.schedules, recompute=run.recompute,
                   zero=run.zero, microbatch_sizes=(run.microbatch,), max_microbatch_size=run.microbatch,
                   partitions=("uniform",),
                   calibration=Calibration(efficiency=eff, efficiency_half_hidden=half_hidden, source="bench"),
                   tp_overlap=tp_overlap, reserve=0)
    return tune(prob).best


def _model(run: Run) -> ModelConfig:
    from pipeloom.models.hf_config import resolve_model

    return run.model if isinstance(run.model, ModelConfig) else resolve_model(run.model)


def errors(runs, eff, **kw) -> list[float]:
    """Predicted / published throughput - 1 per run (= published / predicted step - 1)."""
    out = []
    for r in runs:
        c = predict(r, eff, **kw)
        out.append(r.published_step() / c.step_time_s - 1.0)
    return out


def fit(runs, **kw) -> tuple[float, list[float]]:
    """The efficiency whose largest over- and under-prediction of throughput are equal (bisection: raising the
    efficiency raises every row's predicted throughput)."""
    lo, hi = 0.2, 1.0
    for _ in range(22):
        mid = (lo + hi) / 2
        e = errors(runs, mid, **kw)
        if max(e) + min(e) > 0:  # the over-prediction is the larger: lower the efficiency
            hi = mid
        else:
            lo = mid
    eff = (lo + hi) / 2
    return eff, errors(runs, eff, **kw)


def _range(errs) -> str:
    return f"{min(errs) * 100:+.1f}% .. {max(errs) * 100:+.1f}%"


def _plan(c) -> str:
    return f"tp{c.tp} pp{c.pp} vpp{c.vpp} dp{c.dp} mbs{c.microbatch_size} m{c.microbatches} {c.schedule} rc={c.recompute} z{c.zero}"


def table(groups: dict, fits: dict, **kw) -> tuple[list[str], list[dict]]:
    """One line per run: predicted with its group's curve (efficiency, half hidden) and with the flat efficiency."""
    rows = ["| run | fitted with | TP | PP | GPUs | batch | published per GPU | published step s | predicted step s | "
            "predicted per GPU | error | error, flat efficiency | exposed comm s | plan |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    data = []
    for gpu, runs in groups.items():
        f = fits[gpu]
        for r in runs:
            c = predict(r, f["curve_eff"], half_hidden=f["half_hidden"], **kw)
            flat = predict(r, f["flat_eff"], **kw)
            pub = r.published_step()
            err, err_flat = pub / c.step_time_s - 1.0, pub / flat.step_time_s - 1.0
            if r.tokens_per_gpu_s is not None:
                shown, pred_shown = f"{r.tokens_per_gpu_s:g} tok/s", f"{r.tokens_per_gpu_s * pub / c.step_time_s:.0f} tok/s"
            else:
                shown, pred_shown = f"{r.tflops:g} TFLOP/s", f"{r.tflops * pub / c.step_time_s:.1f} TFLOP/s"
            rows.append(f"| {r.label} ({r.source.split(',')[0].split(' (')[0].split(' docs')[0]}) | {gpu} | {r.tp} | "
                        f"{r.pp} | {r.gpus} | {r.global_batch} | {shown} | {pub:.2f} | {c.step_time_s:.2f} | {pred_shown} | "
                        f"{err * 100:+.1f}% | {err_flat * 100:+.1f}% | {c.exposed_comm_s:.2f} | {_plan(c)} |")
            data.append({"run": r.label, "source": r.source, "group": gpu, "gpu": r.gpu, "tp": r.tp, "pp": r.pp,
                         "gpus": r.gpus, "global_batch": r.global_batch, "published_step_s": pub,
                         "predicted_step_s": c.step_time_s, "error": err, "error_flat": err_flat, "plan": _plan(c)})
            print(rows[-1], file=sys.stderr, flush=True)
    return rows, data


def fit_curve(runs, **kw) -> tuple[float, float, list[float]]:
    """(half hidden, efficiency, errors) of the curve whose error range is narrowest over :data:`HALF_HIDDEN`;
    runs of one hidden size cannot tell a curve from a flat efficiency: the flat one (half hidden 0)."""
    if len({_model(r).hidden for r in runs}) == 1:
        eff, errs = fit(runs, **kw)
        return 0.0, eff, errs
    best = None
    for half in HALF_HIDDEN:
        eff, errs = fit(runs, half_hidden=half, **kw)
        if best is None or max(errs) - min(errs) < max(best[2]) - min(best[2]) - 1e-9:
            best = (half, eff, errs)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the markdown page here")
    ap.add_argument("--json", default=None, help="write the rows as JSON here")
    ap.add_argument("--tp-overlap", default="async")
    ap.add_argument("--calibration-out", default=None, metavar="DIR",
                    help="write DIR/GPU.json per GPU type: the fitted curve (efficiency and half hidden size) "
                         "as a calibration file for 'pipeloom tune --calibration'")
    a = ap.parse_args()
    groups: dict[str, list[Run]] = {}
    for r in RUNS:
        groups.setdefault(r.group or r.gpu, []).append(r)
    skipped = []
    for gpu in list(groups):
        try:
            predict(groups[gpu][0], 0.5, tp_overlap=a.tp_overlap)
        except TuneError as e:  # e.g. a sharding level this checkout's tuner does not search
            skipped.append(f"{gpu} ({len(groups[gpu])} runs): this checkout's tuner refuses them: {e}")
            del groups[gpu]
    fits = {}
    for gpu, runs in groups.items():
        flat_eff, flat_errs = fit(runs, tp_overlap=a.tp_overlap)
        half, eff, errs = fit_curve(runs, tp_overlap=a.tp_overlap)
        off_eff, off_errs = fit(runs, tp_overlap="off")  # every TP collective exposed, as the old model charged
        fits[gpu] = {"flat_eff": flat_eff, "flat_errors": flat_errs, "half_hidden": half, "curve_eff": eff,
                     "curve_errors": errs, "off_eff": off_eff, "off_errors": off_errs}
        print(f"{gpu}: flat {flat_eff:.4f} ({_range(flat_errs)}), curve {eff:.4f} at half hidden {half:g} "
              f"({_range(errs)}), tp-overlap off {off_eff:.4f} ({_range(off_errs)})", file=sys.stderr, flush=True)
    rows, data = table(groups, fits, tp_overlap=a.tp_overlap)
    lines = ["# Published dense runs: predicted against measured", "",
             f"Command: `python bench/published_runs.py{' --tp-overlap ' + a.tp_overlap if a.tp_overlap != 'async' else ''}"
             " --out docs/bench/published_runs.md`", "",
             __doc__.split("\n\n", 2)[2].split("\nNot found")[0].strip().replace("``", "`").replace(":class:", ""), "",
             "## Fitted efficiency per GPU type", "",
             "Flat: one efficiency for every layer. Curve: `efficiency x h / (h + half_hidden)` of the hidden size h "
             "(`efficiency_half_hidden` in a calibration file, `--efficiency-half-hidden`: the share of a layer's work "
             "that is not GEMMs, norms, activations, residuals, falls as 1/h), the half hidden size from "
             f"{', '.join(f'{h:g}' for h in HALF_HIDDEN)} with the narrowest error range, the efficiency fitted "
             "with it. Error = predicted / published throughput - 1; each fit makes the largest over- and "
             "under-prediction equal.", "",
             "| group | flat efficiency | its errors | curve: half hidden | curve: efficiency (wide layers) | its errors | "
             "flat, every TP collective exposed (`--tp-overlap off`) |", "|---|---|---|---|---|---|---|"]
    for gpu, f in fits.items():
        lines.append(f"| {gpu} | **{f['flat_eff']:.3f}** | {_range(f['flat_errors'])} | {f['half_hidden']:g} | "
                     f"**{f['curve_eff']:.3f}** | {_range(f['curve_errors'])} | {f['off_eff']:.3f}: "
                     f"{_range(f['off_errors'])} |")
    for g, runs in groups.items():  # a later group on a GPU type at the first group's efficiency
        first = next((x for x in groups if groups[x][0].gpu == runs[0].gpu), g)
        if first != g:
            errs = errors(runs, fits[first]["flat_eff"], tp_overlap=a.tp_overlap)
            lines.append(f"\n{g} at the {first} flat efficiency {fits[first]['flat_eff']:.3f}: {_range(errs)}.")
    lines += ["", "## Every run (its group's curve; the flat efficiency's error beside it)", "",
              "exposed comm = the step's communication not hidden behind compute (DP reduction tail, parameter "
              "all-gathers) beyond the pipeline's makespan.", ""]
    lines += rows
    lines += ["", *(f"Not evaluated: {x}" for x in skipped)]
    lines += ["", "Not found as text (so not used): the Megatron-LM README's H100 weak-scaling table (an image), "
              "torchtitan's 405B figures, and the 530B and 1T rows of Narayanan et al.'s Table 1.", ""]
    text = "\n".join(lines)
    if a.out:
        write_text(a.out, text)
    else:
        print(text)
    if a.json:
        write_json(a.json, {"fits": fits, "rows": data})
    if a.calibration_out:  # the fit from published points as the tuner's calibration file
        for gpu, f in fits.items():
            names = ", ".join(sorted({r.source for r in groups[gpu]}))
            write_json(os.path.join(a.calibration_out, f"{gpu.split(',')[0]}.json"),
                       {"efficiency": round(f["curve_eff"], 4), "efficiency_half_hidden": f["half_hidden"],
                        "source": f"bench/published_runs.py: fitted on {names} ({len(groups[gpu])} runs, errors "
                                  f"{_range(f['curve_errors'])})"})
    ok = all(abs(d["error"]) <= 0.10 for d in data)
    print(f"every row within +-10%: {ok}", file=sys.stderr)


if __name__ == "__main__":
    main()
