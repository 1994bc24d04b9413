"""Speed of the exact bottleneck DP (pipeloom.partition.balance.bottleneck_dp): the former O(chunks L^2)
scan against the binary-search rows, side by side, plus the `partition ... --balance makespan` command.

    .venv/bin/python bench/partition_dp_speed.py [--out docs/bench/partition.md]

With --out, the "## DP speed" section at the end of that page is (re)written; the rest is kept.
"""
from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time

import numpy as np

from _harness import median, write_section
from _harness import timed as _timed

from pipeloom.partition import bottleneck_dp, default_layer_costs

HEAD = "## DP speed"


def former_scan(costs, nc):
    """The DP as it was (a copy kept for this comparison): every split i scanned for every end j."""
    L = costs.num_layers
    t = np.array([x.total for x in costs.layers], dtype=float)
    P = np.concatenate([[0.0], np.cumsum(t)])
    emb, hd = costs.embedding.total, costs.head.total
    T = np.full((nc, L + 1), math.inf)
    arg = np.zeros((nc, L + 1), dtype=int)
    T[0, 1:] = P[1:] + emb + (hd if nc == 1 else 0.0)
    for k in range(1, nc):
        extra = hd if k == nc - 1 else 0.0
        for j in range(k + 1, L - (nc - 1 - k) + 1):
            i = np.arange(k, j)
            vals = np.maximum(T[k - 1, i], P[j] - P[i] + extra)
            best = int(np.argmin(vals))
            T[k, j], arg[k, j] = vals[best], i[best]
    counts, j = [], L
    for k in range(nc - 1, 0, -1):
        i = int(arg[k, j])
        counts.append(j - i)
        j = i
    counts.append(j)
    return counts[::-1]


def timed(f, reps):
    """(median seconds of ``reps`` calls, the last call's result)."""
    box = []
    ts = [_timed(lambda: box.append(f())) for _ in range(reps)]
    return median(ts), box[-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    pp = 8
    rows = ["| layers | pp | former scan s | binary-search DP s | speed-up | same split |", "|---:|---:|---:|---:|---:|---|"]
    for L in (1000, 4000, 16000, 100000):
        lc = default_layer_costs(L, pp)
        new_s, new = timed(lambda: list(bottleneck_dp(lc, pp).seg_layer_num), 3)
        if L <= 16000:
            old_s, old = timed(lambda: former_scan(lc, pp), 1)
            rows.append(f"| {L:,} | {pp} | {old_s:.2f} | {new_s:.3f} | {old_s / new_s:.0f}x | {old == new} |")
        else:
            rows.append(f"| {L:,} | {pp} | (minutes) | {new_s:.3f} | | |")
    cmd = [sys.executable, "-m", "pipeloom", "partition", "--layers", "100000", "--pp", "8", "--balance", "makespan"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    cli_s = time.perf_counter() - t0
    md = "\n".join([
        HEAD, "",
        "Command: `python bench/partition_dp_speed.py --out docs/bench/partition.md` (this section only; the "
        "table above is `bench/partition_balance.py`'s, which rewrites the whole page: run this one after it)", "",
        "The exact min-max chunk DP on default transformer layer costs (heavy head), pp 8, vpp 1: the former "
        "scan of every split (O(chunks L^2), kept in the script) against the binary search per DP row "
        "(O(chunks L log L)); median of 3 for the new one. `same split` compares the two partitions.", "",
        *rows, "",
        f"`pipeloom partition --layers 100000 --pp 8 --balance makespan` end to end (DP, makespan search, "
        f"report): {cli_s:.1f} s; before this change it did not finish within 500 s (killed) on the same "
        f"loaded machine.", ""])
    print(md)
    if args.out:
        write_section(args.out, HEAD, md)


if __name__ == "__main__":
    main()
