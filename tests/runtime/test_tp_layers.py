"""Tensor-parallel Llama layers on local shards (pipeloom.models.tp) on real processes (gloo, 127.0.0.1):
at tp 2 and tp 4 the loss from vocab-parallel logits and every gradient, gathered from the shards, equal
the unsharded single-process model to 1e-5, with split (B then W) and fused backward, for a model with
2 key/value heads (split at tp 2, replicated at tp 4) and one with 4 (2 per rank at tp 2), with and
without sequence parallelism (norms on seq/t tokens, all-gather before the column-parallel GEMMs,
reduce-scatter after the row-parallel ones, norm-weight gradients summed once per step).

Process start dominates, so every case runs in ONE world of 4 ranks (tp 2 = two groups of 2)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from pipeloom.autograd.splitgrad import SplitGrad, deferred_share, weight_grads
from pipeloom.models.llama import LlamaConfig, build_chunk_modules, build_reference, loss_fn, synthetic_batch
from pipeloom.models.tp import (build_tp_chunk_modules, check_tp, gather_full, reduce_replicated_grads,
                                vocab_parallel_cross_entropy)
from pipeloom.models.tp_comm import regather_wgrad
from pipeloom.runtime.launch import spawn

TOL = 1e-5
GQA = LlamaConfig(n_layers=2, dim=32, n_heads=4, n_kv_heads=2, max_seq_len=8, vocab_size=64)
KV4 = LlamaConfig(n_layers=2, dim=32, n_heads=8, n_kv_heads=4, max_seq_len=8, vocab_size=64)


def _groups(tp: int):
    """Every rank creates every TP group (new_group is collective); returns this rank's."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if tp == world:
        return dist.group.WORLD
    mine = None
    for start in range(0, world, tp):
        g = dist.new_group(list(range(start, start + tp)))
        if start <= rank < start + tp:
            mine = g
    return mine


def _run_tp(cfg, tp: int, group, split: bool, pipeline: bool, seed: int, sp: bool) -> dict:
    x, y = synthetic_batch(cfg, 3, 8, seed=seed)
    ref = build_reference(cfg, seed)
    ref_loss = loss_fn(ref(x), y)
    ref_loss.backward()
    layers = [[0], [1]] if pipeline else [[0, 1]]
    chunks = build_tp_chunk_modules(cfg, layers, seed, group=group, sequence_parallel=sp)
    shard_shapes = {n: tuple(p.shape) for n, p in chunks[-1].named_parameters()}
    stash: list = []
    sgs = [SplitGrad(m) for m in chunks] if split else []
    ins, outs, h, between = [], [], x, []
    for k, m in enumerate(chunks):  # stage by stage in one process: detach between chunks as a pipeline would
        if k:
            h = h.detach().requires_grad_(True)
        ins.append(h)
        if split:
            with sgs[k].deferring(stash):
                h = m(h)
        else:
            h = m(h)
        outs.append(h)
        between.append(tuple(h.shape))
    logits_shape = tuple(h.shape)
    loss = vocab_parallel_cross_entropy(h, y, group).mean()
    grad = None
    for k in reversed(range(len(chunks))):  # B (input grad + kept params), then W
        params = list(chunks[k].parameters())
        kept = sgs[k].kept(params) if split else params
        wrt = kept + ([ins[k]] if k else [])
        if k == len(chunks) - 1:
            torch.autograd.backward(loss, inputs=wrt)
        else:
            torch.autograd.backward(outs[k], grad, inputs=wrt)
        if split:  # the split is real: no deferred TP weight has its gradient after B
            assert all(p.grad is None for p in params if id(p) in sgs[k].deferred)
        grad = ins[k].grad if k else None
    if split:
        for p in (p for m in chunks for p in m.parameters()):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        # W: sequence-parallel column groups kept their input's shard and gather it again (double-buffered)
        regather_wgrad(stash, lambda es: weight_grads(es, lambda p: p.grad))
    reduced = reduce_replicated_grads([p for m in chunks for p in m.parameters()], group)
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    ref_params = dict(ref.named_parameters())
    gdiff = pdiff = 0.0
    seen = set()
    for m in chunks:
        full_g, full_p = gather_full(m, group, grads=True), gather_full(m, group)
        for n in full_g:
            assert full_g[n] is not None, n
            assert full_g[n].shape == ref_grads[n].shape, (n, full_g[n].shape)
            gdiff = max(gdiff, (full_g[n] - ref_grads[n]).abs().max().item())
            pdiff = max(pdiff, (full_p[n] - ref_params[n]).abs().max().item())
            seen.add(n)
    # the weight-gradient FLOPs the split backward defers: a shard's are 1/tp of the unsharded chunk's (the
    # column-parallel groups' GEMMs, which run in an autograd function of their own, counted too)
    shares = (deferred_share(chunks[0], x), deferred_share(build_chunk_modules(cfg, layers, seed, chunks=[0])[0], x))
    out = torch.tensor([abs(loss.item() - ref_loss.item()), gdiff, pdiff])
    dist.all_reduce(out, op=dist.ReduceOp.MAX)  # every rank's worst, not only rank 0's
    return dict(loss_diff=out[0].item(), grad_diff=out[1].item(), param_diff=out[2].item(),
                missing=sorted(set(ref_grads) - seen), logits_shape=logits_shape, between=between, reduced=reduced,
                shard_shapes=shard_shapes, shares=shares, ref_grad_max=max(g.abs().max().item() for g in ref_grads.values()))


def tp_cases_worker(cases):
    torch.manual_seed(0)
    groups = {tp: _groups(tp) for tp in sorted({c[1] for c in cases})}
    cfgs = {"gqa": GQA, "kv4": KV4}
    return [_run_tp(cfgs[name], tp, groups[tp], split, pipeline, seed, sp)
            for name, tp, split, pipeline, seed, sp in cases]


# (model, tp, split backward, two chunks, seed, sequence parallel)
CASES = [("gqa", 2, False, False, 1, False), ("gqa", 2, True, True, 2, False), ("gqa", 4, False, True, 3, False),
         ("gqa", 4, True, False, 4, False), ("kv4", 2, True, True, 5, False), ("kv4", 4, False, False, 6, False),
         ("gqa", 2, True, True, 7, True), ("gqa", 4, False, True, 8, True), ("gqa", 4, True, True, 9, True),
         ("kv4", 2, False, False, 10, True)]


@pytest.mark.dist
def test_tp2_tp4_layers_loss_and_every_gradient_equal_one_process():
    res = spawn(tp_cases_worker, 4, (CASES,), timeout_s=120)
    for (name, tp, split, pipeline, _, sp), r in zip(CASES, res):
        key = (name, tp, split, pipeline, sp)
        assert r["missing"] == [], key
        assert r["loss_diff"] <= TOL and r["grad_diff"] <= TOL and r["param_diff"] == 0.0, (key, r)
        assert r["ref_grad_max"] > 100 * TOL  # the gradients compared are not all ~0
        cfg = {"gqa": GQA, "kv4": KV4}[name]
        assert r["logits_shape"] == (3, 8, cfg.vocab // tp), key  # logits stay vocab-sharded
        s = r["shard_shapes"]
        hd = cfg.head_dim
        assert s["layers.1.attn.wq.weight"] == (cfg.heads // tp * hd, cfg.hidden)
        assert s["layers.1.attn.wo.weight"] == (cfg.hidden, cfg.heads // tp * hd)
        assert s["layers.1.ffn.w2.weight"] == (cfg.hidden, cfg.ffn // tp)
        assert s["head.weight"] == (cfg.vocab // tp, cfg.hidden)
        kv_local = max(cfg.kv_heads // tp, 1)
        assert s["layers.1.attn.wk.weight"] == (kv_local * hd, cfg.hidden), key
        # partial gradients: replicated key/value heads (gqa at tp 4: 2 layers x (wk, wv)) and, with sequence
        # parallelism, the norm weights (2 per layer and the final one)
        assert r["reduced"] == (4 if cfg.kv_heads < tp else 0) + (5 if sp else 0), key
        tp_share, full_share = r["shares"]
        assert tp_share["share"] == full_share["share"] == 1.0, key  # B defers every GEMM's weight gradient
        if cfg.kv_heads % tp == 0:  # no replicated key/value head: exactly 1/tp of the work per rank
            assert tp_share["wgrad_flops"] * tp == full_share["wgrad_flops"], key
        if pipeline:  # what goes between the stages: this rank's seq/t tokens with sequence parallelism
            assert r["between"][0] == (3, 8 // tp if sp else 8, cfg.hidden), key


@pytest.mark.parametrize("cfg,tp,dim", [
    (LlamaConfig(n_heads=4, n_kv_heads=2), 8, "heads=4"),
    (LlamaConfig(dim=96, n_heads=6, n_kv_heads=6, ffn_dim=96, vocab_size=96), 3, None),
    (LlamaConfig(dim=96, n_heads=12, n_kv_heads=6, ffn_dim=96), 4, "kv_heads=6"),
    (LlamaConfig(dim=64, n_heads=4, n_kv_heads=2, ffn_dim=90), 4, "ffn=90"),
    (LlamaConfig(vocab_size=250, n_heads=4, n_kv_heads=2), 4, "vocab=250"),
    (LlamaConfig(), 0, ">= 1"),
])
def test_a_tp_that_does_not_divide_is_one_line_naming_the_dimension(cfg, tp, dim):
    if dim is None:
        check_tp(cfg, tp)  # tp 3 divides heads, kv_heads, ffn and vocab: accepted
        return
    with pytest.raises(ValueError) as e:
        check_tp(cfg, tp)
    assert dim in str(e.value) and "\n" not in str(e.value)
