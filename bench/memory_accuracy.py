"""Accuracy of pipeloom's memory estimator: analytic vs traced vs real CPU allocations.

    .venv/bin/python bench/memory_accuracy.py [--out docs/bench/memory.md]

Four sections, all on CPU (no GPU in this run):

1. analytic (``pipeloom.memory.analytic``, impl='eager') vs traced (``pipeloom.memory.traced``,
   fake tensors, saved_tensors_hooks) per chunk and microbatch: activations A (held after F) and
   H (held between B and W), for the built-in tiny Llama and Llama-2-7B / Llama-3-8B shaped chunks
   built on the meta device (full width and sequence length, 1 layer per chunk to stay fast).
2. traced vs real: a real forward + backward of each tiny/small Llama chunk on CPU; the CPU
   allocator's live bytes (torch.profiler profile_memory) after the forward and at the peak.
3. whole schedule, real: one pipeline device replayed for real on CPU (its 1F1B / interleaved job
   list with real forwards/backwards, received activations and gradients made on the fly,
   outputs freed after "send" as Megatron does) vs the analytic per-device peak
   (schedule memory trace x unit + transient).
4. published figures: Korthikanti et al. 2022 per-layer activations, Qi et al. 2024 W memory,
   Megatron bytes/parameter, and the analytic Llama-2 7B 1F1B pp4 figures.
"""
from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time

import torch

from _harness import write_text
from pipeloom.memory import analytic as an
from pipeloom.memory.traced import measure_chunk, measure_schedule, trace_chunk, trace_chunks
from pipeloom.models import llama

MiB = 1024 ** 2
DT = {"fp32": torch.float32, "bf16": torch.bfloat16}


def err(a: float, b: float) -> str:
    return f"{100.0 * (a - b) / b:+.2f}%" if b else "n/a"


def table(head: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def kb(x: float) -> str:
    return f"{x / 1024:,.1f} KiB" if x < 10 * MiB else f"{x / MiB:,.1f} MiB"


# ------------------------------------------------------------------------ 1. analytic vs traced
def section_analytic_vs_traced() -> tuple[str, float]:
    rows, worst = [], 0.0
    # tiny Llama, pp 4 (2 layers per chunk), both dtypes
    cfg = llama.LlamaConfig()
    split = llama.even_layer_split(cfg.layers, 4)
    x, y = llama.synthetic_batch(cfg, 2)
    for dt in ("fp32", "bf16"):
        mods = llama.build_chunk_modules(cfg, split, dtype=DT[dt])
        traced = trace_chunks(mods, x, target=y, loss_fn=llama.loss_fn)
        tr = an.TrainConfig(seq=cfg.seq, micro_batch=2, dtype=dt, impl="eager")
        chunks = an.chunk_memory(dataclasses.replace(cfg, name="llama-tiny"), tr, [len(c) for c in split])
        for t, a in zip(traced, chunks):
            e1, e2 = (a.activation_bytes - t.activation_bytes) / t.activation_bytes, \
                (a.w_held_bytes - t.w_held_bytes) / t.w_held_bytes
            worst = max(worst, abs(e1), abs(e2))
            rows.append([f"llama-tiny {dt} chunk {a.chunk}/4 (s=32, b=2)", kb(a.activation_bytes),
                         kb(t.activation_bytes), err(a.activation_bytes, t.activation_bytes),
                         kb(a.w_held_bytes), kb(t.w_held_bytes), err(a.w_held_bytes, t.w_held_bytes)])
    # full-size shapes on the meta device: one layer per chunk
    big = [("llama2-7b", dict(dim=4096, n_heads=32, n_kv_heads=32, ffn_dim=11008, vocab_size=32000), 4096, 1),
           ("llama3-8b", dict(dim=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=128256), 8192, 1)]
    for name, kw, seq, b in big:
        cfg = llama.LlamaConfig(n_layers=3, max_seq_len=seq, **kw)
        model = dataclasses.replace(cfg, name=name)
        tr = an.TrainConfig(seq=seq, micro_batch=b, dtype="bf16", impl="eager")
        chunks = an.chunk_memory(model, tr, [1, 1, 1])
        for c, (first, last) in enumerate([(True, False), (False, False), (False, True)]):
            with torch.device("meta"):
                m = llama.LlamaChunk(cfg, [c], first=first, last=last).to(torch.bfloat16)
            m.rope_cos, m.rope_sin = m.rope_cos.float(), m.rope_sin.float()
            if first:
                inp = torch.zeros(b, seq, dtype=torch.long, device="meta")
            else:
                inp = torch.empty(b, seq, cfg.hidden, dtype=torch.bfloat16, device="meta")
            tgt = torch.zeros(b, seq, dtype=torch.long, device="meta") if last else None
            t = trace_chunk(m, inp, target=tgt, loss_fn=llama.loss_fn if last else None)
            a = chunks[c]
            e1 = (a.activation_bytes - t.activation_bytes) / t.activation_bytes
            e2 = (a.w_held_bytes - t.w_held_bytes) / t.w_held_bytes
            worst = max(worst, abs(e1), abs(e2))
            what = "embed+layer" if first else "layer+head" if last else "layer"
            rows.append([f"{name}-shaped {what} bf16 (s={seq}, b={b})", kb(a.activation_bytes),
                         kb(t.activation_bytes), err(a.activation_bytes, t.activation_bytes),
                         kb(a.w_held_bytes), kb(t.w_held_bytes), err(a.w_held_bytes, t.w_held_bytes)])
    md = table(["chunk", "A analytic", "A traced", "err", "H analytic", "H traced", "err"], rows)
    return md, worst


# ------------------------------------------------------------------------ 2. traced vs real
def section_traced_vs_real() -> tuple[str, float, float]:
    rows, worst, worst_act = [], 0.0, 0.0
    shapes = [("llama-tiny", llama.LlamaConfig(), 2),
              ("llama-small", llama.LlamaConfig(dim=256, n_layers=4, n_heads=8, n_kv_heads=2, vocab_size=2048,
                                                max_seq_len=256), 2)]
    for name, cfg, b in shapes:
        for dt in ("fp32", "bf16"):
            split = llama.even_layer_split(cfg.layers, 2)
            mods = llama.build_chunk_modules(cfg, split, dtype=DT[dt])
            x, y = llama.synthetic_batch(cfg, b)
            tr = an.TrainConfig(seq=cfg.seq, micro_batch=b, dtype=dt, impl="eager")
            model = dataclasses.replace(cfg, name=name)
            chunks = an.chunk_memory(model, tr, [len(c) for c in split])
            for i, m in enumerate(mods):
                last = i == len(mods) - 1
                kw = dict(target=y, loss_fn=llama.loss_fn) if last else {}
                t = trace_chunk(m, x, **kw)
                real = measure_chunk(m, x, **kw)
                # the chunk input and the targets exist before the forward: not allocated by it
                traced_new = t.activation_bytes - t.input_bytes - (y.numel() * y.element_size() if last else 0)
                held_out = real.after_forward_bytes - real.activation_bytes  # output (or loss) kept
                pred_peak = traced_new + held_out + an.transient_bytes(model, tr, [chunks[i]])
                e1 = (traced_new - real.activation_bytes) / real.activation_bytes
                e2 = (pred_peak - real.peak_bytes) / real.peak_bytes
                worst_act = max(worst_act, abs(e1))
                worst = max(worst, abs(e2))
                rows.append([f"{name} {dt} chunk {i}/2 (s={cfg.seq}, b={b})", kb(traced_new),
                             kb(real.activation_bytes), err(traced_new, real.activation_bytes),
                             kb(pred_peak), kb(real.peak_bytes), err(pred_peak, real.peak_bytes)])
                with torch.no_grad():
                    x = m(x)
    md = table(["chunk", "activations traced", "real (allocator)", "err", "peak traced+transient",
                "real peak", "err"], rows)
    return md, worst_act, worst


# ------------------------------------------------------------------------ 3. whole schedule
def replay_device(sched, d: int, mods: dict, cfg, b: int, dtype, batches) -> int:
    return measure_schedule(sched, d, mods, inputs=[x for x, _ in batches], targets=[y for _, y in batches],
                            loss_fn=llama.loss_fn, activation=((b, cfg.seq, cfg.hidden), dtype), seed=d)


def section_schedule() -> tuple[str, float]:
    rows, worst = [], 0.0
    cfg = llama.LlamaConfig(dim=128, n_layers=8, n_heads=4, n_kv_heads=2, vocab_size=512, max_seq_len=128)
    b, pp, m = 2, 4, 8
    model = dataclasses.replace(cfg, name="llama-small")
    batches = [llama.synthetic_batch(cfg, b, seed=i) for i in range(m)]
    for sched_name, vpp in (("1f1b", 1), ("interleaved", 2), ("zbh1", 1), ("zbv", 2)):
        for dt in ("fp32", "bf16"):
            tr = an.TrainConfig(seq=cfg.seq, micro_batch=b, dtype=dt, impl="eager")
            rep = an.estimate(model, tr, schedule=sched_name, pp=pp, vpp=vpp, microbatches=m)
            split = llama.even_layer_split(cfg.layers, pp * vpp)
            sched = rep.schedule  # built with the analytic a/b, as the estimate used it
            for d in (0, pp - 1):
                chunks = sched.chunks_of(d)
                built = llama.build_chunk_modules(cfg, split, chunks=chunks, dtype=DT[dt])
                mods = dict(zip(chunks, built))
                real = replay_device(sched, d, mods, cfg, b, DT[dt], batches)
                dev = rep.devices[d]
                pred = dev.activations_bytes + dev.transient_bytes
                e = (pred - real) / real
                worst = max(worst, abs(e))
                rows.append([f"{sched_name} pp{pp} vpp{vpp} m{m} {dt}", d, f"{dev.peak_units:.2f}",
                             kb(dev.activations_bytes), kb(dev.transient_bytes), kb(pred), kb(real), err(pred, real)])
    md = table(["schedule", "device", "peak units", "activations (trace)", "transient", "predicted peak",
                "real peak", "err"], rows)
    return md, worst


# ------------------------------------------------------------------------ 4. published figures
def section_published() -> str:
    rows = []
    m = an.preset("gpt3-175b")
    for t, sp, rc in ((1, False, "none"), (8, False, "none"), (8, True, "none"), (8, True, "selective"),
                      (8, True, "full")):
        tr = an.TrainConfig(seq=2048, micro_batch=1, dtype="bf16", tp=t, sequence_parallel=sp, recompute=rc,
                            attention="math", impl="fused")
        ours = sum(i.bytes for i in an.layer_activations(m, tr))
        s, h, a = 2048, m.hidden, m.heads
        sbh = s * h
        paper = {("none", False): sbh * (10 + 24 / t + 5 * a * s / (h * t)),
                 ("none", True): sbh * (34 / t + 5 * a * s / (h * t)),
                 ("selective", True): sbh * 34 / t, ("full", True): 2 * sbh / t}[(rc, sp)]
        rows.append([f"GPT-3 175B layer, t={t}{' +SP' if sp else ''}, recompute {rc}", kb(paper), kb(ours),
                     err(ours, paper)])
    gl = an.ModelConfig(hidden=4096, layers=1, heads=32, ffn=16384, vocab=10, seq=2048, mlp="gelu", norm="layernorm",
                        dropout=0.1)
    tr = an.TrainConfig(seq=2048, dtype="bf16", attention="math")
    rows.append(["ZB (Qi et al. 2024) Table 1: W memory of a GPT layer = 32sbh (h=4096, s=2048)",
                 kb(32 * 2048 * 4096), kb(an.layer_w_held(gl, tr)), err(an.layer_w_held(gl, tr), 32 * 2048 * 4096)])
    for dt, per in (("fp16", 20), ("bf16", 18), ("fp32", 16)):
        got = sum(an.static_bytes(10 ** 6, an.TrainConfig(dtype=dt))) / 10 ** 6
        rows.append([f"Megatron distrib_optimizer.md: {dt} Adam bytes/param (no sharding)", per, f"{got:g}",
                     err(got, per)])
    got = sum(an.static_bytes(10 ** 6, an.TrainConfig(dtype="fp16"))) / 10 ** 6
    rows.append(["ZeRO (Rajbhandari et al. 2020): fp16 Adam bytes/param (no fp32 master grads)", 16, f"{got:g}",
                 err(got, 16) + " (Megatron keeps fp32 master grads: +4)"])
    md = table(["published figure", "published", "ours", "diff"], rows)
    # Llama-2 7B 1F1B pp4 (no published per-device figure found to compare against: shown for reference)
    r = an.estimate("llama2-7b", an.TrainConfig(seq=4096, dtype="bf16"), schedule="1f1b", pp=4, microbatches=8)
    r2 = an.estimate("llama2-7b", an.TrainConfig(seq=4096, dtype="bf16", recompute="full"), schedule="1f1b", pp=4,
                     microbatches=8)
    rows2 = []
    for lab, rep in (("none", r), ("full", r2)):
        for dv in rep.devices:
            rows2.append([lab, dv.device, f"{dv.params / 1e9:.2f}B", f"{dv.params_bytes / 2**30:.1f}",
                          f"{(dv.grads_bytes + dv.optimizer_bytes) / 2**30:.1f}",
                          f"{dv.activations_bytes / 2**30:.2f}", f"{dv.peak_bytes / 2**30:.1f}"])
    md2 = table(["recompute", "device", "params", "weights GiB", "grads+optim GiB", "activations GiB", "peak GiB"],
                rows2)
    return md + "\n\nLlama-2 7B, 1F1B, pp 4, m 8, tp 1, seq 4096, micro-batch 1, bf16, flash attention, " \
                "Megatron fused kernels (`pipeloom memory --model llama2-7b --pp 4 -m 8 --schedule 1f1b`):\n\n" + md2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the markdown report here (default: stdout only)")
    args = ap.parse_args()
    torch.manual_seed(0)
    t0 = time.time()
    s1, w1 = section_analytic_vs_traced()
    s2, w2a, w2 = section_traced_vs_real()
    s3, w3 = section_schedule()
    s4 = section_published()
    took = time.time() - t0
    doc = f"""# Memory estimator accuracy

Command: `.venv/bin/python bench/memory_accuracy.py --out docs/bench/memory.md` (CPU only, torch
{torch.__version__}, Python {platform.python_version()}, {took:.0f} s). A = activations one microbatch
keeps after F; H = what it still holds between B and W (GEMM inputs + GEMM output grads). Errors are
(estimate - reference) / reference. Target: |error| <= 5%.

## 1. Analytic vs traced (saved_tensors_hooks, fake tensors), per chunk and microbatch

The analytic model uses `impl='eager'`, the accounting of the unfused PyTorch ops of
`pipeloom.models.llama`; full-size shapes are built on the meta device (1 layer per chunk).
Worst |error|: **{100 * w1:.3f}%**.

{s1}

## 2. Traced vs real CPU allocations (torch.profiler, profile_memory)

Activations: the allocator's live bytes after a real forward, minus the chunk's output, vs the traced
saved bytes that the forward allocated (the chunk input and the targets exist before it): worst
|error| **{100 * w2a:.3f}%**. Peak: the highest live level during forward + backward (parameter
gradients preallocated, as trainers keep them) vs traced activations + kept output + the analytic
transient working set (`transient_bytes`): worst |error| **{100 * w2:.3f}%**. Caveat: the transient
formula (incoming grad + two ffn-wide grads, or 8 bytes x vocab per token on the last chunk) was derived
from the allocator records of these same runs, so this column shows the fit, not an independent test;
section 3 uses another shape.

{s2}

## 3. Whole schedule, real: one pipeline device replayed on CPU

Each row runs the device's full job list (8 microbatches) with real forwards and backwards
(`pipeloom.memory.traced.measure_schedule`); received activations/gradients are made on the fly, a sent
output's data is freed (Megatron's `deallocate_output_tensor`), parameter gradients are preallocated
(static memory, not part of the measured peak). zbh1 and zbv split the backward: B computes input grads
and keeps each GEMM's (input, output grad) for W, which computes the weight grads and frees them.
Model: Llama-style, dim 128, 8 layers, 4 heads / 2 KV heads, seq 128, micro-batch 2, vocab 512. Predicted = schedule memory trace (`memory_profile` with the analytic a/b) x unit +
transient. Worst |error|: **{100 * w3:.3f}%**.

{s3}

## 4. Published figures

{s4}

Notes:
- No GPU was available: `torch.cuda.max_memory_allocated` was not measured. CUDA kernels save
  different tensors than the CPU ones (e.g. flash-attention's log-sum-exp layout, cuBLAS workspaces);
  the allocator's caching and fragmentation are not modelled (use `--reserve`).
- We found no published per-device memory figure for Llama-2 7B under 1F1B at pp 4 that we could check
  offline; the table above is our estimate, not a comparison.
- Korthikanti's closed form ignores the LayerNorm statistics (8 bytes per token per norm, fp32 mean and
  rstd) that we keep: the +0.01% in section 4.
- The B/W split is measured for real in section 3 (zbh1, zbv): during F every nn.Linear of a split pair
  runs as a deferred GEMM (`pipeloom.memory.traced.measure_schedule`), B stashes (x, dy), W computes
  dW = dy^T x and frees them, as the runtime's executor does.
- The transient term was fitted to single-chunk allocator records (section 2); section 3 and the
  tests (`tests/memory/test_memory_traced.py`) check it on other shapes and whole schedules.
- "Real" here is PyTorch's CPU allocator as recorded by the profiler (`profile_memory=True`, raw
  `[memory]` records replayed in time order), for real forwards/backwards of `pipeloom.models.llama`.
"""
    print(doc)
    if args.out:
        write_text(args.out, doc)
    return 0 if max(w1, w2a, w2, w3) <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
