"""Data parallel on real processes (gloo, 127.0.0.1): the overlapped per-chunk all-reduce and ZeRO-1
(reduce-scatter, sharded AdamW, all-gather) give the loss, the gradients and the parameters after an
optimizer step of a single-process reference, for 1f1b, interleaved and zbv; bf16 + ZeRO-1 keeps the
fp32 master weights of its shard only and equals the unsharded bf16 run; the measured per-rank
parameter, gradient and optimizer bytes (fp32 and bf16, with and without ZeRO-1) equal ``pipeloom
memory``'s estimate; a dp peer that never reaches the reduction is named within --timeout.

Process start dominates, so every case of a world size runs in ONE process group."""
from __future__ import annotations

import pytest
import torch

from pipeloom.memory.analytic import TrainConfig, estimate
from pipeloom.runtime.driver import RunConfig, cases_worker, model_config, run
from pipeloom.runtime.launch import RankFailure, spawn

pytestmark = pytest.mark.dist

TOL = 1e-5
# parameters after the first AdamW step against the single-process REFERENCE: Adam's first update is
# lr * g / (|g| + eps), so where a gradient is near eps (1e-8) its float rounding (~4e-8 here, from a
# different summation order) moves the update by a good part of lr = 1e-3 (measured: 1.4e-5). A wrong
# shard, offset or missed update moves parameters by ~lr, so 5% of lr still catches every such bug;
# against the UNSHARDED pipeline run (same gradients) the parameters must agree to TOL.
REF_PARAM_TOL = 5e-5
# bf16 against the fp32 reference: the tolerance the runtime's other bf16 test uses (test_runtime_dist)
BF16_TOL = 5e-2
SMALL = dict(microbatch_size=1, seq_len=8, verify=True, return_params=True)


def _modes(sched: str, pp: int, dp: int, modes) -> list[dict]:
    return [dict(schedule=sched, pp=pp, dp=dp, microbatches=4, overlap_grad_reduce=ov, zero=z, **SMALL)
            for ov, z in modes]


def _check(cases, res):
    bad = {}
    for c, r in zip(cases, res):
        key = (c["schedule"], c["overlap_grad_reduce"], c["zero"])
        if not (r["max_loss_diff"] <= TOL and r["max_grad_diff"] <= TOL and r["max_param_diff"] <= REF_PARAM_TOL
                and r["params_missing_grad"] == 0 and r["replica_param_diff"] <= TOL):
            bad[key] = (r["max_loss_diff"], r["max_grad_diff"], r["max_param_diff"], r["params_missing_grad"])
        assert r["zero"] == c["zero"] and r["overlap_grad_reduce"] == c["overlap_grad_reduce"]
    assert not bad, bad
    # ZeRO-1 (and overlap) change nothing: parameters after the step equal the unsharded, non-overlapped run's
    for sched in {c["schedule"] for c in cases}:
        runs = [(c, r) for c, r in zip(cases, res) if c["schedule"] == sched]
        base = next((r for c, r in runs if not c["zero"]), runs[0][1])
        for c, r in runs:
            assert r["params"].keys() == base["params"].keys()
            d = max((torch.tensor(r["params"][n]) - torch.tensor(base["params"][n])).abs().max().item()
                    for n in base["params"])
            assert d <= TOL, (sched, c, d)


def test_pp2_dp2_overlap_and_zero1_match_reference():
    cases = (_modes("1f1b", 2, 2, [(True, 0), (False, 1), (False, 0)])
             + _modes("zbv", 2, 2, [(True, 0), (True, 1)])
             + _modes("interleaved", 2, 2, [(True, 0), (False, 1), (True, 1)]))
    res = spawn(cases_worker, 4, (cases,), timeout_s=120)
    _check(cases, res)
    # ZeRO-1 keeps 1/dp of the optimizer states: the same run without it has twice as much per rank
    plain = {(b["pp_rank"], b["dp_rank"]): b for b in res[2]["rank_bytes"]}
    for b in res[1]["rank_bytes"]:
        assert 2 * b["optimizer_bytes"] == plain[(b["pp_rank"], b["dp_rank"])]["optimizer_bytes"]
    # measured static bytes equal the analytic estimate (pipeloom memory --dtype fp32 --dp 2 [--zero 1])
    for c, r in zip(cases, res):
        for b, measured, want, _ in _static(dict(c, dtype="fp32"), r):
            assert measured == want, (c["schedule"], c["zero"], b, want)


@pytest.mark.slow
def test_pp2_dp3_padded_shards_match_reference():
    """dp=3 does not divide the chunks' sizes: the ZeRO-1 shards are padded (fp32, and bf16 master shards)."""
    cases = (_modes("zbv", 2, 3, [(True, 1)]) + _modes("1f1b", 2, 3, [(True, 0)])
             + _modes("interleaved", 2, 3, [(False, 1)]))
    bf16 = [dict(c, dtype="bf16") for c in _modes("zbv", 2, 3, [(True, 0), (True, 1)])]
    res = spawn(cases_worker, 6, (cases + bf16,), timeout_s=120)
    _check(cases, res[:len(cases)])
    # bf16: the padded master shards give the unsharded bf16 run's master weights
    plain, zero = res[len(cases):]
    assert zero["max_loss_diff"] < BF16_TOL and zero["max_grad_diff"] < BF16_TOL and zero["replica_param_diff"] <= TOL
    d = max((torch.tensor(zero["params"][n]) - torch.tensor(plain["params"][n])).abs().max().item()
            for n in plain["params"])
    assert d <= TOL and abs(zero["loss"] - plain["loss"]) <= TOL, d


def test_a_dp_peer_that_never_arrives_is_named_within_the_timeout():
    # the reductions start after the last job (no overlap), so the only rank left waiting on rank 1 is
    # its dp peer (with overlap, pp stage 0 would first miss rank 1's last gradient message)
    cfg = RunConfig(schedule="1f1b", pp=2, dp=2, microbatches=2, microbatch_size=1, seq_len=8, timeout_s=3.0,
                    fault_hang_rank=1, overlap_grad_reduce=False, zero=1)
    with pytest.raises(RankFailure) as e:
        run(cfg)
    msg = str(e.value)
    assert "\n" not in msg
    # rank 1 (pp stage 1 of replica 0) hangs before its reduction; its dp peer, rank 3, names it
    assert "rank 3: step 0: data-parallel" in msg and "timed out after 3s: rank 1 did not arrive" in msg, msg


def _static(c, r):
    """Measured per-rank (params, grads, optimizer) bytes of a run and ``pipeloom memory``'s estimate."""
    cfg = RunConfig(**{k: v for k, v in c.items() if k not in ("dtype", "steps")})
    mcfg = model_config(cfg, 2 * (2 if c["schedule"] != "1f1b" else 1))
    rep = estimate(mcfg, TrainConfig(dtype=c["dtype"], dp=2, zero=c["zero"], seq=8, micro_batch=1, impl="eager"),
                   schedule=c["schedule"], pp=2, microbatches=4)
    for b in r["rank_bytes"]:
        d = rep.devices[b["pp_rank"]]
        yield b, (b["params_bytes"], b["grads_bytes"], b["optimizer_bytes"]), \
            (d.params_bytes, d.grads_bytes, d.optimizer_bytes), d.params


def test_pp2_dp2_bf16_zero1_shards_the_master_weights_and_matches_unsharded_bf16():
    """bf16 + ZeRO-1: each rank keeps fp32 master weights and AdamW states of its 1/dp shard only (bytes
    exactly as ``pipeloom memory --dtype bf16 --dp 2 --zero 1``: 2 + 4 + 12/2 per parameter, no full fp32
    copy), and the run equals the unsharded bf16 run: losses of two steps, fp32 master weights after the
    first step, replicas identical; both pass --verify at the bf16 tolerance."""
    cases = [dict(schedule=s, pp=2, dp=2, microbatches=4, overlap_grad_reduce=True, zero=z, dtype="bf16", steps=2,
                  **SMALL) for s in ("1f1b", "zbv") for z in (0, 1)]
    res = spawn(cases_worker, 4, (cases,), timeout_s=120)
    for c, r in zip(cases, res):
        assert r["dtype"] == "bf16" and r["zero"] == c["zero"]
        assert r["max_loss_diff"] < BF16_TOL and 0 < r["max_grad_diff"] < BF16_TOL, (c, r["max_grad_diff"])
        assert r["params_missing_grad"] == 0 and r["replica_param_diff"] <= TOL
        for b, measured, want, n in _static(c, r):
            assert measured == want, (c["schedule"], c["zero"], b, want)
            assert measured == (2 * n, 4 * n, (6 if c["zero"] else 12) * n)  # Megatron's 2 + 4 + 12/d
    for sched in ("1f1b", "zbv"):
        plain, zero = (r for c, r in zip(cases, res) if c["schedule"] == sched)
        assert max(abs(a - b) for a, b in zip(plain["losses"], zero["losses"])) <= TOL, sched
        assert zero["max_param_diff"] == pytest.approx(plain["max_param_diff"], abs=TOL)
        d = max((torch.tensor(zero["params"][n]) - torch.tensor(plain["params"][n])).abs().max().item()
                for n in plain["params"])
        assert d <= TOL, (sched, d)
