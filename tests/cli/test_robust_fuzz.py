"""Fuzz tier (issue 21): every command's numbers and file inputs, extreme and malformed.

The contract checked on every example: exit 0 (or 1: a valid answer that says "invalid schedule")
with, under --json, one strict JSON object whose numbers are finite; or exit 2 with exactly one line
``pipeloom: error: ...``. Never a traceback, never exit 3 (pipeloom's "internal error, please report").
Hypothesis runs derandomized with bounded examples (the tier takes well under a minute); the inputs
that could exhaust memory run in a child process under RLIMIT_AS and a time limit.
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pipeloom.cli import main
from pipeloom.schedule import registry

def fuzz(n: int):
    """Derandomized, ``n`` examples, no example database (the same examples every run)."""
    return settings(derandomize=True, deadline=None, database=None, max_examples=n,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "src"))

# numbers: the ordinary small ones, and the absurd ones every cap must refuse
SMALL = [1, 2, 3, 4]
ABSURD = [0, -1, 10**7, 10**9, 10**18, 2**63]
NUM_TEXT = st.sampled_from(["0", "1", "2.5", "-1", "1e12", "1e13", "1e308", "nan", "inf", "-inf", "abc", "", "1e-300",
                            "0x10", "1_000"])


def _finite(obj) -> bool:
    if isinstance(obj, float):
        return math.isfinite(obj)
    if isinstance(obj, dict):
        return all(_finite(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(_finite(v) for v in obj)
    return True


def check_outcome(argv, capsys, *, json_out: bool):
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:  # argparse
        rc = e.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out, (argv, err)
    assert rc in (0, 1, 2), (argv, rc, err)
    if rc == 2:
        lines = [x for x in err.splitlines() if x.strip()]
        assert len(lines) == 1 and lines[0].startswith("pipeloom: error: "), (argv, err)
        assert out == "", (argv, out)
    elif json_out:
        obj = json.loads(out, parse_constant=lambda c: pytest.fail(f"{argv}: non-strict JSON constant {c}"))
        assert isinstance(obj, dict) and _finite(obj), (argv, out[:300])
    return rc


def costs_text():
    item = st.tuples(st.sampled_from(["F", "B", "W", "comm", "overlap", "X"]), NUM_TEXT)
    return st.lists(item, min_size=0, max_size=4).map(lambda xs: ",".join(f"{k}={v}" for k, v in xs))


MEM_LIMITS = st.sampled_from(["none", "1p", "1.5p", "2p", "0.1p", "-1p", "0", "-3", "1e308", "inf", "nan", "abc",
                              "3", "1e-9"])
OPTIONS = st.sampled_from([[], ["-O", "polish=0"], ["-O", "polish=1e9"], ["-O", "polish=-1"], ["-O", "budget=1e18"],
                           ["-O", "insert_budget=1e18"], ["-O", "time_limit=0.2"], ["-O", "time_limit=1e9"],
                           ["-O", "placement=zigzag"], ["-O", "remainder=last"], ["-O", "x=1"], ["-O", "noequals"]])
SCHEDULES = st.sampled_from([n for n in registry.names()] + ["nope", "torch:1f1b"])


@st.composite
def planning_argv(draw):
    pp = draw(st.sampled_from(SMALL + ABSURD))
    m = draw(st.sampled_from(SMALL + [6, 8] + ABSURD))
    argv = ["--pp", pp, "-m", m]
    if draw(st.booleans()):
        argv += ["--vpp", draw(st.sampled_from([1, 2, 3, 0, 2000]))]
    if draw(st.booleans()):
        argv += ["--costs", draw(costs_text())]
    if draw(st.booleans()):
        argv += ["--mem-limit", draw(MEM_LIMITS)]
    if draw(st.booleans()):
        argv += ["--layers", draw(st.sampled_from([4, 8, 16, 0, 10**9]))]
    return argv


@fuzz(120)
@given(schedule=SCHEDULES, rest=planning_argv(), opts=OPTIONS)
def test_fuzz_simulate_numbers(capsys, schedule, rest, opts):
    if schedule == "optimal" and "-O" not in opts:
        opts = ["-O", "time_limit=0.2"]
    check_outcome(["simulate", "-s", schedule, *rest, *opts, "--json"], capsys, json_out=True)


@fuzz(40)
@given(schedule=SCHEDULES, rest=planning_argv(), ext=st.sampled_from([".json", ".csv", ".txt"]))
def test_fuzz_plan_numbers(capsys, tmp_path, schedule, rest, ext):
    argv = ["plan", "-s", schedule, *rest, "--out", str(tmp_path / f"p{ext}"), "--json"]
    if schedule == "optimal":
        argv += ["-O", "time_limit=0.2"]
    check_outcome(argv, capsys, json_out=True)


@fuzz(40)
@given(pp=st.sampled_from(SMALL + ABSURD), layers=st.sampled_from([4, 8, 12, 0, 10**9]),
       balance=st.sampled_from([[], ["--balance", "bottleneck"], ["--balance", "makespan"]]),
       costs=costs_text(), lim=MEM_LIMITS, evals=st.sampled_from([5, 0, 10**12]))
def test_fuzz_partition_numbers(capsys, pp, layers, balance, costs, lim, evals):
    check_outcome(["partition", "--pp", pp, "--layers", layers, *balance, "--costs", costs, "--mem-limit", lim,
                   "--max-evals", evals, "--json"], capsys, json_out=True)


@fuzz(30)
@given(pp=st.sampled_from([2, 4] + ABSURD), m=st.sampled_from([4, 8] + ABSURD),
       model=st.sampled_from(["llama2-7b", "gpt3-125m", "nope"]),
       extra=st.sampled_from([[], ["--tp", "0"], ["--tp", "3"], ["--gpu-memory", "-1"], ["--gpu-memory", "1e400"],
                              ["--seq", "10**9"], ["--micro-batch", "1000000000"], ["--mem-limit", "-1p"]]))
def test_fuzz_memory_numbers(capsys, pp, m, model, extra):
    check_outcome(["memory", "--model", model, "--pp", pp, "-m", m, *extra, "--json"], capsys, json_out=True)


@fuzz(8)
@given(pp=st.sampled_from([2, 3] + ABSURD), m=st.sampled_from([2, 4] + ABSURD), costs=costs_text(), lim=MEM_LIMITS,
       vpp=st.sampled_from([[], ["--vpp", "1"], ["--vpp", "0"], ["--vpp", "5000"]]))
def test_fuzz_compare_numbers(capsys, pp, m, costs, lim, vpp):
    check_outcome(["compare", "--pp", pp, "-m", m, *vpp, "--costs", costs, "--mem-limit", lim, "--json"], capsys,
                  json_out=True)


# ---------------------------------------------------------------------- file inputs
def _schedule_texts():
    good = ('{"format": "pipeloom-schedule/1", "name": "x", "pp": 2, "vpp": 1, "microbatches": 2, '
            '"placement": "interleaved", "devices": [["F0.0","F1.0","BW0.0","BW1.0"],["F0.1","BW0.1","F1.1","BW1.1"]]}')
    mutations = st.sampled_from([
        lambda s: s, lambda s: s.replace('"pp": 2', '"pp": 1e308'), lambda s: s.replace('"pp": 2', '"pp": "2"'),
        lambda s: s.replace('"microbatches": 2', '"microbatches": 10000000000'),
        lambda s: s.replace('"devices": [', '"devices": [[[[[[['), lambda s: s.replace("F1.0", "F9.9"),
        lambda s: s.replace("BW0.0", "Q0.0"), lambda s: s[: len(s) // 2], lambda s: "\ufeff" + s,
        lambda s: s.replace('"placement": "interleaved"', '"placement": "zigzag"'),
        lambda s: "[" * 50_000, lambda s: "device,step,job\n0,0,F0.0\n", lambda s: "device,step,job\n",
        lambda s: "device,step,job\n0,0," + "F" * 200_000 + "\n", lambda s: "", lambda s: "\x00\x01\x02" * 100,
        lambda s: s.replace('"name": "x"', '"name": ' + '"n' * 10 + '"'),
    ])
    return mutations.map(lambda f: f(good))


@fuzz(40)
@given(text=_schedule_texts(), ext=st.sampled_from([".json", ".csv"]),
       cmd=st.sampled_from(["show", "convert", "run-plan"]))
def test_fuzz_schedule_files(capsys, tmp_path, text, ext, cmd):
    f = tmp_path / f"s{ext}"
    f.write_text(text, encoding="utf-8", errors="surrogateescape")
    if cmd == "show":
        check_outcome(["show", f, "--width", "60"], capsys, json_out=False)
    elif cmd == "convert":
        check_outcome(["convert", "--to", "torch", f, tmp_path / "o.csv"], capsys, json_out=False)
    else:  # only up to the plan's checks: a valid plan would start ranks, so give an option it refuses with
        check_outcome(["run", "--plan", f, "--pp", "2"], capsys, json_out=False)


@fuzz(40)
@given(rows=st.lists(st.tuples(st.sampled_from(["l", "head", "embedding", ""]), NUM_TEXT, NUM_TEXT),
                     min_size=0, max_size=6),
       header=st.sampled_from(["name,F,mem", "name,F,F", "F", "name,B", "name,F,mem,zz"]),
       cmd=st.sampled_from(["partition", "simulate"]))
def test_fuzz_layer_cost_files(capsys, tmp_path, rows, header, cmd):
    f = tmp_path / "lc.csv"
    f.write_text(header + "\n" + "".join(f"{n}{i if n == 'l' else ''},{a},{b}\n" for i, (n, a, b) in enumerate(rows)))
    argv = (["partition", "--pp", "2"] if cmd == "partition" else ["simulate", "-s", "1f1b", "--pp", "2", "-m", "4"])
    check_outcome([*argv, "--layer-costs", f, "--json"], capsys, json_out=True)


@pytest.fixture(scope="module")
def log_lines(tmp_path_factory):
    from pipeloom import make_spec, plan
    from pipeloom.trace.synth import SynthConfig, write_logs

    d = tmp_path_factory.mktemp("logs")
    write_logs(str(d), plan("1f1b", make_spec(pp=2, microbatches=2)), SynthConfig(profile_steps=(1, 2)))
    return {p.name: p.read_text().splitlines() for p in d.iterdir()}


FIELD_VALUES = st.sampled_from([0, -1, 1e308, -1e308, 1.5, "x", None, [], {}, 10**30, True, "1f1b"])


@pytest.mark.slow
@fuzz(40)
@given(edits=st.lists(st.tuples(st.integers(0, 40), st.sampled_from(["start", "end", "t", "step", "mb", "chunk",
                                                                     "kind", "schedule", "rank", "world_size",
                                                                     "event", "pp"]), FIELD_VALUES),
                      min_size=1, max_size=4),
       drop=st.integers(-1, 40), cmd=st.sampled_from(["check", "trace"]))
def test_fuzz_worker_logs(capsys, tmp_path, log_lines, edits, drop, cmd):
    import tempfile

    d = Path(tempfile.mkdtemp(dir=tmp_path))  # one directory per example (tmp_path is shared by them)
    for name, lines in log_lines.items():
        evs = [json.loads(x) for x in lines]
        for i, key, val in edits:
            if i < len(evs) and name.endswith("1"):
                evs[i][key] = val
        if 0 <= drop < len(evs):
            del evs[drop]
        (d / name).write_text("".join(json.dumps(e) + "\n" for e in evs))
    argv = ["check", d, "--json"] if cmd == "check" else ["trace", d, "-o", tmp_path / "t.json"]
    check_outcome(argv, capsys, json_out=cmd == "check")


# ---------------------------------------------------------------------- under a memory cap, in a child process
CAPPED = [
    ["simulate", "-s", "1f1b", "--pp", "4", "-m", "10000000", "--json"],
    ["simulate", "-s", "1f1b", "--pp", "65536", "-m", "1000000", "--json"],
    ["simulate", "-s", "1f1b", "--pp", "1000000000", "-m", "2", "--mem-limit", "1p", "--json"],  # sized before
    ["partition", "--pp", "4", "--layers", "1000000000", "--json"],
    ["simulate", "-s", "zbv", "--pp", "4", "-m", "8", "-O", "insert_budget=1e18", "--json"],
    ["show", "{deep}"],
    ["show", "{huge_header}"],
    ["partition", "--pp", "2", "--layer-costs", "{count}", "--json"],
]


@pytest.mark.parametrize("argv", CAPPED, ids=[" ".join(a[:3]) + " " + a[-2] for a in CAPPED])
def test_refusals_under_a_memory_cap(tmp_path, argv):
    files = {"deep": ("deep.json", '{"devices": ' + "[" * 200_000 + "]" * 200_000 + "}"),
             "huge_header": ("h.csv", "# pipeloom schedule name=x pp=1000000 vpp=1000 microbatches=1000000\n"
                                      "device,step,job\n0,0,F0.0\n"),
             "count": ("c.json", '{"layers": {"count": 1000000000000, "F": 1}}')}
    args = []
    for a in argv:
        if a.startswith("{"):
            name, text = files[a[1:-1]]
            (tmp_path / name).write_text(text)
            a = str(tmp_path / name)
        args.append(a)
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30));"
            "from pipeloom.cli import main; sys.exit(main(sys.argv[1:]))")
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=60)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("pipeloom: error: "), (p.returncode, p.stderr)
    assert p.stdout == ""
