"""pp x dp x tp on 8 real processes (gloo, 127.0.0.1): pp 2 x dp 2 x tp 2 on one (dp, pp, tp) DeviceMesh,
tp innermost, with one all-reduce per (pp, tp) DP group after the step or overlapped per chunk, or ZeRO-1
(reduce-scatter, sharded AdamW) with the fill overlap; 1f1b, and zbv with sequence parallelism: the loss, every gradient (gathered from the TP shards, averaged over the replicas) and the
parameters after one AdamW step equal a single-process reference on the global batch, replicated weights
stay bitwise equal on the TP ranks, and every replica holds the same parameters."""
from __future__ import annotations

import pytest

from pipeloom.runtime.driver import cases_worker
from pipeloom.runtime.launch import spawn

from test_tp_overlap import tp_static  # noqa: E402  (this folder is on sys.path: pytest prepend mode)

pytestmark = pytest.mark.dist

TOL = 1e-5
REF_PARAM_TOL = 5e-5  # Adam's first step near eps: see tests/runtime/test_dp.py


def test_pp2_dp2_tp2_match_one_process():
    common = dict(pp=2, dp=2, tp=2, microbatches=4, microbatch_size=1, seq_len=8, verify=True, return_params=True)
    cases = [dict(schedule="1f1b", **common), dict(schedule="zbv", sequence_parallel=True, **common),
             dict(schedule="zbv", sequence_parallel=True, overlap_grad_reduce=True, **common),
             dict(schedule="zbv", sequence_parallel=True, zero=1, overlap_grad_reduce=True, tp_overlap="fill", **common)]
    res = spawn(cases_worker, 8, (cases,), timeout_s=120)
    for c, r in zip(cases, res):
        assert r["world_size"] == 8 and r["dp"] == 2 and r["tp"] == 2, c
        assert r["params_missing_grad"] == 0, c
        assert r["max_loss_diff"] <= TOL and r["max_grad_diff"] <= TOL and r["max_param_diff"] <= REF_PARAM_TOL, (c, r)
        assert r["tp_replica_param_diff"] == 0.0 and r["replica_param_diff"] <= TOL, (c, r)
    assert res[2]["overlap_grad_reduce"] is True and res[3]["zero"] == 1
    # the overlapped reduction changes nothing: same parameters after the step as the blocking one
    a, b = res[1]["params"], res[2]["params"]
    assert max(abs(x - y) for n in a for x, y in zip(a[n], b[n])) <= TOL
    # ZeRO-1 with TP: each (pp, tp) DP group's reduce-scatter gets whole gradients (the TP sum of the SP norms'
    # partial gradients runs before it): same parameters after the step as the replicated optimizer
    c = res[3]["params"]
    assert max(abs(x - y) for n in a for x, y in zip(a[n], c[n])) <= TOL
    # each rank's bytes: 'pipeloom memory --tp 2 --sequence-parallel --dp 2 --zero 1'
    for measured, want in tp_static(cases[3], res[3], dp=2, zero=1):
        assert measured == want, (measured, want)
