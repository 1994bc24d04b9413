"""pipeloom's zbv against torch's own ZBVZeroBubble order at torch's peak memory (same V placement, vpp 2).

The oracle is torch's schedule class (its ``pipeline_order``, computed without processes by ``torch_builtin``)
timed by pipeloom's simulator with torch's runtime memory model (B frees nothing). zbv, planned with that
peak as its limit, must fit it and never be slower, also with uneven chunk costs (the heavy last chunk:
loss and head), where the lock-step construction built from the real costs lost (pp 8, m 8: 86.8, the
search's best 81, against torch's 80.8).
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch.distributed.pipelining")

from pipeloom.core.costs import Costs, runtime_mem_model  # noqa: E402
from pipeloom.integrations.torch import torch_builtin  # noqa: E402
from pipeloom.schedule.planning import make_spec, plan  # noqa: E402
from pipeloom.schedule.validate import validate  # noqa: E402
from pipeloom.sim.simulate import simulate  # noqa: E402


def _heavy_last(nc: int) -> Costs:
    heavy = tuple([1.0] * (nc - 1) + [2.0])
    return Costs(F=heavy, B=heavy, W=heavy, comm=0.1)


@pytest.mark.parametrize("pp, m", [(8, 8), (4, 4), (4, 8), (2, 4)])
@pytest.mark.parametrize("costs", ["heavy-last", "uneven"])
def test_zbv_never_slower_than_torch_zbv_at_its_peak(pp, m, costs):
    c = _heavy_last(2 * pp) if costs == "heavy-last" else Costs(F=1, B=1.5, W=0.7, comm=0.2)
    mem = runtime_mem_model("torch")
    theirs = simulate(torch_builtin("ZBVZeroBubble", pp, m, 2), c, mem)
    limit = max(theirs.peak_memory)
    ours = plan("zbv", make_spec(pp=pp, microbatches=m, vpp=2, costs=c, mem=mem, mem_limit=limit))
    assert validate(ours, mem=mem, mem_limit=limit) == []
    r = simulate(ours, c, mem)
    assert max(r.peak_memory) <= limit + 1e-9
    assert r.makespan <= theirs.makespan + 1e-9
