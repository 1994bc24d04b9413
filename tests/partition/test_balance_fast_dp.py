"""The O(nc L log L) bottleneck DP gives exactly the split of the former O(nc L^2) scan."""
from __future__ import annotations

import random

import pytest

from pipeloom.partition import LayerCost, LayerCosts, bottleneck_dp


def _reference_counts(t, nc, emb, hd):
    """The former DP, written out plainly: for each (chunk k, end j) the FIRST split i that minimises
    max(T[k-1][i], time of layers i..j + head on the last chunk); then walked back from j = L."""
    L = len(t)
    P = [0.0]
    for x in t:
        P.append(P[-1] + x)
    inf = float("inf")
    T = [[inf] * (L + 1) for _ in range(nc)]
    arg = [[0] * (L + 1) for _ in range(nc)]
    for j in range(1, L + 1):
        T[0][j] = P[j] + emb + (hd if nc == 1 else 0.0)
    for k in range(1, nc):
        extra = hd if k == nc - 1 else 0.0
        for j in range(k + 1, L - (nc - 1 - k) + 1):
            best, bi = inf, None
            for i in range(k, j):
                v = max(T[k - 1][i], P[j] - P[i] + extra)
                if bi is None or v < best:
                    best, bi = v, i
            T[k][j], arg[k][j] = best, bi
    counts, j = [], L
    for k in range(nc - 1, 0, -1):
        i = arg[k][j]
        counts.append(j - i)
        j = i
    counts.append(j)
    return counts[::-1]


def _case(rng: random.Random):
    nc = rng.randint(1, 6)
    L = rng.randint(nc, 40)
    style = rng.choice(["int", "float", "zeros", "equal"])
    if style == "int":
        t = [float(rng.randint(0, 5)) for _ in range(L)]
    elif style == "zeros":
        t = [float(rng.choice([0, 0, 0, 1, 7])) for _ in range(L)]
    elif style == "equal":
        t = [1.0] * L
    else:
        t = [rng.uniform(0, 3) for _ in range(L)]
    emb = float(rng.choice([0, 0, 1, rng.randint(0, 20)]))
    hd = float(rng.choice([0, 2, rng.randint(0, 40), rng.uniform(0, 30)]))
    return nc, t, emb, hd


@pytest.mark.parametrize("seed", range(6))
def test_fast_dp_matches_former_scan_on_random_inputs(seed):
    rng = random.Random(seed)
    for _ in range(120):
        nc, t, emb, hd = _case(rng)
        pp, vpp = (nc, 1) if nc % 2 or rng.random() < 0.5 else (nc // 2, 2)
        lc = LayerCosts(tuple(LayerCost(F=x) for x in t), embedding=LayerCost(F=emb), head=LayerCost(F=hd))
        got = bottleneck_dp(lc, pp, vpp).seg_layer_num
        assert list(got) == _reference_counts(t, nc, emb, hd), (nc, t, emb, hd)


def test_fast_dp_handles_many_layers_quickly():
    import time
    L = 20000
    rng = random.Random(1)
    lc = LayerCosts(tuple(LayerCost(F=rng.uniform(0.5, 1.5)) for _ in range(L)), embedding=LayerCost(F=3.0),
                    head=LayerCost(F=50.0))
    t0 = time.perf_counter()
    p = bottleneck_dp(lc, 8, 1)
    assert time.perf_counter() - t0 < 10.0  # the former scan took minutes at this size
    assert sum(p.seg_layer_num) == L and min(p.seg_layer_num) >= 1
