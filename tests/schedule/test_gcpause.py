"""The search runs with the cyclic garbage collector paused, and gives the caller's setting back."""
import gc

import pytest

from pipeloom.core.costs import Costs, MemModel
from pipeloom.core.ir import Placement
from pipeloom.schedule.search import greedy as g, portfolio
from pipeloom.schedule.search.gcpause import paused


@pytest.fixture(autouse=True)
def _restore_gc():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_turns_the_collector_off_and_restores_it():
    seen = []
    f = paused(lambda x: seen.append(gc.isenabled()) or x + 1)
    gc.enable()
    assert f(1) == 2 and seen == [False] and gc.isenabled()
    gc.disable()  # a caller that turned it off itself keeps it off
    assert f(2) == 3 and seen == [False, False] and not gc.isenabled()


def test_paused_restores_the_collector_on_error():
    @paused
    def boom():
        raise KeyError("x")

    gc.enable()
    with pytest.raises(KeyError):
        boom()
    assert gc.isenabled()


def test_the_portfolio_search_runs_with_the_collector_paused(monkeypatch):
    seen = []
    real = portfolio.run_pass

    def spy(prob, pol):
        seen.append(gc.isenabled())
        return real(prob, pol)

    monkeypatch.setattr(portfolio, "run_pass", spy)
    gc.enable()
    prob = g.make_problem(4, 2, 8, Placement.V, Costs(F=1.0, B=2.0, W=1.0, comm=0.5), MemModel(), 3.0)
    best = portfolio.search(prob)
    assert best is not None and seen and not any(seen)
    assert gc.isenabled()
