"""The W-side re-gather of sequence-parallel column groups is double-buffered (issue 30): on the emulated link
(every all-gather lands D late, one collective at a time, no CPU used), W of a tp 2 chunk whose groups each run
longer than D waits for the first gather only when group k+1's gather starts before group k's GEMMs; a serial
re-gather (each gather started when its group comes) waits for every one. Both give bitwise the same weight
gradients. The GEMM time is made long and steady by a sleep after each group's arithmetic (the shared CPU's
GEMM times vary by tens of percent); the gathers and the arithmetic are the runtime's own."""
from __future__ import annotations

import pytest

from pipeloom.runtime.launch import spawn

pytestmark = [pytest.mark.dist]

DIM, HEADS, KV, SEQ, MB, LAYERS = 64, 4, 2, 16, 2, 3
DELAY_S, GEMM_S = 0.03, 0.02  # a group and the row-parallel GEMM after it: 2 x GEMM_S > DELAY_S


def _w_waits() -> dict:
    import hashlib
    import time
    import weakref

    import torch
    import torch.distributed as dist

    from pipeloom.autograd.splitgrad import SplitGrad, weight_grads
    from pipeloom.models import tp_comm
    from pipeloom.models.llama import LlamaConfig
    from pipeloom.models.tp import ColumnParallelLinear, build_tp_chunk_modules

    torch.manual_seed(0)
    cfg = LlamaConfig(n_layers=LAYERS + 2, dim=DIM, n_heads=HEADS, n_kv_heads=KV, max_seq_len=SEQ, vocab_size=64)
    split = [[0], list(range(1, LAYERS + 1)), [LAYERS + 1]]
    chunk = build_tp_chunk_modules(cfg, split, 0, chunks=[1], group=dist.group.WORLD, sequence_parallel=True)[0]
    params = list(chunk.parameters())
    sg = SplitGrad(chunk)
    kept = sg.kept(params)
    x0 = torch.randn(MB, SEQ // 2, DIM)
    dy = torch.randn(MB, SEQ // 2, DIM)
    out = {}
    for name, prefetch in (("serial", False), ("double-buffered", True), ("serial again", False)):
        x = x0.clone().requires_grad_(True)
        stash: list = []
        with sg.deferring(stash):
            y = chunk(x)
        torch.autograd.backward(y, dy, inputs=[x] + kept)  # B: the weight gradients wait for W
        grads = {p: torch.zeros_like(p) for p in params}
        gathered: list = []  # weak references to the gathered inputs W used
        alive = []           # per gathered group: how many of them were still alive when its GEMMs began

        def wgrad(entries):
            if isinstance(entries[0][0], ColumnParallelLinear):  # a column group: its input gathered again
                assert entries[0][1].shape[1] == SEQ
                gathered.append(weakref.ref(entries[0][1]))
                alive.append(sum(r() is not None for r in gathered))
            weight_grads(entries, grads.get)
            time.sleep(GEMM_S)  # the GEMMs of a bigger layer

        tp_comm.set_link(DELAY_S)
        dist.barrier()
        st = tp_comm.comm_stats()
        w0, g0, p0 = st.exposed_s, st.regathers, st.prefetched
        tp_comm.regather_wgrad(stash, wgrad, prefetch=prefetch)
        waited = st.exposed_s - w0
        tp_comm.set_link(0.0)
        h = hashlib.sha256()
        for p in params:
            h.update(grads[p].numpy().tobytes())
        out[name] = {"waited": waited, "gathers": st.regathers - g0, "prefetched": st.prefetched - p0,
                     "digest": h.hexdigest(), "left": len(stash), "alive": alive}
    return out


def test_w_regather_is_double_buffered_and_bitwise_equal_to_serial():
    r = spawn(_w_waits, 2, (), timeout_s=120)
    # rank 0's W (the link delays both ranks' gathers alike)
    serial, double = r["serial"], r["double-buffered"]
    gathers = 2 * LAYERS  # q/k/v and w1/w3 per layer
    assert serial["gathers"] == double["gathers"] == gathers
    assert serial["left"] == double["left"] == 0  # the stash is emptied
    # each gathered input is freed after its group's GEMMs: when a group's GEMMs begin, only its own is alive
    # (the next one is in flight, not yet returned), so at most two are held at any time
    assert double["alive"] == serial["alive"] == [1] * gathers
    assert serial["digest"] == double["digest"] == r["serial again"]["digest"]
    # serial: every gather's delay is waited for; double-buffered: the first one's (the others land under
    # the GEMMs before them), so about 1/(2 LAYERS) of it
    assert serial["waited"] >= 0.9 * gathers * DELAY_S, r
    assert double["waited"] < 0.5 * serial["waited"], r
    assert serial["prefetched"] == 0 and double["prefetched"] == gathers - 1
