"""Issue 30's proof matrix in full, on real processes (gloo, 127.0.0.1), pp 2 x tp 2: for every schedule (1f1b,
interleaved, zbh1, zbv, dualpipev and a random valid plan), with and without sequence parallelism, the ``off`` run
equals the single-process reference (loss, every gradient gathered from the TP shards, parameters after one AdamW
step), and every overlap mode (``async``, ``chunked:2``, ``fill``) gives BITWISE the same losses, per-rank
gradient digests and parameters as ``off``.

With sequence parallelism a column-parallel group keeps its input's shard and gathers it again for its weight
gradients (double-buffered in W, started before the dgrad in a fused backward): every SP cell re-gathers, and
``zbv`` with ``keep_gathered_input`` (the gathered input kept from F) covers the other path, ``off`` against the
reference and ``fill`` bitwise against it.

tests/runtime/test_tp_run.py and test_tp_overlap.py check parts of this matrix with extra counters; this file is
the one place that covers every (schedule, SP, mode) cell. Process start dominates, so all 48 cells run in ONE
process group of 4 ranks, in sequence, and rank 0 returns their results."""
from __future__ import annotations

import pytest

from pipeloom.runtime.driver import cases_worker
from pipeloom.runtime.launch import spawn

from fuzzplans import random_plan  # noqa: E402  (tests/: pytest puts it on sys.path)

TOL = 1e-5
REF_PARAM_TOL = 5e-5  # Adam's first step near eps: see tests/runtime/test_dp.py
SMALL = dict(pp=2, tp=2, microbatches=4, microbatch_size=2, seq_len=8, return_params=True, steps=1)
SCHEDULES = {"1f1b": "1f1b", "interleaved": "interleaved", "zbh1": "zbh1", "zbv": "zbv", "dualpipev": "dualpipev",
             "random": random_plan(2, 2, 4, seed=11, split=0.6)}  # B/W splits and BW mixed, W far from its B
MODES = ("off", "async", "chunked:2", "fill")


def _digest(r: dict) -> tuple:
    """Everything the bitwise check compares: losses, every rank's gradient sha256, the parameters after the step."""
    return r["losses"], [b["grad_digest"] for b in r["rank_bytes"]], r["params"]


@pytest.mark.dist
@pytest.mark.slow
def test_every_schedule_sp_and_overlap_mode_matches_the_reference_and_off_bitwise():
    cells = [(name, sp, mode) for name in SCHEDULES for sp in (False, True) for mode in MODES]
    cases = [dict(schedule=SCHEDULES[name], sequence_parallel=sp, tp_overlap=mode, verify=mode == "off", **SMALL)
             for name, sp, mode in cells]
    keep = [("zbv", "keep", "off"), ("zbv", "keep", "fill")]  # the gathered input kept from F to W
    cases += [dict(schedule="zbv", sequence_parallel=True, keep_gathered_input=True, tp_overlap=mode,
                   verify=mode == "off", **SMALL) for _, _, mode in keep]
    res = dict(zip(cells + keep, spawn(cases_worker, 4, (cases,), timeout_s=600)))
    for name in SCHEDULES:
        for sp in (False, True):
            base = res[(name, sp, "off")]
            cell = (name, sp)
            assert base["tp"] == 2 and base["world_size"] == 4 and base["tp_overlap"] == "off", cell
            assert base["sequence_parallel"] is sp, cell
            assert base["params_missing_grad"] == 0, cell
            assert base["max_loss_diff"] <= TOL and base["max_grad_diff"] <= TOL, (cell, base)
            assert base["max_param_diff"] <= REF_PARAM_TOL, (cell, base)
            assert base["tp_replica_param_diff"] == 0.0, cell  # replicated norm weights equal on both TP ranks
            for mode in MODES[1:]:
                r = res[(name, sp, mode)]
                assert r["tp_overlap"] == mode, (cell, mode)
                assert _digest(r) == _digest(base), (cell, mode)
    # the modes really overlap somewhere in the matrix (else "bitwise equal to off" would be trivially true)
    count = lambda r, what: sum(b[what] for b in r["rank_bytes"])  # noqa: E731
    assert all(count(res[(n, sp, "off")], w) == 0 for n in SCHEDULES for sp in (False, True)
               for w in ("tp_fused_gemms", "tp_chunked_pieces", "tp_filled_gemms"))
    # re-gather: every SP cell gathers its column groups' inputs again (without SP and with the inputs kept, none);
    # double-buffered (a gather started under the previous group's GEMMs) in every mode but off
    for n in SCHEDULES:
        for mode in MODES:
            assert count(res[(n, True, mode)], "tp_regathers") > 0, (n, mode)
            assert count(res[(n, False, mode)], "tp_regathers") == 0, (n, mode)
            if mode == "off" or n in ("1f1b", "interleaved"):  # blocking, or every backward fused (no W job)
                assert count(res[(n, True, mode)], "tp_regathers_prefetched") == 0, (n, mode)
            elif n in ("zbv", "random"):  # W jobs apart from their B: their gathers double-buffered
                assert count(res[(n, True, mode)], "tp_regathers_prefetched") > 0, (n, mode)
    kb = res[("zbv", "keep", "off")]
    assert kb["keep_gathered_input"] is True and kb["sequence_parallel"] is True
    assert kb["max_loss_diff"] <= TOL and kb["max_grad_diff"] <= TOL and kb["max_param_diff"] <= REF_PARAM_TOL
    assert _digest(res[("zbv", "keep", "fill")]) == _digest(kb)
    assert count(kb, "tp_regathers") == count(res[("zbv", "keep", "fill")], "tp_regathers") == 0
    # kept or gathered again: the same gradients (an all-gather copies; W's arithmetic is the same)
    assert _digest(kb) == _digest(res[("zbv", True, "off")])
    for sp in (False, True):
        assert count(res[("1f1b", sp, "async")], "tp_fused_gemms") > 0
        assert count(res[("zbv", sp, "chunked:2")], "tp_chunked_pieces") > 0
        assert count(res[("interleaved", sp, "async")], "tp_fused_gemms") > 0
