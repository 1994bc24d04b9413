"""The split backward is real under tensor parallelism, in pipeloom's executor on real processes (gloo,
pp 2 x tp 2, zbv, sequence parallel, ``--tp-overlap chunked:2`` on the emulated link): no B job changes the
gradient of any column- or row-parallel weight (their weight gradients wait for W), but for the B jobs whose
own W comes right after (the executor fuses those: their column-parallel wgrad runs under the collective),
and the W jobs do change them; the job logs (``--log-dir``) carry each job's wait for tensor-parallel collectives (``tp_comm``)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeloom.runtime.launch import spawn

pytestmark = [pytest.mark.dist, pytest.mark.slow]


def _checked_run(log_dir: str) -> dict | None:
    import torch
    import torch.distributed as dist

    import pipeloom.runtime.driver as drv
    from pipeloom.core.ir import Kind
    from pipeloom.models.tp import ColumnParallelLinear, RowParallelLinear

    seen = {"b_changed": 0, "w_changed": 0, "b_jobs": 0, "fused_changed": 0}

    class Checked(drv.PipelineExecutor):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.on_job = self._check

        def _check(self, job, run):
            ws = [m.weight for k in self.modules for m in self.modules[k].modules()
                  if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
            before = [self.grads.views[p].clone() for p in ws]
            run(job)
            changed = sum(not torch.equal(b, self.grads.views[p]) for b, p in zip(before, ws))
            if job.kind is Kind.B and self._job_i in self.tp.fuse_b:  # its W is next: the executor fuses the pair
                seen["fused_changed"] += changed
            elif job.kind is Kind.B:
                seen["b_jobs"] += 1
                seen["b_changed"] += changed
            elif job.kind is Kind.W:
                seen["w_changed"] += changed

    drv.PipelineExecutor = Checked
    cfg = drv.RunConfig(schedule="zbv", pp=2, tp=2, microbatches=4, microbatch_size=2, seq_len=8, steps=1,
                        sequence_parallel=True, tp_overlap="chunked:2", tp_link_delay_ms=3.0, log_dir=log_dir)
    res = drv.worker(cfg)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, seen)
    if res is not None:
        res["seen"] = every
    return res


def test_no_tp_weight_gradient_after_b_and_tp_wait_in_the_logs(tmp_path):
    res = spawn(_checked_run, 4, (str(tmp_path),), timeout_s=120)
    seen = res["seen"]
    assert all(s["b_jobs"] > 0 for s in seen)
    assert sum(s["b_changed"] for s in seen) == 0  # a split B left every TP weight's gradient alone
    assert sum(s["fused_changed"] for s in seen) > 0  # a B fused with the W right after it computes the column ones
    assert all(s["w_changed"] > 0 for s in seen)   # W computed them
    assert res["tp_comm_wait_s"] > 0.0
    jobs = [ev for f in sorted(Path(tmp_path).glob("workerlog.*"))
            for ev in map(json.loads, f.read_text().splitlines()) if ev.get("event") == "job"]
    assert jobs and all("tp_comm" in ev and ev["tp_comm"] >= 0.0 for ev in jobs)
    # every collective of the delayed link lands >= 3 ms late (a chunked piece 1.5 ms): B jobs wait for them
    assert max(ev["tp_comm"] for ev in jobs if ev["kind"] == "B") >= 1.5e-3
    # sequence parallelism: a W apart from its B gathers the column groups' inputs again and waits at least for
    # its first gather (a W right after its own B finds them done: the fused B gathered them)
    assert max(ev["tp_comm"] for ev in jobs if ev["kind"] == "W") >= 3e-3 * 0.9


def test_a_tp_peer_that_never_arrives_is_named_within_the_timeout():
    from pipeloom.runtime.driver import RunConfig, run
    from pipeloom.runtime.launch import RankFailure

    # rank 3 (pp stage 1, TP rank 1) stops before its first backward; its TP peer, rank 2, waits in the head's
    # input-gradient all-reduce (the last stage's first collective of the backward) and names it
    cfg = RunConfig(schedule="1f1b", pp=2, tp=2, microbatches=2, microbatch_size=1, seq_len=8, timeout_s=3.0,
                    fault_hang_rank=3)
    t0 = __import__("time").monotonic()
    with pytest.raises(RankFailure) as e:
        run(cfg)
    msgs = [e.value.message] + [m for _, m in e.value.others]
    assert "\n" not in str(e.value)
    want = "rank 2: tensor-parallel all-reduce of head input gradient: timed out after 3s: rank 3 did not arrive"
    assert any(want in m for m in msgs), msgs
    assert __import__("time").monotonic() - t0 < 60
