"""Hypothesis helpers shared by the schedule tests."""
from hypothesis import strategies as st

from pipeloom import Costs


def draw_costs(draw, nc: int) -> Costs:
    """Uniform costs with comm, or heterogeneous per-chunk costs for ``nc`` chunks."""
    if draw(st.booleans()):
        return Costs(F=draw(st.sampled_from([0.5, 1.0, 2.0])), B=draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])),
                     W=draw(st.sampled_from([0.5, 1.0, 2.0])), comm=draw(st.sampled_from([0.0, 0.25, 1.0])))
    vals = st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0]), min_size=nc, max_size=nc)
    return Costs(F=tuple(draw(vals)), B=tuple(draw(vals)), W=tuple(draw(vals)),
                 comm=draw(st.sampled_from([0.0, 0.5])))
