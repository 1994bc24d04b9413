"""pipeloom tune: the search against brute force, its bounds, the cost formulas, the CLI and bad input."""
from __future__ import annotations

import json
import math
import os

import pytest
from clirun import pipeloom

from pipeloom.core.costs import MemModel
from pipeloom.models.presets import preset
from pipeloom.sim.simulate import memory_profile
from pipeloom.schedule import registry
from pipeloom.tune import Calibration, CalibrationError, Problem, TuneError, gpu_preset, tune, with_overrides
from pipeloom.tune import search
from pipeloom.tune.costs import all_reduce, reduce_scatter
from pipeloom.tune.gpus import GPU, Link, MiB
from pipeloom.tune.search import (Config, _Space, builder_vpps, evaluate, lower_bound, memory_bound,
                                  memory_lower_bound)

#: a GPU where llama-tiny's configurations differ: slow links so that comm and bubbles matter, small memory
TINY_GPU = GPU(name="tiny", peak_flops=2e9, memory=24 * MiB, hbm_bandwidth=1e9,
               intra=Link(bandwidth=2e8, latency=2e-4), inter=Link(bandwidth=2e7, latency=1e-3), gpus_per_node=4)
SCHEDS = ("1f1b", "interleaved", "zbh1", "zbv", "dualpipev")


def _problem(**kw):
    base = dict(model=preset("llama-tiny"), gpus=8, gpu=TINY_GPU, global_batch=16, seq=32, reserve=0,
                schedules=SCHEDS, max_vpp=2, max_microbatch_size=2, recompute=("none", "full"), top=3)
    base.update(kw)
    return Problem(**base)


def _brute_force(prob):
    """Every configuration of the space, each simulated: no bound, no memory pre-check."""
    space = _Space(prob)
    model = prob.model
    out = []
    for tp in (1, 2, 4):
        if prob.gpus % tp or model.heads % tp or model.kv_heads % tp or model.ffn % tp:
            continue
        for pp in (d for d in range(1, prob.gpus // tp + 1) if (prob.gpus // tp) % d == 0):
            dp = prob.gpus // tp // pp
            if pp > model.layers or prob.global_batch % dp:
                continue
            for b in range(1, prob.max_microbatch_size + 1):
                if (prob.global_batch // dp) % b:
                    continue
                for r in prob.recompute:
                    for z in prob.zero:
                        if z and dp == 1:
                            continue
                        for name in prob.schedules:
                            info = registry.get(name)
                            for vpp in builder_vpps(name, pp, model.layers, prob.max_vpp):
                                pl = info.placement_at(vpp)
                                for how in set(space.split(pp, vpp, pl, h, tp, b, r) for h in prob.partitions):
                                    for lim in (prob.mem_limits if info.memory_aware else ("default",)):
                                        c = Config(tp=tp, pp=pp, dp=dp, vpp=vpp, microbatch_size=b,
                                                   microbatches=prob.global_batch // dp // b, schedule=name,
                                                   recompute=r, zero=z, partition="x", mem_limit_mode=lim,
                                                   seg_layer_num=how, placement=pl)
                                        out.append((c, evaluate(space, c), space))
    return out


@pytest.fixture(autouse=True)
def _sweep_is_final(monkeypatch):
    # the sweep plans with a smaller greedy budget than the final ranking; compare like with like
    monkeypatch.setattr(search, "SWEEP_OPTIONS", {})


@pytest.mark.slow
@pytest.mark.parametrize("kw", [
    dict(),
    pytest.param(dict(global_batch=8, recompute=("none", "selective", "full"), schedules=SCHEDS + ("vhalf", "fthenb")),
                 marks=pytest.mark.slow),
    dict(gpu=with_overrides(TINY_GPU, memory=12 * MiB), global_batch=8),
    # several DP buckets per chunk (the bound's tail after the last weight gradient) and a split-B overlap mode
    dict(dp_bucket_params=30000, tp_overlap="fill", global_batch=8)])
def test_pick_equals_brute_force_and_bounds_hold(kw):
    prob = _problem(**kw)
    res = tune(prob)
    allc = _brute_force(prob)
    fit = [c for c, _, _ in allc if c.fits]
    assert fit, "the small space must hold fitting configurations"
    best = min(c.step_time_s for c in fit)
    assert res.best.step_time_s == pytest.approx(best, rel=1e-9)
    assert res.searched == len(allc) or res.searched >= len(fit)
    # the bounds the search prunes with never exceed what the simulation gives
    tighter = 0
    for c, _, space in allc:
        if c.step_time_s is None:
            continue
        assert lower_bound(space, c) <= c.step_time_s * (1 + 1e-9)
        assert memory_lower_bound(space, c) <= c.peak_bytes * (1 + 1e-9)
        # the memory-aware bound holds for every plan that fits, and for every plan of the bounded builders
        if c.fits or c.schedule in search.BOUNDED:
            mb = memory_bound(space, c)
            assert mb <= c.step_time_s * (1 + 1e-9), (c.key(), mb, c.step_time_s)
            tighter += mb > lower_bound(space, c) * (1 + 1e-6)
    assert tighter > 0, "the memory-aware bound should be tighter somewhere on this space"
    # memory_bound trusts each bounded builder to plan within registry.effective_limit: hold every plan to it
    checked = 0
    for c, _, space in allc:
        if c.schedule in search.BOUNDED and c.schedule_obj is not None:
            a_r, b_r = search._rounded_mem(space.budget(c).a, space.budget(c).b)
            lim = search.builder_limit(space, c, a_r, b_r)
            top = max(memory_profile(c.schedule_obj, MemModel(a=a_r, b=b_r))[0])
            assert lim is None or top <= lim + 1e-6, (c.key(), top, lim)
            checked += lim is not None
    assert checked > 0
    # and the search simulated fewer than brute force
    assert res.simulations < len(allc)


def test_ranking_is_sorted_and_fits():
    res = tune(_problem())
    ranked = [c for c in res.configs if c.fits]
    assert [c.step_time_s for c in ranked] == sorted(c.step_time_s for c in ranked)
    for c in ranked:
        assert c.tp * c.pp * c.dp == 8 and c.dp * c.microbatch_size * c.microbatches == 16
        assert c.peak_bytes <= TINY_GPU.memory
        assert c.tokens_per_s == pytest.approx(16 * 32 / c.step_time_s)
    assert sum(res.pruned.values()) > 0


def test_collectives_by_hand():
    link = Link(bandwidth=100.0, latency=1.0)
    # ring all-reduce of 400 bytes over 4 ranks: 2*3/4*400/100 = 6 s of transfer + 2*3*1 s of latency
    assert all_reduce(400, 4, link) == pytest.approx(12.0)
    assert reduce_scatter(400, 4, link) == pytest.approx(6.0)
    assert all_reduce(400, 1, link) == 0.0


def test_tp_comm_and_recompute_enter_the_layer_times():
    from pipeloom.tune.costs import layer_times

    m, g = preset("llama2-7b"), gpu_preset("h100")
    a = layer_times(m, g, 0.5, tp=1, micro_batch=1, seq=4096, recompute="none")
    b = layer_times(m, g, 0.5, tp=2, micro_batch=1, seq=4096, recompute="none")
    f = layer_times(m, g, 0.5, tp=1, micro_batch=1, seq=4096, recompute="full")
    s = layer_times(m, g, 0.5, tp=1, micro_batch=1, seq=4096, recompute="selective")
    assert a.parts["tp_comm_per_pass_s"] == 0 and b.parts["tp_comm_per_pass_s"] > 0
    assert b.F == pytest.approx(a.F / 2 + b.parts["tp_comm_per_pass_s"])
    assert f.B == pytest.approx(a.B + a.F) and f.F == a.F and f.W == a.W
    assert a.B < s.B < f.B


def test_calibration_file(tmp_path):
    p = tmp_path / "cal.json"
    p.write_text(json.dumps({"efficiency": 0.4, "inter": {"bandwidth": 1e10, "latency": 2e-5}, "source": "test"}))
    cal = Calibration.load(str(p))
    g = cal.apply(gpu_preset("h100"))
    assert cal.efficiency == 0.4 and g.inter.bandwidth == 1e10 and g.intra == gpu_preset("h100").intra
    p.write_text(json.dumps({"efficency": 0.4}))
    with pytest.raises(CalibrationError, match="unknown key"):
        Calibration.load(str(p))
    p.write_text(json.dumps({"efficiency": 1.5}))
    with pytest.raises(CalibrationError, match=r"\(0, 1\]"):
        Calibration.load(str(p))


@pytest.mark.slow  # 8-45 s on 2 busy cores: make test runs it, make test-fast does not
def test_fits_nowhere_names_memory_and_gpus():
    prob = Problem(model=preset("llama2-70b"), gpus=8, gpu=with_overrides(gpu_preset("h100"), memory=16 * 1024 ** 3),
                   global_batch=64, seq=4096, schedules=("1f1b",))
    with pytest.raises(TuneError) as e:
        tune(prob)
    msg = str(e.value)
    assert "fits in no searched configuration" in msg and "GiB" in msg and "GPUs" in msg and "\n" not in msg


def test_global_batch_not_divisible_says_which_work():
    with pytest.raises(TuneError) as e:
        tune(_problem(global_batch=6, max_pp=2, max_tp=1))
    assert "4, 8" in str(e.value) and "8" in str(e.value).split("e.g.")[1]


def _cli(*args):
    return pipeloom("tune", *args)


@pytest.mark.slow  # 8-45 s on 2 busy cores: make test runs it, make test-fast does not
def test_cli_json_and_out(tmp_path):
    out = tmp_path / "plan"
    r = _cli("--model", "llama-tiny", "--gpus", "8", "--gpus-per-node", "4", "--gpu-flops", "2e9", "--gpu-memory",
             "24MiB", "--reserve", "0", "--global-batch", "16", "--schedules", "1f1b,interleaved,zbv",
             "--max-microbatch-size", "2", "--json", "--explain", "--out", str(out))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d) >= {"configs", "searched", "pruned", "explain"} and d["searched"] >= len(d["configs"]) > 0
    c = d["configs"][0]
    for k in ("tp", "pp", "vpp", "dp", "microbatch_size", "microbatches", "schedule", "mem_limit", "recompute",
              "zero", "tokens_per_s", "mfu", "step_time_s", "bubble", "peak_bytes", "fits"):
        assert k in c
    names = set(os.listdir(out))
    assert {"plan.json", "plan.torch.csv", "launch.json", "pipeloom_torchtitan.py", "megatron_args.txt"} <= names
    launch = json.loads((out / "launch.json").read_text())
    args = " ".join(launch["megatron_args"])
    assert f"--pipeline-model-parallel-size {c['pp']}" in args and f"--tensor-model-parallel-size {c['tp']}" in args
    from pipeloom.schedule.io import load

    s = load(str(out / "plan.json"))
    assert (s.pp, s.vpp, s.microbatches) == (c["pp"], c["vpp"], c["microbatches"])


@pytest.mark.parametrize("args, words", [
    (["--gpu", "b200"], "unknown GPU preset"),
    (["--recompute", "some"], "--recompute"),
    (["--schedules", "1f1b,nope"], "--schedules"),
    (["--global-batch", "6", "--max-pp", "2", "--max-tp", "1"], "global batches that work"),
])
def test_cli_bad_input_one_line(args, words):
    base = ["--model", "llama-tiny", "--gpus", "8", "--global-batch", "16"]
    # later options win in argparse: the case's own values replace the base ones
    r = _cli(*base, *args)
    assert r.returncode == 2 and r.stderr.startswith("pipeloom: error:") and words in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_worker_processes_do_not_change_the_result():
    # plans built in a pool of 2 processes or here, one by one: the same configurations simulated, the same
    # ranking and counts (the batch, not the worker count, decides what is simulated)
    prob = _problem(global_batch=8)
    one, two = tune(prob, workers=1).to_dict(), tune(prob, workers=2).to_dict()
    one.pop("seconds"), two.pop("seconds")
    assert one == two and one["simulated"] > 2


def test_memory_bound_meets_the_hand_worked_zbv_example():
    # schedule/search/bounds.py works this case by hand: zbv pp 4, m 8, F=B=W=comm=1, limit 4 units, a=1/2,
    # b=1/4: the last forward on the last device cannot start before 43, then 22 to the end: T >= 65, which
    # the ZB-V builder reaches. The tuner's closed form (one room per device, LP relaxations) must agree.
    from pipeloom.core.costs import Costs, MemModel
    from pipeloom.core.ir import Placement, chunks_of, device_of
    from pipeloom.schedule.registry import PlanSpec
    from pipeloom.sim.simulate import simulate
    from pipeloom.tune.bounds import step_bound

    pp, vpp, m = 4, 2, 8
    nc = pp * vpp
    owned = [chunks_of(d, pp, vpp, Placement.V) for d in range(pp)]
    dev = [device_of(c, pp, Placement.V) for c in range(nc)]
    cross = [k > 0 and dev[k] != dev[k - 1] for k in range(nc)]
    ones = [1.0] * nc
    bound = step_bound(ones, ones, ones, 1.0, cross, owned, m, [0.5] * nc, [0.25] * nc, [4.0] * pp, [0.0] * nc, 0.0)
    plan = registry.build("zbv", PlanSpec(pp=pp, vpp=vpp, microbatches=m, costs=Costs(F=1, B=1, W=1, comm=1),
                                          mem=MemModel(a=0.5, b=0.25), mem_limit=4.0))
    assert bound == pytest.approx(65.0)
    assert simulate(plan, Costs(F=1, B=1, W=1, comm=1)).makespan == pytest.approx(bound)
    # without the memory terms only the chains and the busy time are left: a weaker bound
    assert step_bound(ones, ones, ones, 1.0, cross, owned, m, [0.5] * nc, [0.25] * nc, None, [0.0] * nc, 0.0) < 65


@pytest.mark.parametrize("limit", ["1p", pytest.param("3", marks=pytest.mark.slow),
                                   pytest.param("16MiB", marks=pytest.mark.slow)])  # 13-45 s each under load
def test_a_given_mem_limit_plans_every_memory_aware_schedule_under_it(limit):
    from pipeloom.core.costs import MemLimit

    prob = _problem(schedules=("1f1b", "zbh1", "zbv"), mem_limit=limit, global_batch=8)
    res = tune(prob, exhaustive=True, workers=1)
    lim = MemLimit.parse(limit)
    aware = [c for c in res.configs if registry.get(c.schedule).memory_aware and c.schedule_obj is not None]
    assert aware and all(c.mem_limit_mode == "given" for c in aware)
    for c in aware:
        if lim.is_bytes:  # the device budget's room for activations under that size, to 1/100 unit
            room = min((lim.value - prob.reserve - sum(st) - tr) / c.detail["unit_bytes"]
                       for st, tr in zip(_space_of(prob).budget(c).static, _space_of(prob).budget(c).transient))
            assert c.mem_limit == pytest.approx(math.floor(room * 100) / 100)
        else:
            assert c.mem_limit == (c.pp * 1.0 if limit == "1p" else 3.0)
        # the plan stays within it in the memory model it was planned with (B's release clamped to [0, a])
        a_r, b_r = search._rounded_mem(_space_of(prob).budget(c).a, _space_of(prob).budget(c).b)
        assert max(memory_profile(c.schedule_obj, MemModel(a=a_r, b=b_r))[0]) <= c.mem_limit + 1e-6
    assert all(c.mem_limit_mode == "default" for c in res.configs if c.schedule == "1f1b")


def _space_of(prob):
    return _Space(prob)
