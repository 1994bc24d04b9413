"""``--verify``: the first step against a single-process reference on the same global batch.

Each rank runs the (tiny) reference itself and compares its own chunks (loss, every gradient, and the
parameters after one AdamW step); the largest difference is taken over the ranks.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .config import RunConfig
from .executor import PipelineExecutor, reference_step

def _gather_params(named: list, dp_rank: int) -> dict | None:
    """Testing: every rank's fp32 parameters (``named``: :func:`_named_fp32`) to rank 0 (see
    ``RunConfig.return_params``)."""
    mine = {n: p.detach().float().cpu().clone() for n, p in named}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, (dp_rank, mine))
    if dist.get_rank() != 0:
        return None
    first = {n: t for r, ps in every if r == 0 for n, t in ps.items()}
    diff = max([(t - first[n]).abs().max().item() for r, ps in every if r != 0 for n, t in ps.items()] or [0.0])
    # plain lists: tensors would go back through the spawn queue as shared memory of an exiting process
    return {"params": {n: t.flatten().tolist() for n, t in first.items()}, "replica_param_diff": diff}



def _named_fp32(ex: PipelineExecutor, opt, tp_group=None) -> list:
    """(name, fp32 value) of every parameter of this rank: the parameters, the executor's master
    copies, or (bf16 + ZeRO-1) the master shards all-gathered for the check (a dp collective); with
    tensor parallelism (``tp_group``) the full tensors gathered from the stage's TP shards (a tp collective)."""
    from .zero1 import Zero1Optimizer
    if tp_group is not None:
        from ..models.tp import gather_full
        return [nv for k in sorted(ex.modules)
                for nv in gather_full(ex.modules[k], tp_group, value_of=lambda p: ex.master.get(p, p)).items()]
    if not (isinstance(opt, Zero1Optimizer) and opt.sharded_master):
        return ex.named_parameters()
    full = opt.full_master()  # (the executor's master map is empty then: its names map to the bf16 parameters)
    return [(n, full[p]) for n, p in ex.named_parameters()]



def _verify(ex: PipelineExecutor, cfg: RunConfig, mcfg, loss: float, build_reference, xs: list, ys: list,
            tp_group=None):
    """Each rank runs the (tiny) reference itself on the first step's global batch (``xs``, ``ys``: every
    replica's microbatches) and compares its own chunks; MAX over ranks. Returns the comparison and the
    reference model after one AdamW step (for :func:`_verify_params`). With ZeRO-1 the reduced gradients are
    the shards: each rank compares its shards. With tensor parallelism (``tp_group``) every gradient is
    gathered from the stage's TP shards and compared whole."""
    from ..models.llama import loss_fn
    from .grads import ZeroReduceScatter
    if cfg.model is not None:  # the unsplit model; a chunk's name of a tied weight -> the reference's
        ref_loss, ref_grads = cfg.model.reference_step(cfg.seed, loss_fn, xs, ys)
        ref, canon = cfg.model.reference, cfg.model.canonical
    else:
        ref = build_reference(mcfg, cfg.seed)
        ref_loss, ref_grads = reference_step(ref, loss_fn, xs, ys)
        canon = str
    gd, missing = 0.0, 0
    if isinstance(ex.reducer, ZeroReduceScatter):
        names = {p: canon(n) for k in sorted(ex.modules) for n, p in ex.modules[k].named_parameters()}
        if tp_group is not None:  # the reference's gradients cut to this rank's tensor-parallel shards
            ref_grads = _tp_slices(ref_grads, names, tp_group)
        buf = ex.grads
        flat = torch.zeros(buf.flat.numel(), dtype=torch.float32)
        for seg in buf.segments:
            off = seg.start
            for p in seg.params:
                g = ref_grads.get(names[p])
                if g is None:
                    missing += 1
                else:
                    flat[off:off + p.numel()] = g.flatten()
                off += p.numel()
        for seg, sh in zip(buf.segments, ex.reducer.shard_grads()):
            lo, hi = ex.reducer.shard(seg)
            gd = max(gd, (sh.detach().float().cpu() - flat[lo:hi]).abs().max().item() if hi > lo else 0.0)
    elif tp_group is not None:
        from ..models.tp import gather_full
        for k in sorted(ex.modules):
            for name, g in gather_full(ex.modules[k], tp_group, grads=True,
                                       value_of=lambda p: ex.master.get(p, p).grad).items():
                if g is None or name not in ref_grads:
                    missing += 1
                    continue
                gd = max(gd, (g.detach().float().cpu() - ref_grads[name]).abs().max().item())
    else:
        for name, p in ex.named_parameters():
            name = canon(name)
            if p.grad is None or name not in ref_grads:
                missing += 1
                continue
            gd = max(gd, (p.grad.detach().float().cpu() - ref_grads[name]).abs().max().item())
    t = torch.tensor([abs(loss - ref_loss), gd, float(missing)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    ropt = torch.optim.AdamW(ref.parameters(), lr=cfg.lr)
    ropt.step()
    return {"max_loss_diff": t[0].item(), "max_grad_diff": t[1].item(), "reference_loss": ref_loss,
            "params_missing_grad": int(t[2].item())}, (ref, canon)


def _tp_slices(ref_grads: dict, names: dict, tp_group) -> dict:
    """Reference gradients by parameter name, each cut to the shard of it this TP rank holds (``p.tp_shard =
    (dim, ranks_per_shard)``: shard ``tp_rank // ranks_per_shard`` along ``dim``; replicated: whole)."""
    rank = dist.get_rank(tp_group)
    out = dict(ref_grads)
    for p, name in names.items():
        spec, g = getattr(p, "tp_shard", None), ref_grads.get(name)
        if spec is None or g is None:
            continue
        dim, k = spec
        n = p.shape[dim]
        out[name] = g.narrow(dim, (rank // k) * n, n)
    return out


def _verify_params(named: list, ref_and_names) -> dict:
    """After the first optimizer step: max |parameter - reference parameter after one AdamW step|
    (``named``: the fp32 values from :func:`_named_fp32`: parameters, or master weights with bf16),
    MAX over ranks."""
    ref, canon = ref_and_names
    want = dict(ref.named_parameters())
    d = 0.0
    for name, p in named:
        name = canon(name)
        if name in want:
            d = max(d, (p.detach().float().cpu() - want[name].detach()).abs().max().item())
    t = torch.tensor([d], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {"max_param_diff": t[0].item()}

