"""Bounded, honest and intact under hostile input (issue 33): one test per class, each failing on the code
before its fix.

Whole commands run in a subprocess under a 3 GB address-space limit and a file-size limit (the "proof" of
docs/robustness.md): every input too big, absurd or of the wrong kind ends in exit 2 and one line naming the
file or option, within seconds, the earlier outputs intact, stdout the same with stderr closed.
"""
import json
import os
import resource
import subprocess
import sys
import time

import pytest

from pipeloom.cli import main

PY = sys.executable
SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
CONFIGS = os.path.join(SRC, "pipeloom", "models", "hf_configs")
GB = 10**9


def _limits(fsize: int = 64 * 2**20):
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (3 * GB, 3 * GB))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    return apply


def cli(*argv, cwd=None, timeout=60, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec=None):
    """(exit code, stdout, stderr, seconds) of a whole ``pipeloom`` command under the memory and file limits."""
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.monotonic()
    p = subprocess.run([PY, "-m", "pipeloom", *argv], stdout=stdout, stderr=stderr, env=env, cwd=cwd,
                       timeout=timeout, preexec_fn=preexec or _limits(), text=True)
    return p.returncode, p.stdout or "", p.stderr or "", time.monotonic() - t0


def one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("pipeloom: error: "), err
    return lines[0]


def run_in(capsys, *argv):
    try:
        rc = main(list(argv))
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def plan_file(tmp_path):
    p = tmp_path / "p.json"
    assert main(["plan", "-s", "1f1b", "--pp", "2", "-m", "4", "-o", str(p)]) == 0
    return p


def _sparse(path, size: int) -> str:
    with open(path, "wb") as f:
        f.truncate(size)  # a hole: no disk, no time
    return str(path)


# ---------------------------------------------------------------------- 1. every reader is bounded
def _hostile_inputs(tmp_path) -> dict:
    """name -> path of an input that no reader may read whole (or block on)."""
    zero = tmp_path / "zero.json"
    os.symlink("/dev/zero", zero)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    d = tmp_path / "dir.json"
    d.mkdir()
    return {"a link to /dev/zero": str(zero), "a FIFO": str(fifo), "a directory": str(d),
            "a 20 GB weights file": _sparse(tmp_path / "model.safetensors.json", 20 * GB)}


READERS = {  # reader -> the command line with {} for the file
    "schedule file (show)": ["show", "{}"],
    "schedule file (simulate --plan)": ["simulate", "--plan", "{}", "--json"],
    "model config (memory --model)": ["memory", "--model", "{}", "--pp", "2", "-m", "4"],
    "model config (tune --model)": ["tune", "--model", "{}", "--gpus", "8", "--global-batch", "8"],
    "calibration file (tune --calibration)": ["tune", "--model", "llama2-7b", "--gpus", "8", "--global-batch", "8",
                                              "--calibration", "{}"],
    "layer-cost file (partition --layer-costs)": ["partition", "--pp", "2", "--layer-costs", "{}"],
    "settings file (plan --config)": ["plan", "--config", "{}"],
}


@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_refuses_unbounded_or_special_files(tmp_path, reader):
    for kind, path in _hostile_inputs(tmp_path).items():
        rc, out, err, secs = cli(*[a.replace("{}", path) for a in READERS[reader]], timeout=60)
        line = one_line(err)
        assert rc == 2 and out == "", (kind, rc, err)
        assert path in line, (kind, line)  # the file is named
        assert secs < 30, (kind, secs)


def test_the_bounded_reader_says_what_is_wrong(tmp_path):
    from pipeloom.core.files import InputFileError, load_json, read_input
    from pipeloom.core.limits import MAX_FILE_BYTES

    big = _sparse(tmp_path / "big.json", MAX_FILE_BYTES["model config"] + 1)
    with pytest.raises(InputFileError, match=r"big.json is 16 MiB, over the cap of 16 MiB for a model config"):
        read_input(big, "model config")
    bad = tmp_path / "latin1.json"
    bad.write_bytes(b'{"name": "caf\xe9"}')
    with pytest.raises(InputFileError, match=r"latin1.json: not a text file \(not UTF-8: byte 0xe9 at offset 13; a calibration file"):
        read_input(bad, "calibration file")
    cases = {"deep.json": "[" * 100_000 + "]" * 100_000, "digits.json": '{"efficiency": 1' + "0" * 5000 + "}",
             "twice.json": '{"efficiency": 0.5, "efficiency": 0.6}', "broken.json": '{"efficiency": '}
    words = {"deep.json": "nested too deeply", "digits.json": "too many digits", "twice.json": "given twice",
             "broken.json": "not valid JSON"}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(InputFileError) as e:
            load_json(tmp_path / name, "calibration file")
        assert str(e.value).startswith(f"calibration file {tmp_path / name}:") and words[name] in str(e.value)


def test_model_and_calibration_format_errors_name_the_file(tmp_path, capsys):
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 50_000 + "]" * 50_000)
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"model_type": "llama", "x": "\xff"}')
    digits = tmp_path / "digits.json"
    digits.write_text('{"devices": [], "pp": 1' + "0" * 5000 + "}")
    for argv, path in ((["memory", "--model", str(nested), "--pp", "2", "-m", "4"], nested),
                       (["memory", "--model", str(latin), "--pp", "2", "-m", "4"], latin),
                       (["tune", "--model", "llama2-7b", "--gpus", "8", "--global-batch", "8", "--calibration",
                         str(latin)], latin),
                       (["show", str(digits)], digits)):
        rc, out, err = run_in(capsys, *argv)
        assert rc == 2 and out == ""
        line = one_line(err)
        assert str(path) in line, line


# ---------------------------------------------------------------------- 3. run --model is checked first
@pytest.mark.slow  # imports torch: about 5 s alone, 15 s on a loaded machine
def test_run_model_too_big_for_the_machine_is_refused_before_any_rank(tmp_path):
    cfg = json.load(open(os.path.join(CONFIGS, "Llama-2-7b.json")))
    cfg.update(hidden_size=16384, intermediate_size=53248, num_attention_heads=128, num_key_value_heads=8,
               num_hidden_layers=200)  # ~650 B parameters: 2.6 TB for one fp32 copy, more than any test machine
    path = tmp_path / "huge" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    rc, out, err, secs = cli("run", "--model", str(path.parent), "--pp", "2", "-m", "2", "--steps", "1",
                             timeout=120)
    line = one_line(err)
    assert rc == 2 and out == ""
    assert "GiB" in line and "available" in line and "of its layers fit" in line or "not even one layer" in line


def test_model_memory_estimate_and_what_fits():
    from pipeloom.cli import CLIError
    from pipeloom.cli.run_cmd import check_model_memory
    from pipeloom.models.flops import total_params
    from pipeloom.models.hf_config import from_hf_config

    m = from_hf_config(os.path.join(CONFIGS, "Llama-2-7b.json"))
    p = total_params(m)
    # 2 ranks each build a fp32 copy (4 B/param), one replica trains it (12 B/param): 20 B/param
    assert check_model_memory(m, pp=2, dp=1, available=10**15) == 20 * p
    with pytest.raises(CLIError, match=r"2 ranks building it need about [\d,.]+ GiB here .* but 24\.0 GiB is "
                                       r"available: at most \d+ of its layers fit \(it has 32\)"):
        check_model_memory(m, pp=2, dp=1, available=24 * 2**30)
    with pytest.raises(CLIError, match="not even one layer"):
        check_model_memory(m, pp=4, dp=2, available=2**30)


# ---------------------------------------------------------------------- 5. an output equal to an input
def test_an_output_that_is_an_input_is_refused_before_any_work(tmp_path, plan_file, capsys, monkeypatch):
    from pipeloom.cli import run_cmd

    before = plan_file.read_bytes()
    link = tmp_path / "link.json"
    os.symlink(plan_file, link)
    hard = tmp_path / "hard.json"
    os.link(plan_file, hard)
    monkeypatch.setattr(run_cmd, "run", lambda args: pytest.fail("the run started"))
    cases = [["run", "--plan", str(plan_file), "--calibrate", str(plan_file)],
             ["run", "--plan", str(link), "--calibrate", str(plan_file)],
             ["convert", str(plan_file), str(hard), "--to", "pipeloom"],
             ["convert", str(plan_file), str(link), "--to", "pipeloom"],
             ["show", str(plan_file), "--out", str(tmp_path / "a.png"), "--out", str(tmp_path / "." / "a.png")]]
    for argv in cases:
        rc, out, err = run_in(capsys, *argv)
        line = one_line(err)
        assert rc == 2 and out == "", argv
        assert "give another path" in line or "give each its own path" in line, line
        assert plan_file.read_bytes() == before
    assert not (tmp_path / "a.png").exists()


def test_an_output_that_cannot_be_written_is_found_before_the_work(tmp_path, capsys, monkeypatch):
    from pipeloom.cli import tune_cmd

    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setattr(tune_cmd, "run", lambda args: pytest.fail("the search started"))
    rc, out, err = run_in(capsys, "tune", "--model", "llama2-7b", "--gpus", "8", "--global-batch", "8",
                          "--out", str(blocker / "plan"))
    assert rc == 2 and f"--out '{blocker / 'plan'}': {blocker} is a file, not a directory" in one_line(err)


# ---------------------------------------------------------------------- 9. caps on every size, up front
@pytest.mark.slow  # six whole commands: about 10 s on a loaded machine
def test_sizes_are_capped_up_front_the_same_in_every_command(tmp_path):
    cfg = json.load(open(os.path.join(CONFIGS, "Llama-2-7b.json")))
    cfg["num_hidden_layers"] = 2_000_000
    big = tmp_path / "big.json"
    big.write_text(json.dumps(cfg))
    cases = [(["tune", "--model", "llama2-7b", "--gpus", str(10**12), "--global-batch", "8"], "--gpus"),
             (["tune", "--model", "llama2-7b", "--gpus", "8", "--global-batch", "8", "--top", str(10**9)], "--top"),
             (["tune", "--model", "llama2-7b", "--gpus", "8", "--global-batch", "8", "--workers", str(10**6)],
              "--workers"),
             (["tune", "--model", str(big), "--gpus", "8", "--global-batch", "8"], "num_hidden_layers"),
             (["simulate", "--model", str(big), "--pp", "4", "-m", "8", "-s", "1f1b"], "num_hidden_layers"),
             (["plan", "-s", "zbvpp", "--pp", "2", "-m", "4", "-O", "budget=" + str(10**14)], "budget")]
    for argv, word in cases:
        rc, out, err, secs = cli(*argv, timeout=60)
        line = one_line(err)
        assert rc == 2 and word in line and "cap" in line, (argv, line)
        assert secs < 30, (argv, secs)


def test_every_numeric_builder_option_has_a_cap():
    from pipeloom.schedule import registry

    uncapped = [f"{n} -O {o.name}" for n in registry.names() for o in registry.get(n).options
                if o.type in ("int", "float") and o.max is None]
    assert uncapped == []


def test_divisors_factor_instead_of_counting():
    from pipeloom.tune.gpus import divisors

    t0 = time.perf_counter()
    assert divisors(10**12)[:6] == [1, 2, 4, 5, 8, 10] and len(divisors(10**12)) == 169
    assert time.perf_counter() - t0 < 5
    assert divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36] and divisors(1) == [1] and divisors(97) == [1, 97]


# ---------------------------------------------------------------------- 11. stdout does not depend on stderr
def test_stdout_and_exit_code_do_not_depend_on_stderr():
    argv = ["simulate", "-s", "1f1b", "--pp", "2", "-m", "4", "--json"]
    rc, ref, _, _ = cli(*argv)
    assert rc == 0 and json.loads(ref)["makespan"] > 0

    def closed():
        _limits()()
        os.close(2)
    rc, out, _, _ = cli(*argv, stderr=None, preexec=closed)
    assert (rc, out) == (0, ref)
    with open("/dev/full", "w") as full:
        rc, out, _, _ = cli("--progress", *argv, stderr=full)
    assert (rc, out) == (0, ref)
    rc, out, _, _ = cli("simulate", "-s", "1f1b", "--pp", "0", "-m", "4", "--json", stderr=None, preexec=closed)
    assert rc == 2 and out == ""  # the error is not printed on stdout instead
    rc, out, _, _ = cli("show", "/nonexistent.json", stderr=None, preexec=closed)
    assert rc == 2 and out == ""


# ---------------------------------------------------------------------- 12. messages that say what is wrong
def test_messages_name_the_option_or_file(tmp_path, capsys):
    t = tmp_path / "bad_torch.csv"
    t.write_text("0X0,0F1\n1F0\n")
    dup = tmp_path / "dup.json"
    dup.write_text('{"efficiency": 0.5, "efficiency": 0.6}')
    fast = tmp_path / "fast.json"
    fast.write_text(json.dumps({"achieved_flops": 2e15, "device": {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}}))
    tune = ["tune", "--model", "llama2-7b", "--global-batch", "64", "--gpus", "8"]
    cases = [(["show", str(t)], "cannot read torch action '0X0'"),
             (tune + ["--gpu-flops", "1e-300"], "--gpu-flops = 1e-300 is outside the plausible range"),
             (tune + ["--inter-bw", "1e-300"], "--inter-bw = 1e-300 is outside the plausible range 1000 to 1e+15 bytes/s"),
             (tune + ["--calibration", str(dup)], "key 'efficiency' is given twice"),
             (tune + ["--calibration", str(fast)], "2.02 x the h100 peak"),
             (tune + ["--pp", "64"], "--pp 64 does not divide --gpus 8"),
             (["compare", "--pp", "4", "-m", "8", "-O", "polish=abc"], "-O polish=abc"),
             (["compare", "--pp", "4", "-m", "8", "-O", "budget=1e30"], "above the cap"),
             (["run", "--example", "llama-tiny", "--model", os.path.join(CONFIGS, "gpt2.json")],
              "--example llama-tiny and --model")]
    for argv, words in cases:
        rc, out, err = run_in(capsys, *argv)
        assert rc == 2 and out == "", (argv, rc, err)
        assert words in one_line(err), (argv, err)


def test_compare_lists_a_schedule_given_twice_once(capsys):
    rc, out, _ = run_in(capsys, "compare", "--pp", "4", "-m", "8", "--schedules", "zbv,zbv,1f1b", "--json")
    assert rc == 0
    assert sorted(r["schedule"] for r in json.loads(out)["rows"]) == ["1f1b", "zbv"]


def test_write_error_on_stdout_names_it():
    with open("/dev/full", "w") as full:
        rc, _, err, _ = cli("plan", "-s", "1f1b", "--pp", "2", "-m", "4", stdout=full)
    assert rc == 2 and "stdout (/dev/full): No space left on device" in one_line(err)


def test_out_of_memory_names_the_numbers_given(capsys, monkeypatch):
    from pipeloom.cli import simulate_cmd

    def huge(args):
        raise MemoryError()
    monkeypatch.setattr(simulate_cmd, "run", huge)
    rc, _, err = run_in(capsys, "simulate", "-s", "1f1b", "--pp", "64", "-m", "100000")
    line = one_line(err)
    assert rc == 2 and "out of memory" in line and "--microbatches 100000" in line and "--pp 64" in line


def test_a_rank_that_cannot_start_says_so_not_broken_pipe():
    pytest.importorskip("torch")
    from pipeloom.runtime.launch import RankFailure, _start

    class Dead:
        _popen = None
        exitcode = None

        def start(self):
            raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(RankFailure, match=r"rank 0's process could not start: the interpreter .* ended before "
                                          r"reading its start-up data"):
        _start([Dead(), Dead()])


def test_earlier_outputs_stay_intact_under_a_file_size_limit(tmp_path, plan_file):
    """Part of the proof (the atomic writer's class, kept): a write over RLIMIT_FSIZE is exit 2 naming the file, the
    file as it was."""
    before = plan_file.read_bytes()
    rc, _, err, _ = cli("plan", "-s", "zbv", "--pp", "16", "-m", "64", "-o", str(plan_file),
                        preexec=_limits(fsize=16 * 2**10))
    assert rc == 2 and str(plan_file) in one_line(err) and "File too large" in err
    assert plan_file.read_bytes() == before
    assert [p.name for p in plan_file.parent.iterdir() if p.name.startswith(".")] == []  # no temporary left


# files that read with open() on purpose, each after core.files.check_input or on a path pipeloom made itself
READ_ALLOWED = {
    ("core/limits.py", "machine_capacity"),  # /proc/meminfo
    ("trace/reader.py", "parse_file"),  # line by line, after check_input
    ("trace/sanity.py", "check_files"),  # the first 8 KiB, after check_input
    ("trace/formats.py", "head"),  # the first bytes of a regular file (os.path.isfile)
    ("trace/ops/optrace.py", "_read_table"),  # the CSV header line, after check_input
    ("runtime/launch.py", "_child"),  # the rank's arguments: a private temp file the parent wrote
    ("cli/tune_cmd.py", "_titan_line"),  # launch.json, written by this very command a moment before
}


def test_every_reader_in_src_goes_through_the_bounded_reader():
    """No new reader may read an input whole with a plain open()/json.load/read_text: the class stays fixed."""
    import ast
    from pathlib import Path

    root = Path(SRC) / "pipeloom"
    found = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel == "core/files.py":
            continue
        tree = ast.parse(path.read_text())
        parents = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                parents[child] = node
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
            if name == "open" and owner in ("", "gzip", "io", "bz2", "lzma"):
                mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords
                                                                      if k.arg == "mode"), None)
                text = mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else "r"
                if any(c in text for c in "wax"):
                    continue
            elif not ((name in ("read_text", "read_bytes") and isinstance(f, ast.Attribute))
                      or (name == "load" and owner in ("json", "tomllib"))):
                continue
            fn = node
            while fn in parents and not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                fn = parents[fn]
            where = (rel, getattr(fn, "name", "<module>"))
            if where not in READ_ALLOWED:
                found.append(f"{rel}:{node.lineno} {getattr(fn, 'name', '')}: {ast.unparse(node)[:60]}")
    assert found == [], "read through pipeloom.core.files.read_input/load_json instead:\n" + "\n".join(found)
