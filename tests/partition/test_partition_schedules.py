"""Every interleaved / V builder: valid for every m (m % pp != 0 included); per-chunk costs reach every builder.

Generic over the registry, so builders added later are covered when they land.
"""
from __future__ import annotations

import pytest

from pipeloom.partition import default_layer_costs, from_layers_per_device, uniform
from pipeloom.schedule import registry
from pipeloom.core.ir import Kind
from pipeloom.schedule.registry import PlanSpec
from pipeloom.schedule.validate import validate
from pipeloom.sim.simulate import simulate

# exact solvers only take small shapes (their description says so); give them the smallest ones
_SMALL = {"optimal"}


def _multi_chunk_builders() -> list[tuple[str, int]]:
    out = []
    for name in registry.names():
        v = registry.get(name).vpp
        if v == "1":
            continue
        vpps = {"2": [2], ">=2": [2, 3], "any": [2, 3]}[v]
        for vpp in vpps:
            if name in _SMALL and vpp > 2:
                continue
            out.append((name, vpp))
    return out


@pytest.mark.parametrize("name, vpp", _multi_chunk_builders())
def test_vpp_every_m_gives_valid_schedule(name, vpp):
    """Seed 002 (b)4: m not divisible by pp must still give valid schedules, for every m >= 1."""
    pps = (2,) if name in _SMALL else (2, 3, 4)
    for pp in pps:
        top = 3 if name in _SMALL else 2 * pp + 1
        for m in range(1, top + 1):
            spec = PlanSpec(pp=pp, vpp=vpp, microbatches=m)
            sched = registry.build(name, spec)
            v = validate(sched, mem=spec.mem, mem_limit=spec.mem_limit)
            assert not v, f"{name} pp={pp} vpp={vpp} m={m}: {v[0]}"
            jobs = [j for _, _, j in sched.jobs()]
            assert sum(j.kind is Kind.F for j in jobs) == m * pp * vpp


@pytest.mark.parametrize("name", [n for n, v in _multi_chunk_builders()
                                  if v == 2 and registry.get(n).memory_aware and n not in _SMALL])
def test_vpp_every_m_valid_under_1p(name):
    """The same for memory-aware V builders at the tightest named limit, 1p (= 1F1B's peak)."""
    for pp in (2, 3):
        for m in range(1, 2 * pp + 2):
            spec = PlanSpec(pp=pp, vpp=2, microbatches=m, mem_limit=float(pp))
            sched = registry.build(name, spec)
            v = validate(sched, mem=spec.mem, mem_limit=spec.mem_limit)
            assert not v, f"{name} pp={pp} m={m} at 1p: {v[0]}"


def _builder_shapes():
    for name in registry.names():
        v = registry.get(name).vpp
        vpp = 1 if v in ("1", "any") else 2
        yield name, vpp


@pytest.mark.parametrize("name, vpp", list(_builder_shapes()))
def test_heterogeneous_chunks_feed_every_builder(name, vpp):
    """A non-uniform partition's per-chunk costs reach the builder and the simulator: each device's busy
    time is m * (its chunks' F+B+W), and uneven chunks change the makespan."""
    pp, m = 2, 4 if name not in _SMALL else 2
    L = 9 * pp * vpp // 2 + 1
    lc = default_layer_costs(L, pp * vpp, vocab=64000, hidden=2048)
    counts = [L - (pp - 1) * vpp * 2] + [vpp * 2] * (pp - 1)
    part = from_layers_per_device(counts, pp, vpp, registry.get(name).fn(PlanSpec(pp=2, vpp=vpp, microbatches=2))
                                  .placement)
    spec = PlanSpec(pp=pp, vpp=vpp, microbatches=m, costs=lc.costs(part), mem=lc.mem_model(part))
    sched = registry.build(name, spec)
    assert not validate(sched, mem=spec.mem)
    r = simulate(sched, spec.costs, spec.mem)
    total = lc.chunk_costs(part)["total"]
    for d in range(pp):
        assert r.busy[d] == pytest.approx(m * sum(total[c] for c in part.chunks_of(d)))
    u = uniform(L, pp, vpp, part.placement)
    uspec = PlanSpec(pp=pp, vpp=vpp, microbatches=m, costs=lc.costs(u), mem=lc.mem_model(u))
    ru = simulate(registry.build(name, uspec), uspec.costs, uspec.mem)
    assert ru.makespan != pytest.approx(r.makespan)
