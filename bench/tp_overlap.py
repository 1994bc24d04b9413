"""Tensor-parallel communication overlap (``pipeloom run --tp-overlap``): the backward of tensor-parallel
decoder layers on tp 2 (2 gloo CPU ranks), each mode against its blocking control, on the emulated link
(``--tp-link-delay``: a collective lands D ms late, no CPU used) and on real gloo.

    python bench/tp_overlap.py [--pairs 14] [--dim 512] [--layers 1] [--tokens 512] [--chunks 2] [--sp-layers 2]
                               [--out TABLE.md]

One middle pipeline chunk (no embedding, no head) of the built-in Llama, sharded tp 2
(:mod:`pipeloom.models.tp`); its column-parallel groups (q/k/v, w1/w3) each all-reduce an input gradient.
Three comparisons, each a pair of entries timed alternately (A B, B A, ...; a barrier before each entry;
the slowest rank's time), medians and the median of the per-pair ratios:

* fused BW: the backward with weight gradients, ``async`` (each group's wgrad GEMMs while its all-reduce is in
  flight) against blocking (all-reduce, then the wgrad GEMMs);
* split B: the input-gradient backward alone (weight gradients deferred to W), ``chunked:K`` (the dgrad in K
  token pieces, piece i's all-reduce under piece i+1's GEMMs) against blocking;
* fill: B of microbatch 1 and W of microbatch 0, ``fill`` (B runs W(0)'s GEMMs while its all-reduces are in
  flight, W(0) does the rest) against B then W;
* W with sequence parallelism (the same layers, ``sequence_parallel=True``): the column groups kept their input's
  sequence shard and W gathers each again, double-buffered (group k+1's all-gather under group k's GEMMs,
  the runtime's default) against serial (each gather waited right before its group), and against the gathered
  inputs kept from F (``--keep-gathered-input``: no gather in W, more memory).

The emulated link's delay D is the wgrad GEMM time of one w1/w3 group measured at the start (so that the
collective and the work under it are of one size, where overlap can gain most); the link carries one
collective at a time. "ideal" = what a perfect overlap would save, from the GEMM times the control entry
measures in the same round (median over the rounds): fused, per group min(collective, its wgrad GEMMs);
chunked, per group (K-1)/K of min(collective, its dgrad GEMMs, which cost what the wgrad ones do); fill,
min(B's collectives, W(0)); re-gather, every gather but the first hidden under the GEMMs before it, per gather
min(collective, those GEMMs). The collective is D on the emulated link and a timed blocking all-reduce on real
gloo, which runs the reduction on the same 2 cores as the compute.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from _harness import median, paired_ratios, round_orders, write_text  # noqa: E402


def bench_worker(a: dict) -> dict:
    import torch
    import torch.distributed as dist

    from pipeloom.autograd.splitgrad import SplitGrad, weight_grads
    from pipeloom.models import tp_comm
    from pipeloom.models.llama import LlamaConfig
    from pipeloom.models.tp import build_tp_chunk_modules

    torch.set_num_threads(1)
    torch.manual_seed(0)
    tokens, dim = a["tokens"], a["dim"]
    seq = 128 if tokens % 128 == 0 else tokens
    cfg = LlamaConfig(n_layers=a["layers"] + 2, dim=dim, n_heads=8, n_kv_heads=4, max_seq_len=seq, vocab_size=256)
    split = [[0], list(range(1, a["layers"] + 1)), [a["layers"] + 1]]
    chunk = build_tp_chunk_modules(cfg, split, 0, chunks=[1], group=dist.group.WORLD)[0]
    params = [p for p in chunk.parameters()]
    grads = {p: torch.zeros_like(p) for p in params}
    sg = SplitGrad(chunk)
    kept = sg.kept(params)
    st = tp_comm.STATE
    x0 = torch.randn(tokens // seq, seq, dim)
    dy = torch.randn(tokens // seq, seq, dim) * 1e-2

    def forward():
        x = x0.clone().requires_grad_(True)
        stash: list = []
        with sg.deferring(stash):
            y = chunk(x)
        return x, y, stash

    def backward(x, y, mode="off", chunks=1, fuse=False, fill=None):
        st.mode, st.chunks, st.fuse, st.fill = mode, chunks, fuse, fill
        st.wgrad = lambda e: weight_grads(list(e), grads.get)
        try:
            torch.autograd.backward(y, dy, inputs=[x] + kept)
        finally:
            st.mode, st.chunks, st.fuse, st.wgrad, st.fill = "off", 1, False, None, None

    def fill_from(stash):
        def run(done):
            for e in stash:
                if e[2] is None:
                    continue
                if done():
                    return
                weight_grads([e], grads.get)
                e[1] = e[2] = None
        return run

    # ---- the work: one w1/w3 group's wgrad GEMMs, and a collective of one input gradient on real gloo
    x, y, stash = forward()
    backward(x, y)
    groups = [e for e in stash if type(e[0]).__name__ == "ColumnParallelLinear"]
    ffn = [e for e in groups if e[0] is chunk.layers["1"].ffn.w1 or e[0] is chunk.layers["1"].ffn.w3]
    ts = []
    for _ in range(7):
        t0 = time.perf_counter()
        weight_grads(list(ffn), grads.get)
        ts.append(time.perf_counter() - t0)
    wgrad_ffn = median(ts)
    qkv = [e for e in groups if e[0] in (chunk.layers["1"].attn.wq, chunk.layers["1"].attn.wk, chunk.layers["1"].attn.wv)]
    ts = []
    for _ in range(7):
        t0 = time.perf_counter()
        weight_grads(list(qkv), grads.get)
        ts.append(time.perf_counter() - t0)
    wgrad_qkv = median(ts)
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        weight_grads(list(stash), grads.get)  # every GEMM of one W (column and row-parallel)
        ts.append(time.perf_counter() - t0)
    wgrad_all = median(ts)
    buf = torch.randn(tokens, dim)
    ts = []
    for _ in range(7):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        ts.append(time.perf_counter() - t0)
    coll = torch.tensor([wgrad_ffn, wgrad_qkv, wgrad_all, median(ts)], dtype=torch.float64)
    dist.all_reduce(coll, op=dist.ReduceOp.MAX)
    wgrad_ffn, wgrad_qkv, wgrad_all, real_coll = coll.tolist()
    delay_ms = round(wgrad_ffn * 1e3, 1)

    # ---- the entries: setup (untimed) and run -> (seconds, what a perfect overlap would save or None).
    # The controls time each column-parallel group's GEMMs in the same round, so the ideal saving is that
    # round's: per group min(collective, the GEMMs that could run under it).
    col_groups = [g for blk in chunk.layers.values() for g in ((blk.attn.wq, blk.attn.wk, blk.attn.wv),
                                                               (blk.ffn.w1, blk.ffn.w3))]
    n_coll = len(col_groups)

    def group_times(stash) -> list[float]:
        out = []
        for g in col_groups:
            ents = [e for e in stash if any(e[0] is m for m in g) and e[2] is not None]
            t0 = time.perf_counter()
            weight_grads(list(ents), grads.get)
            out.append(time.perf_counter() - t0)
            for e in ents:
                e[1] = e[2] = None
        return out

    def fused(mode):
        def run(s):
            x, y, stash = s
            t0 = time.perf_counter()
            backward(x, y, mode=mode, fuse=True)
            gs = group_times(stash) if mode == "off" else None  # blocking: the wgrad GEMMs after the backward
            weight_grads(stash, grads.get)  # the rest (row-parallel GEMMs), as the executor does after a BW
            el = time.perf_counter() - t0
            return el, (sum(min(link_s(), g) for g in gs) if gs else None)
        return forward, run

    def split_b(mode, k):
        def run(s):
            x, y, stash = s
            t0 = time.perf_counter()
            backward(x, y, mode=mode, chunks=k)
            el = time.perf_counter() - t0
            # the dgrad GEMMs of a group cost what its wgrad GEMMs cost (the same FLOPs): piece i's collective
            # can hide under piece i+1's dgrad, at most (K-1)/K of both
            gs = group_times(stash) if mode == "off" else None
            weight_grads(stash, grads.get)
            return el, (sum(min(link_s(), g) for g in gs) * (a["chunks"] - 1) / a["chunks"] if gs else None)
        return forward, run

    def fill(mode):
        def setup():
            x0_, y0_, stash0 = forward()
            backward(x0_, y0_)  # B(0): W(0) queued
            return forward() + (stash0,)

        def run(s):
            x, y, stash, stash0 = s
            t0 = time.perf_counter()
            if mode == "fill":
                backward(x, y, mode="fill", fill=fill_from(stash0))
                weight_grads(stash0, grads.get)  # W(0): what fill left
                return time.perf_counter() - t0, None
            backward(x, y)
            t1 = time.perf_counter()
            weight_grads(stash0, grads.get)  # W(0)
            w = time.perf_counter() - t1
            return time.perf_counter() - t0, min(n_coll * link_s(), w)
        return setup, run

    # ---- W with sequence parallelism: the same layers, their column groups' inputs gathered again in W
    # (--sp-layers decoder layers: a gather hides under the GEMMs before it, so W's first gather never hides, and
    # with one layer only fc1's can, under the small q/k/v and output-projection GEMMs)
    Ls = a["sp_layers"]
    cfg_sp = LlamaConfig(n_layers=Ls + 2, dim=dim, n_heads=8, n_kv_heads=4, max_seq_len=seq, vocab_size=256)
    chunk_sp = build_tp_chunk_modules(cfg_sp, [[0], list(range(1, Ls + 1)), [Ls + 1]], 0, chunks=[1],
                                      group=dist.group.WORLD, sequence_parallel=True)[0]
    params_sp = list(chunk_sp.parameters())
    grads_sp = {p: torch.zeros_like(p) for p in params_sp}
    sg_sp = SplitGrad(chunk_sp)
    kept_sp = sg_sp.kept(params_sp)
    t_ = dist.get_world_size()
    x_sp = torch.randn(tokens // seq, seq // t_, dim)
    dy_sp = torch.randn(tokens // seq, seq // t_, dim) * 1e-2

    def regather(kind):
        def setup():
            tp_comm.set_regather(kind != "kept")
            x = x_sp.clone().requires_grad_(True)
            stash: list = []
            with sg_sp.deferring(stash):
                y = chunk_sp(x)
            torch.autograd.backward(y, dy_sp, inputs=[x] + kept_sp)  # B: the weight gradients wait for W
            tp_comm.set_regather(True)
            return stash

        def run(stash):
            items = []

            def wgrad(es):
                gathered = type(es[0][0]).__name__ == "ColumnParallelLinear"
                t0 = time.perf_counter()
                weight_grads(es, grads_sp.get)  # (empties es)
                items.append((gathered, time.perf_counter() - t0))

            t0 = time.perf_counter()
            if kind == "kept":
                weight_grads(stash, grads_sp.get)
            else:
                tp_comm.regather_wgrad(stash, wgrad, prefetch=kind == "double-buffered")
            el = time.perf_counter() - t0
            if kind != "serial":
                return el, None
            ideal, since, first = 0.0, 0.0, True  # per gather after the first: min(link, the GEMMs before it)
            for gathered, t in items:
                if gathered:
                    if not first:
                        ideal += min(link_s(), since)
                    first, since = False, 0.0
                since += t
            return el, ideal
        return setup, run

    link = {"s": 0.0}

    def link_s() -> float:
        return link["s"]

    comparisons = {
        "fused": {"async": fused("async"), "blocking": fused("off")},
        "split": {f"chunked:{a['chunks']}": split_b("chunked", a["chunks"]), "blocking": split_b("off", 1)},
        "fill": {"fill": fill("fill"), "B then W": fill("off")},
        "regather": {"double-buffered": regather("double-buffered"), "serial": regather("serial"),
                     "kept": regather("kept")},
    }
    out = {"delay_ms": delay_ms, "wgrad_ffn_s": wgrad_ffn, "wgrad_qkv_s": wgrad_qkv, "wgrad_all_s": wgrad_all,
           "real_collective_s": real_coll, "times": {}, "ideal": {}, "params": sum(p.numel() for p in params)}
    for name in ("emulated", "real"):
        link["s"] = delay_ms / 1e3 if name == "emulated" else real_coll
        tp_comm.set_link(delay_ms / 1e3 if name == "emulated" else 0.0)
        for comp, entries in comparisons.items():
            for _, (setup, run) in entries.items():  # warm-up
                run(setup())
            times = {e: [] for e in entries}
            ideal = []
            for order in round_orders(list(entries), a["pairs"], mirror=True):
                for e in order:
                    setup, run = entries[e]
                    s = setup()
                    dist.barrier()
                    el, idl = run(s)
                    t = torch.tensor([el, idl or 0.0], dtype=torch.float64)
                    dist.all_reduce(t, op=dist.ReduceOp.MAX)
                    times[e].append(t[0].item())
                    if idl is not None:
                        ideal.append(t[1].item())
            out["times"][(name, comp)] = times
            out["ideal"][(name, comp)] = median(ideal)
    tp_comm.set_link(0.0)
    sg.close()
    sg_sp.close()
    out["groups"] = {"qkv": a["layers"], "ffn": a["layers"]}
    return out if dist.get_rank() == 0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=14, help="timed pairs per comparison and link")
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=512, help="tokens per microbatch (sequences of 128)")
    ap.add_argument("--chunks", type=int, default=2, help="K of chunked:K")
    ap.add_argument("--sp-layers", type=int, default=2, help="decoder layers of the sequence-parallel W comparison")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from pipeloom.runtime.launch import spawn

    load0 = os.getloadavg()[0]
    t0 = time.time()
    res = spawn(bench_worker, 2, (vars(args),), timeout_s=600)
    wall = time.time() - t0
    load1 = os.getloadavg()[0]
    ms = lambda v: f"{1e3 * v:.1f}"  # noqa: E731
    L = args.layers
    rows = [("fused", "async", "blocking"), ("split", f"chunked:{args.chunks}", "blocking"),
            ("fill", "fill", "B then W"), ("regather", "double-buffered", "serial"),
            ("regather", "double-buffered", "kept")]
    what = {"fused": "fused BW (backward + weight gradients)", "split": "split B (input gradients only)",
            "fill": "B(1) + W(0)", "regather": "W with sequence parallelism"}
    label = {"double-buffered": "double-buffered re-gather", "serial": "serial re-gather",
             "kept": "gathered input kept from F"}
    lines = ["| comparison | link | overlap (ms) | control (ms) | overlap/control (median of pairs) | saved (ms) | "
             "ideal saving (ms) | saved / ideal |", "|---|---|---|---|---|---|---|---|"]
    for comp, a_name, b_name in rows:
        for link in ("emulated", "real"):
            ta, tb = res["times"][(link, comp)][a_name], res["times"][(link, comp)][b_name]
            ratio = median(paired_ratios(ta, tb))
            saved = median(tb) - median(ta)
            lk = f"emulated, {res['delay_ms']:g} ms" if link == "emulated" else "real gloo"
            idl = res["ideal"][(link, comp)] if b_name != "kept" else None  # vs kept: nothing to hide, only to pay
            lines.append(f"| {what[comp]}: {label.get(a_name, a_name)} vs {label.get(b_name, b_name)} | {lk} | "
                         f"{ms(median(ta))} | {ms(median(tb))} | {ratio:.3f} | {ms(saved)} | "
                         + (f"{ms(idl)} | {saved / idl:.2f} |" if idl else "- | - |"))
    lines.append("")
    lines.append(f"Model: one middle chunk of {L} decoder layers, dim {args.dim}, 8 heads (4 key/value heads), "
                 f"{args.tokens} tokens per microbatch, tp 2 ({res['params'] / 1e6:.2f} M parameters per rank). "
                 f"Measured: one w1/w3 group's wgrad GEMMs {ms(res['wgrad_ffn_s'])} ms, one q/k/v group's "
                 f"{ms(res['wgrad_qkv_s'])} ms, one W (every GEMM) {ms(res['wgrad_all_s'])} ms, a real gloo all-reduce of one input gradient "
                 f"({args.tokens} x {args.dim} fp32) {ms(res['real_collective_s'])} ms. The W with sequence parallelism: "
                 f"{args.sp_layers} decoder layers ({2 * args.sp_layers} re-gathers of {args.tokens} x {args.dim} fp32 each), "
                 f"the column groups' inputs kept as sequence shards. "
                 f"{args.pairs} pairs per row; "
                 f"{platform.machine()}, load average {load0:.1f} before, {load1:.1f} after ({os.cpu_count()} CPUs); "
                 f"bench wall time {wall:.0f} s.")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        write_text(args.out, table)


if __name__ == "__main__":
    main()
