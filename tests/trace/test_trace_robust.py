"""`pipeloom check` and `pipeloom trace` under hostile input (issue 33, the trace classes), and the trace-format
registry (issue 29): one test per class, each failing on the code before its fix.

Classes: pictures written in place (a failed write left a truncated heatmap.png and named no file); any file read
as a worker log; a CSV's UTF-8 BOM taken for part of the first column's name; ``--steps`` matching nothing
answered with every step number; degenerate traces answered with numpy warnings, tables of NaN or a blame on
"costs"; trace keys beyond int64 answered with unrelated messages; outputs written over the inputs.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import warnings

import pytest

from pipeloom import make_spec, plan
from pipeloom.cli import main
from pipeloom.trace.formats import TraceFormat, detect, formats, register, unregister
from pipeloom.trace.ops.synth import OpSynthConfig, generate, write
from pipeloom.trace.synth import SynthConfig, generate as generate_logs, write_logs

sys.path.insert(0, os.path.dirname(__file__))
import dummy_format  # noqa: E402

PY = sys.executable
SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "src"))


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_error_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("pipeloom: error: "), err
    assert "Traceback" not in err and "Warning" not in err
    return lines[0]


@pytest.fixture(scope="module")
def csv_trace(tmp_path_factory):
    """A small clean op trace as CSV: its text, header and path."""
    d = tmp_path_factory.mktemp("ops")
    path = write(str(d / "t.csv"), generate(OpSynthConfig(dp=2, pp=2, steps=4, seed=1)))
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    return path, text


def _edit(tmp_path, text: str, name: str, column: str, fn) -> str:
    """A copy of the CSV ``text`` whose ``column`` values go through ``fn(row index, value)``."""
    lines = text.splitlines()
    hdr = [h.strip('"') for h in lines[0].split(",")]
    i = hdr.index(column)
    out = [lines[0]]
    for k, line in enumerate(lines[1:]):
        cells = line.split(",")
        cells[i] = fn(k, cells[i])
        out.append(",".join(cells))
    p = tmp_path / name
    p.write_text("\n".join(out) + "\n", encoding="utf-8")
    return str(p)


# ------------------------------------------------------------------------------- the format registry
def test_a_new_format_is_one_file_and_one_registration(tmp_path, capsys):
    """tests/trace/dummy_format.py (sniff + read into the run model) and one register() line: check and trace
    read it like any other input; without the registration the file is refused with the accepted formats."""
    sched = plan("1f1b", make_spec(pp=4, microbatches=8, costs="F=1,B=1,W=1,comm=0.1"))
    path = dummy_format.write(str(tmp_path / "run.jobs.tsv"),
                              generate_logs(sched, SynthConfig(slow={2: 1.7}, profile_steps=(0, 4), extra_steps=0)))
    rc, _, err = run(capsys, "check", path)
    assert rc == 2 and "op-trace:" in one_error_line(err) and "pipeloom-logs:" in err
    register(dummy_format.DUMMY)
    try:
        assert detect(path) is dummy_format.DUMMY and formats()[-1] is dummy_format.DUMMY
        rc, out, _ = run(capsys, "check", path, "--json", "--out", str(tmp_path / "w"))
        d = json.loads(out)
        assert rc == 0 and d["format"] == "dummy-jobs" and d["stragglers"] == [2] and d["steps"] == [0, 1, 2, 3]
        assert d["whatif"]["stragglers"] == [{"dp_rank": 0, "stage": 2}] or 2 in d["imbalanced_stages"]
        rc, out, _ = run(capsys, "trace", path, "--out", str(tmp_path / "t.json"))
        assert rc == 0 and "wrote" in out and json.loads((tmp_path / "t.json").read_text())["traceEvents"]
        with pytest.raises(ValueError, match="registered already"):
            register(dummy_format.DUMMY)
    finally:
        unregister("dummy-jobs")
    with pytest.raises(ValueError, match="level"):
        TraceFormat("x", "y", sniff=lambda p: False, read=lambda p, meta=None: None, level="rows")


# ------------------------------------------------------------------------------- 1. pictures in place
def test_a_failed_picture_write_keeps_the_old_picture_and_names_it(tmp_path, csv_trace):
    """Under a file-size limit below the heatmap's size: the earlier heatmap.png stays whole and the error names
    it (before: savefig wrote in place, leaving a truncated picture, and the message named no file)."""
    path, _ = csv_trace
    out = tmp_path / "out"
    assert main(["check", path, "--out", str(out)]) == 0
    old = (out / "heatmap.png").read_bytes()
    limit = len(old) // 2

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    p = subprocess.run([PY, "-m", "pipeloom", "check", path, "--out", str(out), "--steps", "0:3"],
                       capture_output=True, text=True, preexec_fn=limited, timeout=300,
                       env=dict(os.environ, PYTHONPATH=SRC))
    assert p.returncode == 2, p.stderr
    assert "heatmap.png" in one_error_line(p.stderr)
    assert (out / "heatmap.png").read_bytes() == old
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]


# ------------------------------------------------------------------------------- 2. any file as a worker log
def test_trace_refuses_a_file_no_format_reads(tmp_path, capsys, csv_trace):
    junk = tmp_path / "notes.txt"
    junk.write_text("step 1 took 3 s\nall good\n")
    rc, _, err = run(capsys, "trace", str(junk), "--out", str(tmp_path / "t.json"))
    line = one_error_line(err)
    assert rc == 2 and "notes.txt" in line and "workerlog.<rank>" in line and "torch profiler" in line
    rc, _, err = run(capsys, "trace", csv_trace[0], "--out", str(tmp_path / "t.json"))
    assert rc == 2 and "pipeloom check" in one_error_line(err)  # an op trace: check draws its timeline
    assert not (tmp_path / "t.json").exists()


# ------------------------------------------------------------------------------- 3. a CSV with a BOM
def test_a_csv_with_a_utf8_bom_is_read(tmp_path, capsys, csv_trace):
    path, text = csv_trace
    bom = tmp_path / "bom.csv"
    bom.write_text("\ufeff" + text, encoding="utf-8")
    rc, out, err = run(capsys, "check", str(bom), "--json", "--no-pictures")
    assert rc == 0, err
    rc, ref, _ = run(capsys, "check", path, "--json", "--no-pictures")
    assert json.loads(out)["slowdown"] == json.loads(ref)["slowdown"] and json.loads(out)["malformed_rows"] == 0


# ------------------------------------------------------------------------------- 4. --steps matching nothing
@pytest.mark.parametrize("steps,want", [("100:200", "none of the steps"), ("1000000:", "none of the steps"),
                                        ("1,100", "step(s) 100 are not")])
def test_steps_that_match_nothing_are_refused_with_the_steps_there_are(capsys, csv_trace, steps, want):
    rc, _, err = run(capsys, "check", csv_trace[0], "--no-pictures", "--steps", steps)
    line = one_error_line(err)
    assert rc == 2 and want in line and line.endswith("it has steps 0..3") and len(line) < 200


def test_steps_on_run_logs_too(tmp_path, capsys):
    d = str(tmp_path / "logs")
    write_logs(d, plan("1f1b", make_spec(pp=2, microbatches=4)), SynthConfig())
    rc, _, err = run(capsys, "check", d, "--no-pictures", "--steps", "10:1000")
    assert rc == 2 and one_error_line(err).endswith("it has steps 3..4")


# ------------------------------------------------------------------------------- 5. degenerate traces
@pytest.mark.parametrize("column,fn,want", [
    ("duration", lambda k, v: "0", "of 352 ops last 0 ms"),
    ("duration", lambda k, v: "1e300" if k == 5 else v, "lasts 1e+300 ms"),
    ("start_ts", lambda k, v: "1e300" if k == 7 else v, "spans 1e+300 ms"),
    ("optype", lambda k, v: '"op%d"' % (k % 3), "none of its op types (op0, op1, op2)"),
])
def test_a_degenerate_trace_is_refused_by_what_is_wrong(tmp_path, capsys, csv_trace, column, fn, want):
    """One line naming the file and what is wrong, and no numpy warning on the way; never NaN tables, a
    300-digit slowdown or 'scale the costs down'."""
    path = _edit(tmp_path, csv_trace[1], "bad.csv", column, fn)
    for extra in ([], ["--json"]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rc, out, err = run(capsys, "check", path, "--no-pictures", *extra)
        line = one_error_line(err)
        assert rc == 2 and want in line and "bad.csv" in line and "costs" not in line, err
        assert out == "" and not [w for w in caught if issubclass(w.category, RuntimeWarning)]


# ------------------------------------------------------------------------------- 6. keys beyond int64
@pytest.mark.parametrize("column,value", [("step", "9223372036854775808"), ("rank", "1e30"),
                                          ("mb_id", "9.2e18"), ("dp_rank", "1e19")])
def test_a_key_too_large_for_an_index_is_a_malformed_row(tmp_path, capsys, csv_trace, column, value):
    path = _edit(tmp_path, csv_trace[1], "big.csv", column, lambda k, v: value if k == 3 else v)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc, out, err = run(capsys, "check", path, "--no-pictures", "--json")
    assert rc == 0 and not [w for w in caught if issubclass(w.category, RuntimeWarning)], err
    d = json.loads(out)
    assert d["malformed_rows"] == 1 and f"{column} above 2147483647" in d["malformed_examples"][0]


def test_a_worker_log_key_too_large_for_an_index_is_a_malformed_line(tmp_path, capsys):
    d = tmp_path / "logs"
    write_logs(str(d), plan("1f1b", make_spec(pp=2, microbatches=4)), SynthConfig(profile_steps=(1, 4)))
    for rank, key, value in ((0, "mb", 10 ** 30), (1, "step", 10 ** 25), (1, "chunk", 2 ** 63)):
        p = d / f"workerlog.{rank}"
        lines = p.read_text().splitlines()
        i = next(k for k, line in enumerate(lines) if '"job"' in line and json.loads(line)["step"] == 1
                 and f'"{key}": {value}' not in line)  # all in step 1: the check leaves that step out
        ev = json.loads(lines[i])
        ev[key] = value
        lines[i] = json.dumps(ev)
        p.write_text("\n".join(lines) + "\n")
    (d / ("workerlog." + "9" * 20)).write_text("{}\n")  # a rank too large for an index: not a worker log's name
    rc, out, err = run(capsys, "check", str(d), "--json", "--no-pictures")
    assert rc == 0, err
    rep = json.loads(out)
    assert rep["malformed_lines"] == 3 and rep["steps"] == [2, 3] and rep["whatif"] is not None


# ------------------------------------------------------------------------------- 7. outputs over inputs
def test_outputs_never_replace_or_join_the_inputs(tmp_path, capsys):
    d = tmp_path / "logs"
    write_logs(str(d), plan("1f1b", make_spec(pp=2, microbatches=4)), SynthConfig())
    log0 = (d / "workerlog.0").read_bytes()
    for argv in (["check", str(d), "--png", str(d / "workerlog.0")],
                 ["check", str(d), "--out", str(d)],
                 ["check", str(d), "--out", str(d / "whatif")],
                 ["trace", str(d), "--out", str(d / "workerlog.0"), "--no-plan"],
                 ["trace", str(d / "workerlog.0"), "--png", str(d / "workerlog.0")]):
        rc, _, err = run(capsys, *argv)
        assert rc == 2 and str(d) in one_error_line(err), argv
    assert (d / "workerlog.0").read_bytes() == log0 and sorted(os.listdir(d)) == ["workerlog.0", "workerlog.1"]


def test_the_meta_file_is_an_input_too(tmp_path, capsys, csv_trace):
    out = tmp_path / "out"
    out.mkdir()
    meta = out / "layer-costs.json"
    meta.write_text('{"dp_size": 2, "pp_size": 2}')
    rc, _, err = run(capsys, "check", csv_trace[0], "--meta", str(meta), "--out", str(out))
    assert rc == 2 and "layer-costs.json is an input" in one_error_line(err)
    assert meta.read_text() == '{"dp_size": 2, "pp_size": 2}' and os.listdir(out) == ["layer-costs.json"]


def _torch_like_traces(out_dir, pp=2, m=4) -> list[str]:
    """Chrome traces with the spans torch's pipelining runtime records (``PP:<stage><F|I|W|B><mb>``, µs), one per
    rank, timed by the synthetic run of a 1F1B plan."""
    events = generate_logs(plan("1f1b", make_spec(pp=pp, microbatches=m)), SynthConfig(profile_steps=(0, 1),
                                                                                       extra_steps=0))
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for rank, evs in events.items():
        spans = [{"ph": "X", "name": f"PP:{e['chunk']}{dict(F='F', B='I', W='W', BW='B')[e['kind']]}{e['mb']}",
                  "ts": e["start"] * 1e6, "dur": (e["end"] - e["start"]) * 1e6, "pid": 0, "tid": 0}
                 for e in evs if e["event"] == "job"]
        paths.append(os.path.join(out_dir, f"rank{rank}_trace.json"))
        with open(paths[-1], "w") as fh:
            json.dump({"traceEvents": spans, "distributedInfo": {"rank": rank}}, fh)
    return paths


def test_a_torch_trace_is_not_overwritten_nor_joined_by_the_outputs(tmp_path, capsys):
    """A torch trace is a .json like the trace `pipeloom trace` writes (it was overwritten); the check's
    timeline.perfetto.json is a Chrome trace too (written among torch traces it was read as one more rank's next
    time)."""
    tdir = tmp_path / "prof"
    paths = _torch_like_traces(str(tdir))
    before = {p: open(p, "rb").read() for p in paths}
    assert main(["check", str(tdir), "--no-pictures"]) == 0  # the traces are readable
    capsys.readouterr()
    for argv in (["trace", paths[0], "--out", paths[0]], ["trace", str(tdir), "--out", paths[1]],
                 ["check", str(tdir), "--out", str(tdir / "x")], ["check", str(tdir), "--out", str(tdir)]):
        rc, _, err = run(capsys, *argv)
        assert rc == 2 and str(tdir) in one_error_line(err), argv
    assert {p: open(p, "rb").read() for p in paths} == before and sorted(os.listdir(tdir)) == [
        "rank0_trace.json", "rank1_trace.json"]
