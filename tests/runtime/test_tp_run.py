"""pp x tp on real processes (gloo, 127.0.0.1): ``pipeloom run --tp 2`` at pp 2 runs the tensor-parallel
Llama (pipeloom.models.tp) under 1f1b and zbv (split backward: W on the local shards), and the loss, every
gradient (gathered from the TP shards) and every parameter after one AdamW step equal a single-process
reference, with and without sequence parallelism (P2P of seq/tp token shards between the stages); a tp that does not divide the model is one line before any process starts.

Process start dominates, so every case runs in ONE process group of 4 ranks."""
from __future__ import annotations

import pytest
import torch

from pipeloom.runtime.driver import RunConfig, cases_worker, run
from pipeloom.runtime.launch import spawn

TOL = 1e-5
REF_PARAM_TOL = 5e-5  # Adam's first step near eps: see tests/runtime/test_dp.py
BF16_TOL = 5e-2  # bf16 against the fp32 reference: the runtime's other bf16 tests' tolerance
SMALL = dict(pp=2, tp=2, microbatches=4, microbatch_size=2, seq_len=8, verify=True, return_params=True, steps=2)


@pytest.mark.dist
def test_pp2_tp2_1f1b_and_zbv_match_one_process():
    cases = [dict(schedule="1f1b", **SMALL), dict(schedule="zbv", **SMALL),
             dict(schedule="1f1b", sequence_parallel=True, **SMALL), dict(schedule="zbv", sequence_parallel=True, **SMALL),
             dict(schedule="zbv", sequence_parallel=True, dtype="bf16", **SMALL)]
    res = spawn(cases_worker, 4, (cases,), timeout_s=120)
    # bf16 parameters with fp32 master gradients: within the runtime's bf16 tolerance of the fp32 reference
    bf = res.pop()
    assert bf["dtype"] == "bf16" and bf["params_missing_grad"] == 0 and bf["tp_replica_param_diff"] == 0.0
    assert bf["max_loss_diff"] <= BF16_TOL and bf["max_grad_diff"] <= BF16_TOL and bf["max_param_diff"] <= BF16_TOL, bf
    assert bf["max_grad_diff"] > 0.0  # really bf16
    cases.pop()
    for c, r in zip(cases, res):
        assert r["tp"] == 2 and r["world_size"] == 4, c
        assert r["params_missing_grad"] == 0, c
        assert r["max_loss_diff"] <= TOL and r["max_grad_diff"] <= TOL and r["max_param_diff"] <= REF_PARAM_TOL, (c, r)
        assert abs(r["losses"][0] - r["reference_loss"]) <= TOL and r["loss"] > 1.0  # the mean loss, not tp times it
        # replicated weights (norms; with SP their gradients are partial) identical on both TP ranks after each step
        assert r["tp_replica_param_diff"] == 0.0, c
    # zbv splits the backward: W really defers the TP linears' weight gradients
    for r in (res[1], res[3]):
        assert r["deferred_wgrad_share"] and min(r["deferred_wgrad_share"].values()) > 0.5
    # every schedule, with and without sequence parallelism, trains the same model: same parameters after the step
    a = res[0]["params"]
    for b in (r["params"] for r in res[1:]):
        assert a.keys() == b.keys()
        assert max((torch.tensor(a[n]) - torch.tensor(b[n])).abs().max().item() for n in a) <= TOL


@pytest.mark.parametrize("kw,msg", [
    (dict(tp=3), "tp=3 does not divide heads=4"),
    (dict(tp=2, model=object(), sequence_parallel=True, seq_len=8), "not yet with --model and --sequence-parallel"),
    (dict(tp=0), "tp must be an integer >= 1"),
    (dict(tp=1, sequence_parallel=True), "needs --tp > 1"),
    (dict(tp=4, sequence_parallel=True, seq_len=10), "--seq-len 10 must be a multiple of --tp 4"),
])
def test_bad_tp_is_one_line_before_any_process(kw, msg):
    with pytest.raises(ValueError) as e:
        run(RunConfig(schedule="1f1b", pp=2, **kw))
    assert msg in str(e.value) and "\n" not in str(e.value)


@pytest.mark.dist
def test_cli_run_tp2_sequence_parallel_json_verify(capsys):
    import json

    from pipeloom.cli import main
    for keep in ([], ["--keep-gathered-input"]):  # the column groups' inputs gathered again in W (default), or kept
        rc = main(["run", "--schedule", "1f1b", "--pp", "2", "--tp", "2", "--sequence-parallel", "--microbatches", "2",
                   "--steps", "2", "--seq-len", "8", "--verify", "--json", *keep])  # the default microbatch size (2)
        out = json.loads(capsys.readouterr().out)
        assert rc == 0 and out["verified"] is True
        assert out["tp"] == 2 and out["sequence_parallel"] is True and out["steps"] == 2
        assert out["keep_gathered_input"] is bool(keep)
        assert out["max_loss_diff"] <= TOL and out["max_grad_diff"] <= TOL


@pytest.mark.parametrize("argv,msg", [
    (["--tp", "3"], "tp=3 does not divide heads=4"),
    (["--tp", "0"], "--tp: must be >= 1"),
])
def test_cli_run_bad_tp_is_one_line(capsys, argv, msg):
    from pipeloom.cli import main
    try:
        rc = main(["run", "--pp", "2"] + argv)
    except SystemExit as e:  # argparse's own checks exit
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("pipeloom: error:") and msg in err and "Traceback" not in err
    assert err.count("\n") == 1


def test_torchrun_world_mismatch_counts_the_tp_ranks(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"torchrun started 2 ranks; pp\*dp\*tp = 2\*1\*2 = 4"):
        run(RunConfig(schedule="1f1b", pp=2, tp=2, microbatches=2))


@pytest.mark.dist
@pytest.mark.slow
def test_pp2_tp2_interleaved_zbh1_dualpipev_and_a_random_plan_match_one_process():
    """The rest of issue 30's schedule list against the single-process reference (1f1b and zbv above): interleaved
    (vpp 2), zbh1 and a random valid plan (B/W and BW mixed, W far from its B) with sequence parallelism, dualpipev."""
    from fuzzplans import random_plan  # tests/: pytest puts it on sys.path

    one = dict(SMALL, steps=1)
    cases = [dict(schedule="interleaved", **one), dict(schedule="zbh1", sequence_parallel=True, **one),
             dict(schedule="dualpipev", **one),
             dict(schedule=random_plan(2, 2, 4, seed=5, split=0.6), sequence_parallel=True, **one)]
    res = spawn(cases_worker, 4, (cases,), timeout_s=180)
    for c, r in zip(cases, res):
        assert r["tp"] == 2 and r["world_size"] == 4, c
        assert r["params_missing_grad"] == 0, c
        assert r["max_loss_diff"] <= TOL and r["max_grad_diff"] <= TOL and r["max_param_diff"] <= REF_PARAM_TOL, (c, r)
        assert r["tp_replica_param_diff"] == 0.0, c


@pytest.mark.dist
def test_cli_run_tp2_calibrate_writes_one_tp_ranks_costs_and_the_tp_wait(tmp_path, capsys):
    """``run --tp 2 --calibrate FILE`` (refused before): the measured per-job costs written like a non-TP
    calibration, with one TP rank's FLOPs (half of each GEMM) and the time the jobs waited on TP collectives
    recorded apart (here on the emulated link, so the wait is certainly there); the tuner loads the file."""
    import json

    from pipeloom.cli import main
    from pipeloom.models import flops
    from pipeloom.tune.costs import Calibration

    f = tmp_path / "calib.json"
    rc = main(["run", "--schedule", "zbv", "--pp", "2", "--tp", "2", "--sequence-parallel", "--microbatches", "4",
               "--steps", "2", "--seq-len", "8", "--tp-link-delay", "5", "--calibrate", str(f), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["calibration_file"] == str(f) and out["tp_comm_wait_s"] > 0.0
    data = json.loads(f.read_text())
    m = data["measured"]
    assert "tp=2 sp" in data["source"] and m["tp"]["ranks"] == 2 and m["tp"]["sequence_parallel"] is True
    assert m["tp"]["link_delay_ms"] == 5.0 and m["tp"]["wait_seconds_per_step"] == out["tp_comm_wait_s"]
    waits = m["tp"]["wait_seconds_per_chunk_pass"]
    assert [len(waits[k]) for k in "FBW"] == [4, 4, 4]  # zbv: 2 chunks per stage
    # F all-gathers / reduce-scatters and B reduces on every chunk: each waits on the 5 ms link
    assert min(waits["F"]) > 0.001 and min(waits["B"]) > 0.001
    assert 0.0 < m["tp"]["wait_share"]["F"] < 1.0
    # one TP rank's FLOPs: half of the layers' and the head's, spread over the 4 chunks
    from pipeloom.runtime.driver import RunConfig, model_config
    mc = model_config(RunConfig(schedule="zbv", pp=2, tp=2, microbatches=4, seq_len=8), 4)
    lf, hf = flops.layer_flops(mc, 2 * 8, seq=8), flops.head_flops(mc, 2 * 8)
    for i, k in enumerate("FBW"):
        assert m["flops_per_chunk_pass"][k] == pytest.approx((mc.layers * lf[i] + hf[i]) / 2 / 4)
    # the seconds are the measured job times, as without TP; the FLOP/s are over the compute left after the wait
    secs = sum(m["seconds_per_chunk_pass"]["F"])
    assert m["flops_per_s"]["F"] == pytest.approx(m["flops_per_chunk_pass"]["F"] * 4 / (secs - sum(waits["F"])))
    assert Calibration.load(str(f)).achieved_flops == data["achieved_flops"] > 0
