"""A chunk whose activations round to 0 schedule units (one holding only the embedding: token ids against a
unit of gigabytes, as the 'ends' partition gives Llama 3 405B) must not break the memory-aware lower bound."""
from __future__ import annotations

from pipeloom.core.costs import Costs, MemModel
from pipeloom.core.ir import Placement
from pipeloom.schedule.registry import PlanSpec
from pipeloom.schedule.search.bounds import _min_free_work, microbatch_graph


def test_lp_relaxation_skips_a_chunk_that_frees_nothing():
    spec = PlanSpec(pp=2, vpp=2, microbatches=4, costs=Costs(F=(0.0, 1.0, 1.0, 1.0), B=(0.0, 1.0, 1.0, 1.0),
                                                             W=(0.0, 1.0, 1.0, 1.0)),
                    mem=MemModel(a=(0.0, 2.0, 2.0, 2.0), b=(0.0, 1.0, 1.0, 1.0)), mem_limit=8)
    g = microbatch_graph(spec, Placement.V)
    chunks = [0, 3]  # device 0 of the V: chunk 0 (frees nothing) and chunk 3
    # the LP (exact=False) and the dynamic program agree: freeing 4 units takes the B+W of chunk 3 twice
    # (B alone frees 1 for 1, B+W 2 for 2: 4 units cost 4 either way), never anything of chunk 0
    assert _min_free_work(g, chunks, 4, exact=False) == _min_free_work(g, chunks, 4, exact=True) == 4.0
