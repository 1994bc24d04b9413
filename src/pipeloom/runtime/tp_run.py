"""What a tensor-parallel run adds to the driver (:mod:`.driver`; needs torch): the (dp, pp, tp) process groups,
the TP overlap counters and wait time of a run, and the gradient digest the bitwise tests compare."""
from __future__ import annotations

import torch.distributed as dist

from .executor import PipelineExecutor
from .launch import default_device

__all__ = ["tp_groups", "grad_digest", "tp_counts", "tp_exposed"]

_MESHES: dict = {}


def tp_groups(pp: int, dp: int, tp: int, timeout_s: float | None = None):
    """(pp global ranks of my pipeline, dp group or None, tp group, pp_rank, dp_rank, tp_rank) on a DeviceMesh of
    shape (dp, pp, tp), tp innermost: a stage's TP ranks are consecutive global ranks (one node), P2P goes
    between the equal TP indices of adjacent stages (the mesh's pp group of this rank) and the DP group of a
    rank holds the same shard of the same stage in every replica (one group per (pp, tp)). With ``timeout_s`` the
    TP groups are made again with that timeout (gloo gives up a collective's wait after its group's timeout), so
    that a TP peer that never arrives is named within it (every rank makes every group, in the same order)."""
    world = dist.get_world_size()
    if world != pp * dp * tp:
        raise ValueError(f"world size {world} != pp*dp*tp = {pp}*{dp}*{tp}")
    key = ("tp", dp, pp, tp)
    if key not in _MESHES:
        from torch.distributed.device_mesh import init_device_mesh
        _MESHES[key] = init_device_mesh(default_device().type, (dp, pp, tp), mesh_dim_names=("dp", "pp", "tp"))
    mesh = _MESHES[key]
    pp_ranks = dist.get_process_group_ranks(mesh.get_group("pp"))
    dp_group = mesh.get_group("dp") if dp > 1 else None
    tp_group = mesh.get_group("tp")
    if timeout_s is not None:
        key = ("tp-timeout", dp, pp, tp, float(timeout_s))
        if key not in _MESHES:
            import datetime as _dt
            blocks = mesh.mesh.reshape(-1, tp).tolist()
            groups = [dist.new_group(b, timeout=_dt.timedelta(seconds=timeout_s)) for b in blocks]
            _MESHES[key] = next(g for g, b in zip(groups, blocks) if dist.get_rank() in b)
        tp_group = _MESHES[key]
    return (pp_ranks, dp_group, tp_group, mesh.get_local_rank("pp"), mesh.get_local_rank("dp"),
            mesh.get_local_rank("tp"))


def grad_digest(ex: PipelineExecutor) -> str:
    """sha256 of this rank's gradients (the optimizer's: fp32, or the fp32 master copies' with bf16) in
    parameter order: equal digests = bitwise equal gradients."""
    import hashlib
    h = hashlib.sha256()
    for p in ex.parameters():
        if p.grad is not None:
            h.update(p.grad.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def tp_counts(since: dict | None = None) -> dict:
    """This rank's TP overlap counters (``tp_comm.comm_stats``) since ``since``: collectives, fused and filled
    weight-gradient GEMMs, chunked pieces, sequence-parallel inputs gathered again for their weight gradients
    (``tp_regathers``) and, of those, started under the previous group's GEMMs (``tp_regathers_prefetched``)."""
    from ..models.tp_comm import comm_stats
    st = comm_stats()
    now = {"tp_collectives": st.count, "tp_fused_gemms": st.fused, "tp_filled_gemms": st.filled,
           "tp_chunked_pieces": st.pieces, "tp_regathers": st.regathers, "tp_regathers_prefetched": st.prefetched}
    return {k: v - (since or {}).get(k, 0) for k, v in now.items()}


def tp_exposed() -> float:
    from ..models.tp_comm import comm_stats
    return comm_stats().exposed_s
