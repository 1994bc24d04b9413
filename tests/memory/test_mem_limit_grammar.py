"""One --mem-limit grammar (none | units | Xp | bytes) for every command, and sizes that cannot overflow."""
from __future__ import annotations

import pytest

from pipeloom.cli import build_parser, main
from pipeloom.core.costs import MemLimit, SizeError, parse_mem_limit, parse_size
from pipeloom.memory.analytic import TrainConfig, estimate
from pipeloom.memory.budget import device_budget, limit_units
from pipeloom.models.presets import preset

GiB = 1024 ** 3

#: each command with a shape where every accepted limit plans (zbv at pp 4: its floor is 1 unit)
COMMANDS = {
    "simulate": ["simulate", "-s", "zbv", "--pp", "4", "-m", "4", "--json"],
    "plan": ["plan", "-s", "zbv", "--pp", "4", "-m", "4", "--json"],
    "compare": ["compare", "--pp", "4", "-m", "4", "--schedules", "zbv", "--json"],
    "memory": ["memory", "--model", "gpt3-125m", "-s", "zbv", "--pp", "4", "-m", "4", "--gpu-memory", "80GiB", "--json"],
    "tune": ["tune", "--model", "llama-tiny", "--gpus", "2", "--global-batch", "4", "--seq", "32", "--schedules", "zbv",
             "--recompute", "none", "--zero", "0", "--max-vpp", "2", "--json",
             "--workers", "1"],
    "run": ["run", "-s", "zbv", "--pp", "2", "-m", "4"],
}
#: the strings and whether a command takes them: a size in bytes only where a model converts it
STRINGS = {"none": True, "6": True, "0.75p": True, "1.5p": True, "80GiB": "bytes",
           "0": False, "-1p": False, "abc": False, "1e400": False, "9" * 500: False, "1e13": False, "nanp": False}
BYTES_OK = {"memory", "tune"}


def _main(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse refuses an option value by exiting 2
        return e.code


def _outcome(cmd: str, text: str, capsys, tmp_path) -> tuple[bool, str]:
    """(accepted, the error line): every command but run is run whole; run is parsed and its run config built
    (the planning spec, as 'pipeloom run' makes it before any process starts)."""
    argv = COMMANDS[cmd] + ["--mem-limit", text]
    if cmd == "plan":
        argv += ["-o", str(tmp_path / "p.json")]
    if cmd == "run":
        from pipeloom.cli.run_cmd import run_config

        try:
            args = build_parser().parse_args(argv)
            run_config(args)
        except SystemExit as e:
            return e.code == 0, capsys.readouterr().err
        return True, ""
    rc = _main(argv)
    err = capsys.readouterr().err
    assert rc in (0, 1, 2), err  # 1: memory says 'does not fit'
    return rc != 2, err


@pytest.mark.parametrize("text", list(STRINGS), ids=lambda t: t[:12])
def test_every_command_accepts_or_refuses_the_same_strings(text, capsys, tmp_path):
    want = STRINGS[text]
    for cmd in COMMANDS:
        ok, err = _outcome(cmd, text, capsys, tmp_path)
        expect = (cmd in BYTES_OK) if want == "bytes" else want
        assert ok == expect, (cmd, text, err)
        if not ok:
            line = err.strip()
            assert "\n" not in line and "Traceback" not in line and "internal error" not in line, line
            assert "--mem-limit" in line, line  # the option is named
            if want == "bytes":
                assert "needs a model" in line, line
            else:
                assert "allowed: none" in line or "cap of" in line, line  # what is allowed


def test_the_help_of_every_command_gives_the_one_grammar():
    p = build_parser()
    sub = p._subparsers._group_actions[0].choices
    for cmd in ("simulate", "plan", "compare", "partition", "show", "memory", "run", "tune"):
        act = [a for a in sub[cmd]._actions if "--mem-limit" in a.option_strings][0]
        assert "none (no limit), a number of units" in act.help and "Xp" in act.help, cmd
        assert ("80GiB" in act.help) and (("needs a model" in act.help) != (cmd in BYTES_OK)), cmd


@pytest.mark.parametrize("text,pp,units", [("none", 4, None), ("6", 4, 6.0), ("0.75p", 4, 3.0), ("1.5p", 8, 12.0),
                                           ("1e3", 2, 1000.0), (" 2P ", 3, 6.0), (7, 3, 7.0), ("unlimited", 2, None)])
def test_mem_limit_units(text, pp, units):
    assert MemLimit.parse(text).units(pp) == units
    assert parse_mem_limit(text, pp) == units


def test_a_size_in_bytes_is_a_limit_only_through_a_model():
    lim = MemLimit.parse("60GiB")
    assert lim.is_bytes and lim.value == 60 * GiB and str(lim) == "60GiB"
    with pytest.raises(SizeError, match="needs a model"):
        lim.units(4)
    with pytest.raises(SizeError, match="needs a model"):
        MemLimit.parse("60GiB", bytes_ok=False)
    # through a model: the tightest device's room, by hand from the budget's parts
    model, train = preset("llama2-7b"), TrainConfig()
    b = device_budget(model, train, (4, 1, "interleaved", [8, 8, 8, 8]))
    rooms = [(60 * GiB - sum(b.static[d]) - b.transient[d]) / b.unit_bytes for d in range(4)]
    assert limit_units("60GiB", 4, b) == pytest.approx(min(rooms))
    rep = estimate(model, train, pp=4, microbatches=8, mem_limit="60GiB")
    assert rep.mem_limit_units == pytest.approx(min(rooms))


# ---------------------------------------------------------------- issue 33 item 10: no overflow, per class
HUGE = ["9" * 400, "1e400", "1e400GiB", "9" * 60 + "GiB", "1e19TiB"]


@pytest.mark.parametrize("text", HUGE, ids=lambda t: t[:10])
def test_a_huge_size_is_a_one_line_error_naming_the_option(text):
    with pytest.raises(SizeError) as e:
        parse_size(text, what="--gpu-memory")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("--gpu-memory") and ("allowed" in msg or "cap of" in msg), msg
    assert len(msg) < 400, msg


@pytest.mark.parametrize("argv", [
    ["memory", "--model", "llama2-7b", "--pp", "4", "-m", "8", "--gpu-memory", "9" * 400],
    ["memory", "--model", "llama2-7b", "--pp", "4", "-m", "8", "--gpu-memory", "1e400GiB"],
    ["memory", "--model", "llama2-7b", "--pp", "4", "-m", "8", "--reserve", "1e300"],
    ["memory", "--model", "llama2-7b", "--pp", "4", "-m", "8", "-s", "zbv", "--mem-limit", "9" * 400 + "GiB"],
    ["simulate", "-s", "zbv", "--pp", "4", "-m", "8", "--mem-limit", "1" + "0" * 300],
    ["simulate", "-s", "zbv", "--pp", "4", "-m", "8", "--mem-limit", "1e300p"],
    ["simulate", "-s", "1f1b", "--pp", "4", "-m", "8", "--dp", "2", "--param-bytes", "1e30GiB"],
    ["simulate", "-s", "1f1b", "--pp", "4", "-m", "8", "--dp", "2", "--param-bytes", "9" * 400],
    ["tune", "--model", "llama2-7b", "--gpus", "8", "--global-batch", "64", "--gpu-memory", "1e300"],
    ["tune", "--model", "llama2-7b", "--gpus", "8", "--global-batch", "64", "--mem-limit", "1e400"],
], ids=lambda a: " ".join(a)[:60])
def test_absurd_sizes_across_options_exit_2_with_one_line(argv, capsys):
    rc = _main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "internal error" not in err and "Overflow" not in err, err
    opt = next(a for a in argv if a in ("--gpu-memory", "--reserve", "--mem-limit", "--param-bytes"))
    assert opt in err, err


@pytest.mark.parametrize("dim", ["hidden_size", "intermediate_size", "vocab_size", "max_position_embeddings"])
def test_config_dimensions_near_1e200_are_refused(dim, tmp_path, capsys):
    import json

    cfg = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
           "intermediate_size": 11008, "vocab_size": 32000, "max_position_embeddings": 4096}
    cfg[dim] = 32 * 10 ** 200
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    for argv in (["memory", "--model", str(f), "--pp", "4", "-m", "8"],
                 ["tune", "--model", str(f), "--gpus", "8", "--global-batch", "64"],
                 ["simulate", "-s", "1f1b", "--pp", "4", "-m", "8", "--model", str(f)]):
        rc = _main(argv)
        err = capsys.readouterr().err.strip()
        assert rc == 2 and "cap of" in err and "config.json" in err and "internal error" not in err, (argv, err)
