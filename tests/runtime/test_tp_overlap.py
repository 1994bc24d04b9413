"""The tensor-parallel overlap modes (``pipeloom run --tp-overlap off|async|chunked:K|fill``) on real processes
(gloo, 127.0.0.1), pp 2 x tp 2: every mode gives BITWISE the same losses and gradients (sha256 of every rank's
gradients) and parameters after one AdamW step as ``off``, with and without sequence parallelism, for 1f1b
(every backward fused), zbv and zbh1 (split backward), dualpipev and a random valid plan (both mixed); bf16 with fp32 master gradients likewise (the pitfall of
the original overlap: a gradient read before its collective had landed). The race detector: on the emulated
link (``tp_link_delay_ms``) with a random delay per collective (``tp_link_jitter``) every result equals the
undelayed run bitwise, so nothing reads a collective's result before its wait. The counters show that each
mode really does its overlap (fused weight-gradient GEMMs, chunked pieces, filled W work).

Process start dominates, so every case runs in ONE process group of 4 ranks."""
from __future__ import annotations

import pytest

from pipeloom.memory.analytic import TrainConfig, estimate
from pipeloom.runtime.driver import RunConfig, cases_worker, model_config, run
from pipeloom.runtime.launch import spawn

from fuzzplans import random_plan  # noqa: E402  (tests/: pytest puts it on sys.path)

SMALL = dict(pp=2, tp=2, microbatches=4, microbatch_size=2, seq_len=8, return_params=True, steps=1)
RANDOM = random_plan(2, 2, 4, seed=3, split=0.6)


def _same(a: dict, b: dict) -> bool:
    return (a["losses"] == b["losses"] and a["params"] == b["params"]
            and [r["grad_digest"] for r in a["rank_bytes"]] == [r["grad_digest"] for r in b["rank_bytes"]])


def tp_static(c: dict, r: dict, dp: int = 1, zero: int = 0):
    """(measured, estimated) per-rank (params, grads, optimizer) bytes: a TP rank of the run against
    ``pipeloom memory --tp 2 [--sequence-parallel] --dtype D [--dp N --zero Z]``."""
    cfg = RunConfig(**{k: v for k, v in c.items() if k not in ("dtype", "steps")})
    sched = cfg.schedule if isinstance(cfg.schedule, str) else cfg.schedule.name
    mcfg = model_config(cfg, 2 * (1 if sched == "1f1b" else 2))
    rep = estimate(mcfg, TrainConfig(dtype=c.get("dtype", "fp32"), tp=c["tp"], dp=dp, zero=zero,
                                     sequence_parallel=c.get("sequence_parallel", False), seq=c["seq_len"],
                                     micro_batch=c["microbatch_size"], impl="eager"),
                   schedule=sched, pp=c["pp"], microbatches=c["microbatches"])
    for b in r["rank_bytes"]:
        d = rep.devices[b["pp_rank"]]
        yield (b["params_bytes"], b["grads_bytes"], b["optimizer_bytes"]), (d.params_bytes, d.grads_bytes,
                                                                              d.optimizer_bytes)


def _count(r: dict, what: str) -> int:
    return sum(x[what] for x in r["rank_bytes"])


@pytest.mark.dist
@pytest.mark.slow
def test_overlap_modes_and_delayed_link_are_bitwise_equal_to_off():
    groups = {  # name -> cases; the first of each group is the baseline the others must equal bitwise
        "zbv": [dict(schedule="zbv", tp_overlap=m, **SMALL) for m in ("off", "async", "chunked:2", "fill")]
        + [dict(schedule="zbv", tp_overlap="chunked:2", tp_link_delay_ms=4.0, tp_link_jitter=True, **SMALL)],
        "zbv-sp": [dict(schedule="zbv", sequence_parallel=True, tp_overlap=m, **SMALL)
                   for m in ("off", "async", "chunked:2", "fill")]
        + [dict(schedule="zbv", sequence_parallel=True, tp_overlap="fill", tp_link_delay_ms=4.0, **SMALL),
           dict(schedule="zbv", sequence_parallel=True, tp_overlap="fill", tp_link_delay_ms=4.0, tp_link_jitter=True,
                **SMALL)],
        "1f1b-sp": [dict(schedule="1f1b", sequence_parallel=True, tp_overlap=m, **SMALL) for m in ("off", "async")]
        + [dict(schedule="1f1b", sequence_parallel=True, tp_overlap="async", tp_link_delay_ms=4.0,
                tp_link_jitter=True, **SMALL)],
        "zbh1-sp": [dict(schedule="zbh1", sequence_parallel=True, tp_overlap=m, **SMALL) for m in ("off", "fill")],
        "dualpipev": [dict(schedule="dualpipev", tp_overlap=m, **SMALL) for m in ("off", "chunked:2", "fill")],
        # a random valid plan: microbatches out of order, B/W splits and BW mixed, W far from its B
        "random-sp": [dict(schedule=RANDOM, sequence_parallel=True, tp_overlap=m, **SMALL) for m in ("off", "fill", "async")],
        "bf16": [dict(schedule="zbv", sequence_parallel=True, dtype="bf16", tp_overlap=m, verify=m == "off", **SMALL)
                 for m in ("off", "async", "fill")],
    }
    cases = [c for g in groups.values() for c in g]
    res = iter(spawn(cases_worker, 4, (cases,), timeout_s=240))
    out = {name: [next(res) for _ in g] for name, g in groups.items()}
    for name, rs in out.items():
        base = rs[0]
        assert base["tp_overlap"] == "off" and base["tp"] == 2
        for c, r in zip(groups[name][1:], rs[1:]):
            assert _same(base, r), (name, c)
    # each mode did its own overlap (and off none): fused GEMMs, chunked pieces, filled W work
    z = out["zbv"]
    assert _count(z[0], "tp_fused_gemms") == _count(z[0], "tp_filled_gemms") == _count(z[0], "tp_chunked_pieces") == 0
    assert _count(z[1], "tp_fused_gemms") > 0          # async: zbv has W right after its own B
    assert _count(z[2], "tp_chunked_pieces") > 0
    assert _count(out["zbv-sp"][4], "tp_filled_gemms") > 0  # fill on the delayed link: W work under collectives
    assert _count(out["1f1b-sp"][1], "tp_fused_gemms") > 0  # 1f1b: every BW fused
    # bf16 with fp32 master gradients: really bf16, within the runtime's bf16 tolerance of the fp32 reference
    bf = out["bf16"][0]
    assert bf["dtype"] == "bf16" and 0.0 < bf["max_grad_diff"] <= 5e-2 and bf["max_loss_diff"] <= 5e-2
    # what a TP rank holds (parameters, fp32 gradients, AdamW states and fp32 master weights) is exactly what
    # 'pipeloom memory --tp 2' estimates per device (fp32; bf16 with sequence parallelism)
    for name in ("zbv", "bf16"):
        for measured, want in tp_static(groups[name][0], out[name][0]):
            assert measured == want, (name, measured, want)


@pytest.mark.parametrize("kw,msg", [
    (dict(tp=2, tp_overlap="chunked:1"), "allowed are off, async, chunked:K (K >= 2 token pieces), fill"),
    (dict(tp=2, tp_overlap="sometimes"), "tensor-parallel overlap 'sometimes'"),
    (dict(tp_overlap="async"), "--tp-overlap is about tensor-parallel collectives: it needs --tp > 1"),
    (dict(tp_link_delay_ms=2.0), "--tp-link-delay is about tensor-parallel collectives"),
    (dict(tp=2, tp_link_delay_ms=-1.0), "--tp-link-delay must be a finite number of milliseconds >= 0"),
    (dict(tp=2, keep_gathered_input=True), "--keep-gathered-input is about sequence parallelism"),
])
def test_bad_overlap_options_are_one_line(kw, msg):
    with pytest.raises(ValueError) as e:
        run(RunConfig(schedule="1f1b", pp=2, **kw))
    assert msg in str(e.value) and "\n" not in str(e.value)
