"""The simulator against the Zero Bubble paper's own bubble rates (Qi et al., ICLR 2024, Tables 5 and 6, figures in
tests/data/zero_bubble_paper_rates.json): with each setup's profiled T_F, T_B, T_W and T_comm, pipeloom's 1F1B
and ZB-H1 (the paper's ZB-1p column equals its ZB-H1 column in every row) give the published bubble rate
(cost - m (T_F + T_B + T_W)) / cost to 4 decimals, cost being the simulated makespan. 23 of 24 match; the one
that does not (28.3B, m 256, ZB-1p) is held as a strict xfail: pipeloom's zbh1 bubble grows from 452 ms at
m 128 to 555 ms at m 256 with those costs, the paper's stays at about 458 ms (docs/zero-bubble.md)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeloom.core.costs import Costs
from pipeloom.schedule import registry
from pipeloom.schedule.registry import PlanSpec
from pipeloom.sim.simulate import simulate

DATA = json.loads((Path(__file__).parents[1] / "data" / "zero_bubble_paper_rates.json").read_text())
ROWS = DATA["rows"]
KNOWN_DIFF = {("28.3B", 256, "zbh1")}


def _rate(name, p, m, F, B, W, comm):
    costs = Costs(F=F, B=B, W=W, comm=comm)
    sim = simulate(registry.build(name, PlanSpec(pp=p, microbatches=m, costs=costs)), costs)
    return (sim.makespan - m * (F + B + W)) / sim.makespan


def _cases():
    for model, p, m, F, B, W, comm, r1, rh1, rz1 in ROWS:
        assert rh1 == rz1  # the paper's ZB-H1 and ZB-1p columns agree in every row
        for name, want in (("1f1b", r1), ("zbh1", rz1)):
            marks = [pytest.mark.xfail(strict=True, reason="zbh1's steady state idles ~0.76 ms more per "
                                       "microbatch than the paper's at p 32, m 256")] if (model, m, name) in KNOWN_DIFF else []
            yield pytest.param(name, p, m, F, B, W, comm, want, id=f"{model}-m{m}-{name}", marks=marks)


def test_the_data_names_its_source_and_has_every_setup():
    assert "Zero Bubble Pipeline Parallelism" in DATA["source"] and "Table 5" in DATA["source"]
    assert len(ROWS) == 12 and {r[0] for r in ROWS} == {"1.5B", "6.2B", "14.6B", "28.3B"}


@pytest.mark.parametrize("name,p,m,F,B,W,comm,want", list(_cases()))
def test_bubble_rate_matches_the_paper_to_4_decimals(name, p, m, F, B, W, comm, want):
    assert round(_rate(name, p, m, F, B, W, comm), 4) == want
