"""What-if straggler analysis of op traces: the replay against the generator's own (independent) event
simulation, and one planted cause per synthetic trace, named and its slowdown recovered within 5%."""
import json
import os

import numpy as np
import pytest

from pipeloom.cli import main
from pipeloom.trace.ops.opcheck import check_optrace
from pipeloom.trace.ops.optrace import OpTraceError, read_optrace
from pipeloom.trace.ops.synth import OpSynthConfig, generate, write
from pipeloom.trace.ops.whatif import analyse, build_model


def _write(tmp_path, cfg, name="t.parquet", **kw):
    res = generate(cfg)
    path = str(tmp_path / name)
    stem = path.rsplit(".", 1)[0]
    write(path, res, meta_path=stem + ".meta.yaml", **kw)
    return path, stem + ".meta.yaml", res


# ------------------------------------------------------------------------------- replay == measured
@pytest.mark.parametrize("dp,pp,tp,vpp,all_tp", [(2, 2, 1, 1, False), (3, 4, 2, 2, True), (8, 2, 4, 1, False),
                                                 (2, 8, 1, 2, False), (4, 3, 2, 1, True)])
def test_replay_with_measured_durations_reproduces_the_step_time(tmp_path, dp, pp, tp, vpp, all_tp):
    cfg = OpSynthConfig(dp=dp, pp=pp, tp=tp, vpp=vpp, steps=20, jitter=0.05, seed=dp * 10 + pp,
                        cause="random_slow", factor=1.4, all_tp_ranks=all_tp)
    path, meta, res = _write(tmp_path, cfg)
    tr = read_optrace(path, meta)
    m = build_model(tr)
    r = analyse(m)
    # the generator's own step times (an independent simulation) are what the trace measured
    assert np.allclose(r.t_measured, res.step_ms, rtol=1e-9)
    assert r.replay_error < 0.02 and r.replay_error_max_step < 0.02
    assert m.p2p_pairs > 0 and m.pipeline_edges > 0 and m.collectives > 0
    if all_tp:
        assert m.merged_tp_rows == len(res.columns["step"]) - m.n > 0


def test_tp_ranks_merge_into_their_worker(tmp_path):
    base = dict(dp=2, pp=4, tp=2, steps=12, cause="slow_worker", where=(1, 2), factor=1.8, seed=3)
    one, m1, _ = _write(tmp_path, OpSynthConfig(**base), "one.parquet")
    allr, m2, _ = _write(tmp_path, OpSynthConfig(**base, all_tp_ranks=True), "all.parquet")
    a = analyse(build_model(read_optrace(one, m1)))
    b = analyse(build_model(read_optrace(allr, m2)))
    assert a.slowdown == pytest.approx(b.slowdown, rel=1e-9)
    assert read_optrace(allr).sizes["tp_size"] == 2  # inferred from the ranks per worker


# --------------------------------------------------------------------------------- planted causes
CASES = {
    "slow_worker": dict(dp=2, pp=4, vpp=1, cause="slow_worker", where=(1, 2), factor=1.8),
    "slow_worker_vpp": dict(dp=4, pp=2, vpp=2, tp=2, cause="slow_worker", where=(3, 0), factor=1.5),
    "slow_worker_dp8": dict(dp=8, pp=2, vpp=2, tp=4, cause="slow_worker", where=(6, 1), factor=1.5),
    "heavy_stage": dict(dp=4, pp=4, vpp=2, cause="heavy_stage", where=(0, -1), factor=1.5),
    "heavy_stage_pp8": dict(dp=2, pp=8, vpp=1, cause="heavy_stage", where=(0, -1), factor=1.3),
    "random_slow": dict(dp=4, pp=4, vpp=1, cause="random_slow", factor=1.6),
    "slow_collective": dict(dp=4, pp=4, vpp=1, cause="slow_collective", where=(0, 1), factor=10.0),
    "clean": dict(dp=4, pp=4, vpp=2, cause="none"),
}


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory):
    out = {}
    for name, kw in CASES.items():
        d = tmp_path_factory.mktemp(name)
        cfg = OpSynthConfig(steps=20, jitter=0.02, seed=len(name), **kw)
        path, meta, res = _write(d, cfg)
        out[name] = (check_optrace(path, meta=meta, layers=8 * cfg.pp, pictures=name == "heavy_stage",
                                   out_dir=str(d / "out")), res, cfg)
    return out


@pytest.mark.parametrize("name", ["slow_worker", "slow_worker_vpp", "slow_worker_dp8"])
def test_a_single_slow_worker_is_named_and_its_slowdown_recovered(diagnosed, name):
    d, res, cfg = diagnosed[name]
    want = {"dp_rank": cfg.where[0], "stage": cfg.where[1]}
    assert d["stragglers"] == [want]
    assert d["imbalanced_stages"] == [] and not d["no_fixed_straggler"]
    w = next(x for x in d["by_worker"] if x["dp_rank"] == want["dp_rank"] and x["stage"] == want["stage"])
    assert w["exact"] and w["slowdown"] == pytest.approx(res.planted_slowdown, rel=0.05)
    assert d["slowdown"] == pytest.approx(res.planted_slowdown, rel=0.05)
    assert w["score"] > 0.9 and max(x["score"] for x in d["by_worker"] if x is not w) < 0.2
    assert d["mw"] > 0.8 and d["mw_workers"] == [want]
    ranks = {(r["dp_rank"], r["stage"]): r["score"] for r in d["by_rank"]}
    assert len(d["by_rank"]) == cfg.dp * cfg.pp and ranks[(want["dp_rank"], want["stage"])] == w["score"]
    assert len(d["verdicts"]) == 1 and f"dp {want['dp_rank']} / pp {want['stage']}" in d["verdicts"][0]


@pytest.mark.parametrize("name", ["heavy_stage", "heavy_stage_pp8"])
def test_a_heavier_last_stage_is_named_with_a_partition_command(diagnosed, name):
    d, res, cfg = diagnosed[name]
    last = cfg.pp - 1
    assert d["imbalanced_stages"] == [last] and d["stragglers"] == []
    assert d["by_stage"][last]["slowdown"] == pytest.approx(res.planted_slowdown, rel=0.05)
    assert d["ms"] > 0.8 and d["mw"] < 0.5
    assert len(d["verdicts"]) == 1 and "last stage" in d["verdicts"][0] and "fewer layers" in d["verdicts"][0]
    assert d["partition_command"].startswith("pipeloom partition --layer-costs ")


def test_the_partition_command_runs_and_rebalances(diagnosed, capsys):
    d, _, cfg = diagnosed["heavy_stage"]
    cmd = d["partition_command"].split("  (")[0].split()[1:]
    assert main(cmd + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    counts = [sum(len(c) for c in dev) for dev in out["devices"]] if "devices" in out else None
    # the heavy last stage gets fewer layers than the others
    if counts:
        assert counts[-1] < min(counts[:-1])
    assert os.path.isfile(d["pictures"]["heatmap"]) and os.path.isfile(d["pictures"]["timeline"])
    tl = json.load(open(d["pictures"]["timeline"]))
    names = {e["args"]["name"] for e in tl["traceEvents"] if e.get("name") == "process_name"}
    assert any("ideal" in n for n in names) and any("measured" in n for n in names)
    # the ideal track of the slowest step spans that step's what-if ideal time (us per ms = 1000)
    pid = next(e["pid"] for e in tl["traceEvents"] if e.get("name") == "process_name" and "ideal" in e["args"]["name"])
    ev = [e for e in tl["traceEvents"] if e.get("ph") == "X" and e["pid"] == pid]
    span = (max(e["ts"] + e["dur"] for e in ev) - min(e["ts"] for e in ev)) / 1000
    step = next(s for s in d["per_step"] if s["step"] == tl["otherData"]["step"])
    assert step["slowdown"] == max(s["slowdown"] for s in d["per_step"])
    assert span == pytest.approx(step["ideal"], rel=1e-3)
    assert all(0.8 < s["ms"] <= 1.05 for s in d["per_step"])


def test_random_per_step_slow_workers_are_no_fixed_straggler(diagnosed):
    d, res, _ = diagnosed["random_slow"]
    assert d["no_fixed_straggler"] and d["stragglers"] == [] and d["imbalanced_stages"] == []
    assert "no fixed straggler" in d["verdicts"][0]
    assert d["slowdown"] == pytest.approx(res.planted_slowdown, rel=0.05)
    assert len({(s["slowest_worker"]["dp_rank"], s["slowest_worker"]["stage"]) for s in d["per_step"]}) >= 5


def test_a_slow_dp_collective_is_named_by_optype(diagnosed):
    d, res, cfg = diagnosed["slow_collective"]
    assert d["slow_optypes"] == ["grads-reduce-scatter"]
    assert d["stragglers"] == [] and d["imbalanced_stages"] == []
    top = d["by_optype"][0]
    assert top["optype"] == "grads-reduce-scatter"
    assert top["slowdown"] == pytest.approx(res.planted_slowdown, rel=0.05)
    assert "grads-reduce-scatter" in d["verdicts"][0] and f"stage {cfg.where[1]}" in d["verdicts"][0]


def test_a_clean_trace_gets_no_verdict(diagnosed):
    d, _, _ = diagnosed["clean"]
    assert d["verdicts"] == [] and d["stragglers"] == [] and d["imbalanced_stages"] == []
    assert d["slowdown"] < 1.05 and d["replay_error"] < 0.02


# ---------------------------------------------------------------------------------- files and CLI
def test_csv_with_malformed_rows_counts_them(tmp_path):
    cfg = OpSynthConfig(dp=2, pp=2, steps=6, cause="slow_worker", where=(0, 1), factor=2.0)
    path, meta, res = _write(tmp_path, cfg, "t.csv", malformed=7)
    with open(path, "a") as fh:
        fh.write("0,1,2,3,forward-compute,abc,1.0,0,0,1,0\n")
        fh.write("1,2,3\n")  # a short row
    tr = read_optrace(path)
    assert tr.malformed == 9 and len(tr) == len(res.columns["step"])
    assert tr.examples and any("malformed" in w for w in tr.warnings)
    d = check_optrace(path, pictures=False)
    assert d["malformed_rows"] == 9 and d["stragglers"] == [{"dp_rank": 0, "stage": 1}]


def test_meta_sizes_and_inference(tmp_path):
    cfg = OpSynthConfig(dp=2, pp=2, tp=4, vpp=2, steps=3)
    path, meta, _ = _write(tmp_path, cfg)
    tr = read_optrace(path)
    assert tr.sizes == {"dp_size": 2, "pp_size": 2, "vpp_size": 2, "tp_size": 1, "cp_size": 1, "world_size": 4}
    # without a meta the time unit is inferred too: a median forward below 1 reads as seconds
    assert set(tr.inferred) == {"dp_size", "pp_size", "vpp_size", "tp_size", "cp_size", "world_size", "time_unit"}
    assert tr.time_unit == "s" and read_optrace(path, meta).time_unit == "ms"  # the generator's meta says ms
    js = tmp_path / "m.json"
    js.write_text(json.dumps({"dp_size": 2, "pp_size": 2, "tp_size": 4, "vpp_size": 2, "world_size": 16}))
    assert read_optrace(path, str(js)).sizes["tp_size"] == 4
    assert read_optrace(path, meta).inferred == ["cp_size"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("dp_size: -1\n")
    with pytest.raises(OpTraceError, match="dp_size"):
        read_optrace(path, str(bad))


def test_cli_json_steps_and_errors(tmp_path, capsys):
    cfg = OpSynthConfig(dp=2, pp=4, steps=10, cause="slow_worker", where=(1, 3), factor=2.0)
    path, meta, _ = _write(tmp_path, cfg)
    assert main(["check", path, "--meta", meta, "--json", "--steps", "2:6", "--out", str(tmp_path / "o")]) == 0
    d = json.loads(capsys.readouterr().out)
    for k in ("slowdown", "mw", "ms", "by_worker", "by_stage", "by_optype", "stragglers", "imbalanced_stages",
              "verdicts", "replay_error"):
        assert k in d
    assert d["steps"] == [2, 3, 4, 5] and d["stragglers"] == [{"dp_rank": 1, "stage": 3}]
    assert os.path.isfile(d["pictures"]["heatmap"])
    assert main(["check", path, "--no-pictures", "--strict"]) == 1
    out = capsys.readouterr().out
    assert "verdict:" in out and "dp 1 / pp 3" in out
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    assert main(["check", str(junk)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pipeloom: error:" in err and "junk.parquet" in err
    nocol = tmp_path / "nocol.csv"
    nocol.write_text("a,b\n1,2\n")
    assert main(["check", str(nocol)]) == 2
    assert "lacks the op-trace column" in capsys.readouterr().err
    assert main(["check", path, "--steps", "100:200"]) == 2
    assert "none of the steps" in capsys.readouterr().err
    assert main(["check", path, "--png", str(tmp_path / "x.png")]) == 2
    assert "--png applies to worker logs" in capsys.readouterr().err
    assert main(["check", str(tmp_path), "--meta", meta]) == 2  # a log directory: --meta does not apply
    assert "--meta applies to op traces" in capsys.readouterr().err


def test_parquet_with_malformed_rows_counts_them(tmp_path):
    cfg = OpSynthConfig(dp=2, pp=2, steps=4)
    path, _, res = _write(tmp_path, cfg, "m.parquet", malformed=5)
    tr = read_optrace(path)
    assert tr.malformed == 5 and len(tr) == len(res.columns["step"])
    assert {e.split(":")[1].strip().split(" (")[0] for e in tr.examples} >= {"negative duration", "optype missing"}


def test_steps_option_rejects_bad_ranges():
    from pipeloom.trace.ops.opcheck import parse_steps

    assert parse_steps("3:6") == [3, 4, 5] and parse_steps("1,4") == [1, 4]
    for bad in ("6:3", "-1", "a:b", "x"):
        with pytest.raises(ValueError, match="--steps"):
            parse_steps(bad)


def test_unknown_optypes_stay_as_opaque_ops_and_tiny_shapes_work(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    res = generate(OpSynthConfig(dp=1, pp=2, steps=3, cause="none"))
    cols = {k: list(v) for k, v in res.columns.items()}
    n = len(cols["step"])
    for i in range(n):  # a custom op after every optimizer, as long as the optimizer was
        if cols["optype"][i] == "optimizer":
            for k in cols:
                cols[k].append(cols[k][i])
            cols["optype"][-1] = "my-custom-op"
    path = str(tmp_path / "u.parquet")
    pq.write_table(pa.table(cols), path)
    d = check_optrace(path, pictures=False)
    assert any(o["optype"] == "my-custom-op" for o in d["by_optype"])
    assert d["model"]["placement"]["opaque"] == {"my-custom-op": 2 * 3}  # counted and named, not dropped
    assert d["ops"] == n + 2 * 3 and d["verdicts"] == []
    one = generate(OpSynthConfig(dp=1, pp=1, steps=2))
    p1 = str(tmp_path / "one.parquet")
    write(p1, one)
    d1 = check_optrace(p1, pictures=False)
    assert d1["replay_error"] < 1e-9 and d1["verdicts"] == []
