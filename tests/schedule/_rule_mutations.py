"""Wrong copies of the rules of core/rules.py, as monkeypatches, for the tests that hold a compiled pass to its
Python form under a mutated rule (tests/schedule/test_paced_c.py, test_template_c.py): each entry is a list of
(name in core.rules, replacement); a test sets them, clears the cached rule tables, and expects the C pass to
change and to equal the Python pass."""
from pipeloom.core import rules
from pipeloom.core.ir import Kind
from pipeloom.sim import kernel


def mutations() -> dict:
    needs, handoff, edge, delta, dur = rules.needs, rules.handoff, rules.edge_comm, rules.memory_delta, rules.duration

    def no_grad_edge(kind, mb, chunk, num_chunks):  # B no longer waits for the gradient from chunk + 1 ...
        return tuple(x for x in needs(kind, mb, chunk, num_chunks) if x[0] != rules.GRAD or kind is Kind.W)

    def no_grad_handoff(kind, mb, chunk, num_chunks):  # ... so no B hands one down
        return handoff(kind, mb, chunk, num_chunks) if kind is Kind.F else None

    def free_backward_edges(pp, num_chunks, placement, comm):  # the gradient travels without comm
        fwd, bwd = edge(pp, num_chunks, placement, comm)
        return fwd, [0.0] * len(bwd)

    def w_frees_a(kind, a, b):  # W frees a instead of a - b
        return -a if kind is Kind.W else delta(kind, a, b)

    def f_keeps_half(kind, a, b):  # F allocates half its activations
        return 0.5 * a if kind is Kind.F else delta(kind, a, b)

    def w_lasts_b(kind, chunk, dF, dB, dW):  # W lasts as long as B
        return dB[chunk] if kind is Kind.W else dur(kind, chunk, dF, dB, dW)

    return {"needs: B without GRAD": (("needs", no_grad_edge), ("handoff", no_grad_handoff)),
            "edge_comm: no comm on backward edges": (("edge_comm", free_backward_edges),),
            "memory_delta: W frees a": (("memory_delta", w_frees_a),),
            "memory_delta: F allocates a/2": (("memory_delta", f_keeps_half),),
            "duration: W = B": (("duration", w_lasts_b),)}


def check_mutation_reaches(name: str, monkeypatch, compiled, reference, what: str) -> None:
    """Under the wrong copy ``name`` of a rule the compiled pass places other jobs than before, and exactly the
    jobs of its Python reference under the same rule: both read the one copy in core/rules.py. ``compiled`` and
    ``reference``: the results of each form on the test's shapes (made anew under the patch: a Problem derives
    its tables from core.rules)."""
    before = compiled()
    assert before == reference()
    assert any(r is not None for r in before)
    for attr, fn in mutations()[name]:
        monkeypatch.setattr(rules, attr, fn)
    kernel._make_rules.cache_clear()
    try:
        after = compiled()
        assert after != before, f"the C {what} pass did not see the mutated rule"
        assert after == reference()
    finally:
        kernel._make_rules.cache_clear()
