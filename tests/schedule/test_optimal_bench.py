"""bench/optimality_gap.py on tiny cases: no heuristic may beat the proven optimum of its class."""
from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

from pipeloom.schedule import registry

_PATH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "optimality_gap.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("optimality_gap", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("case", [(2, 2, 1, "1p", "A"), (2, 2, 2, "none", "D")])
def test_gaps_are_never_negative(bench, case):
    names = [n for n in registry.names() if n != "optimal"]
    row = bench.run_case(*case, names, 10, 1, own_peak=("vhalf",) if case[2] == 2 else ())
    assert row["optimum"], "at least one class was solved"
    compared = 0
    for name, h in row["heuristics"].items():
        if "gap" not in h:
            continue
        compared += 1
        assert h["gap"] >= -1e-9, f"{name} beats the 'optimum' of its class"
        if h["proven"]:
            assert h["gap_vs_bound"] == pytest.approx(h["gap"])
        if "own_peak" in h:
            assert h["own_peak"]["gap"] >= -1e-9
    assert compared >= 2
    json.dumps(row)  # the --json output must serialise


def test_schedule_class(bench):
    from pipeloom.schedule.planning import make_spec, plan

    s = plan("1f1b", make_spec(pp=2, microbatches=2))
    assert bench.schedule_class(s) == ("interleaved", "bw")
    s = plan("dualpipev", make_spec(pp=2, microbatches=4, vpp=2))
    assert bench.schedule_class(s) == ("v", "split")
