"""Plans remember the memory limit they were made for, in every file format and through convert."""
from __future__ import annotations

import json

import pytest

from pipeloom.cli import main
from pipeloom.core.errors import ScheduleFormatError
from pipeloom.schedule import io as schedule_io
from pipeloom.schedule.io.files import META_SUFFIX
from pipeloom.schedule.planning import make_spec, plan


def _zbv():
    return plan("zbv", make_spec(pp=4, microbatches=8, vpp=2, mem_limit="0.75p"))  # 0.75p = 3 units


def test_native_csv_header_keeps_builder_and_limit(tmp_path):
    f = tmp_path / "z.csv"
    schedule_io.save(_zbv(), str(f))
    assert f.read_text().splitlines()[0].endswith(" builder=zbv mem_limit=3")
    back = schedule_io.load(str(f))
    assert back.meta["builder"] == "zbv" and back.meta["mem_limit"] == 3.0


def test_native_csv_bad_limit_is_named():
    text = "# pipeloom schedule name=t pp=1 mem_limit=lots\ndevice,step,job\n0,0,F0.0\n0,1,BW0.0\n"
    with pytest.raises(ScheduleFormatError, match="mem_limit must be a number of units > 0 or none, got 'lots'"):
        schedule_io.from_csv(text)


def test_torch_csv_keeps_name_and_limit_beside_it(tmp_path):
    f = tmp_path / "z.csv"
    written = schedule_io.save(_zbv(), str(f), "torch")
    assert written == [str(f), str(f) + META_SUFFIX]
    # torch's _load_csv reads every row as a rank's actions: the CSV itself stays pure (no comment line)
    rows = f.read_text().splitlines()
    assert len(rows) == 4 and not any(r.lstrip().startswith("#") for r in rows)
    back = schedule_io.load(str(f))
    assert back.name == "zbv" and back.meta["mem_limit"] == 3.0 and back.meta["builder"] == "zbv"
    (tmp_path / ("z.csv" + META_SUFFIX)).unlink()
    alone = schedule_io.load(str(f))
    assert alone.name == "torch" and "mem_limit" not in alone.meta  # without it: what torch's format holds


def test_a_stale_sidecar_is_an_error_naming_it(tmp_path):
    f = tmp_path / "z.csv"
    schedule_io.save(_zbv(), str(f), "torch")
    other = plan("zbv", make_spec(pp=2, microbatches=4, vpp=2))
    (tmp_path / "z.csv.meta.json").write_text(schedule_io.files.sidecar_text(other))
    with pytest.raises(ScheduleFormatError, match=r"z\.csv\.meta\.json describes pp=2 vpp=2 m=4 but the CSV holds pp=4"):
        schedule_io.load(str(f))


def _sim(capsys, path, *extra):
    assert main(["simulate", "--plan", str(path), "--json", *extra]) in (0, 1)
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("fmt, name", [("pipeloom", "p.json"), ("pipeloom", "p.csv"), ("torch", "p.csv")])
def test_simulate_plan_uses_the_limit_it_was_made_for(tmp_path, capsys, fmt, name):
    """simulate --plan on a torch CSV said 'torch' and 'memory limit none' for a ZB-V plan made at 0.75p."""
    f = tmp_path / name
    assert main(["plan", "-s", "zbv", "--pp", "4", "-m", "8", "--mem-limit", "0.75p", "--format", fmt,
                 "--runtime", "pipeloom", "-o", str(f)]) == 0
    capsys.readouterr()
    d = _sim(capsys, f)
    assert (d["schedule"], d["memory_limit"], d["valid"]) == ("zbv", 3.0, True)
    assert _sim(capsys, f, "--mem-limit", "2")["valid"] is False  # a limit on the command line still wins
    # a memory-unaware builder is recorded with the limit it was checked against
    g = tmp_path / ("q" + name[1:])
    assert main(["plan", "-s", "1f1b", "--pp", "4", "-m", "8", "--mem-limit", "1p", "--format", fmt, "-o", str(g)]) == 0
    capsys.readouterr()
    assert _sim(capsys, g)["memory_limit"] == 4.0


def test_convert_carries_the_limit_both_ways(tmp_path, capsys):
    src = tmp_path / "z.json"
    schedule_io.save(_zbv(), str(src))
    assert main(["convert", str(src), str(tmp_path / "t.csv"), "--to", "torch"]) == 0
    assert main(["convert", str(tmp_path / "t.csv"), str(tmp_path / "back.json"), "--to", "pipeloom"]) == 0
    out = capsys.readouterr().out
    assert "planned for memory limit 3" in out
    back = json.loads((tmp_path / "back.json").read_text())
    assert back["name"] == "zbv" and back["meta"]["mem_limit"] == 3.0
