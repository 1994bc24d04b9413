"""What the timing benches share: alternation, medians, paired ratios, atomic tables (no torch).

A bench compares entries (two checkouts, pipeloom against torch, a plan against its control) measured in
the same run, so that the machine's drift hits all of them alike:

* :func:`round_orders` / :func:`alternate`: every round runs each entry once, in the order given
  (A B A B ...), mirrored every other round (``mirror``: A B B A ...) or in a fresh random order each
  round (``shuffle``: no entry always follows the same one; a seeded generator, so every rank of a
  distributed bench draws the same orders);
* :func:`median`, :func:`quartiles`, :func:`paired_ratios`, :func:`ratio_summary`: the statistics the
  tables print; a ratio is taken within a round (entries next to each other) and its median reported,
  which cancels the drift between rounds;
* :func:`write_text`, :func:`write_json`, :func:`write_section`: tables and results written whole or not
  at all (``pipeloom.core.files.atomic_write``), JSON strict (no NaN or Infinity);
* :func:`plan_in_child`: one plan of pipeloom's registry in a fresh process (plan CPU, peak RSS, makespan and
  the proven bound), for the benches that time planning at scale.

Run a bench as ``python bench/NAME.py``: its folder is then on ``sys.path`` and ``from _harness import ...``
finds this file.
"""
from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from typing import Callable, Iterator, Mapping, Sequence

from pipeloom.core.files import atomic_write


# ---------------------------------------------------------------------------------------------- alternation
def round_orders(names: Sequence, rounds: int, *, shuffle: bool = False, mirror: bool = False,
                 seed: int = 0) -> Iterator[list]:
    """The order of the entries in each of ``rounds`` rounds: ``names`` as given every round (A B, A B, ...),
    with ``mirror`` reversed every other round (A B, B A, A B, ...: each entry goes first as often), or with
    ``shuffle`` a fresh random order per round from ``random.Random(seed)`` (the same sequence wherever it
    runs: the ranks of one process group agree without talking)."""
    if shuffle and mirror:
        raise ValueError("round_orders: shuffle or mirror, not both")
    names = list(names)
    rng = random.Random(seed) if shuffle else None
    for i in range(rounds):
        if rng is not None:
            yield rng.sample(names, len(names))
        else:
            yield names[::-1] if mirror and i % 2 else list(names)


def timed(fn: Callable[[], object], *, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds one call of ``fn`` takes on ``clock``."""
    t0 = clock()
    fn()
    return clock() - t0


def alternate(entries: Mapping[str, Callable[[], object]], rounds: int, *, shuffle: bool = False,
              mirror: bool = False, seed: int = 0, warmup: int = 0,
              clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Time every entry once per round for ``rounds`` rounds (orders from :func:`round_orders`), after
    ``warmup`` untimed rounds in the given order; seconds per entry, in round order (index i of every list
    is round i, so :func:`paired_ratios` pairs steps that ran next to each other)."""
    for _ in range(warmup):
        for fn in entries.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in entries}
    for order in round_orders(list(entries), rounds, shuffle=shuffle, mirror=mirror, seed=seed):
        for name in order:
            times[name].append(timed(entries[name], clock=clock))
    return times


# ---------------------------------------------------------------------------------------------- statistics
def median(xs) -> float:
    """The median of ``xs`` (a list, tuple or any iterable of numbers)."""
    return float(statistics.median(list(xs)))


def quartiles(xs) -> tuple[float, float, float]:
    """(first quartile, median, third quartile) of ``xs`` (``statistics.quantiles``' exclusive method; with one
    value all three are that value)."""
    xs = list(xs)
    if len(xs) == 1:
        return (float(xs[0]),) * 3
    q1, q2, q3 = statistics.quantiles(xs, n=4)
    return float(q1), float(q2), float(q3)


def paired_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """``a[i] / b[i]`` for every round i (the two lists must come from the same rounds)."""
    if len(a) != len(b):
        raise ValueError(f"paired ratios need as many values on both sides, got {len(a)} and {len(b)}")
    return [x / y for x, y in zip(a, b)]


def ratio_summary(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """The within-round ratio a/b: its median and quartiles, and the ratio of the two medians for comparison."""
    q1, med, q3 = quartiles(paired_ratios(a, b))
    return {"median": med, "q1": q1, "q3": q3, "of_medians": median(a) / median(b)}


# ---------------------------------------------------------------------------------------------- tables
def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` as it is, whole or not at all (missing folders are made)."""
    with atomic_write(path) as fh:
        fh.write(text)


def write_json(path: str | os.PathLike, obj, **dump_kw) -> None:
    """Write ``obj`` as strict JSON and a newline (``indent=1`` unless given; NaN or Infinity raise ValueError
    before anything is written)."""
    write_text(path, json.dumps(obj, allow_nan=False, **({"indent": 1} | dump_kw)) + "\n")


def write_section(path: str | os.PathLike, head: str, section: str, *, before: str | None = None) -> None:
    """Put ``section`` (starting with the line ``head``) into the page ``path``, keeping everything else; the
    page is written whole. By default the section is the page's end: what an earlier run wrote from ``head`` on
    is replaced. With ``before`` (a heading of the page, e.g. ``"## Table"``) the section sits in the middle:
    it runs from ``head`` to the next ``## `` heading, and a page without it gets it just above ``before``."""
    text = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    if before is None:
        if head in text:
            text = text[:text.index(head)]
        write_text(path, (text.rstrip("\n") + "\n\n" if text.strip() else "") + section)
        return
    if head in text:
        i = text.index(head)
        j = text.find("\n## ", i + len(head))
        text = text[:i] + section.rstrip("\n") + "\n" + (text[j:] if j >= 0 else "")
    else:
        i = text.index(before)
        text = text[:i] + section.rstrip("\n") + "\n\n" + text[i:]
    write_text(path, text)


# ---------------------------------------------------------------------------------------------- plans
_PLAN_CHILD = r"""
import json, resource, sys, time
from dataclasses import replace
from pipeloom.schedule import registry
from pipeloom.schedule.planning import make_spec
from pipeloom.schedule.search.bounds import lower_bound
from pipeloom.sim.simulate import simulate
name, pp, vpp, m, costs, limit, opts = json.loads(sys.argv[1])
spec = make_spec(pp=pp, vpp=vpp, microbatches=m, costs=costs, mem_limit=limit, options=opts)
t0 = time.process_time()
s = registry.build(name, spec)
cpu = time.process_time() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
r = simulate(s, spec.costs, spec.mem)
lim = s.meta.get("mem_limit", spec.mem_limit)
bound = term = None
if vpp > 1:
    b = lower_bound(replace(spec, mem_limit=lim, options={}), s.placement)
    bound, term = b.value, b.term
print(json.dumps({"makespan": r.makespan, "peak": max(r.peak_memory), "limit": lim, "bound": bound, "term": term,
                  "cpu_s": cpu, "rss_mb": rss}))
"""


def plan_in_child(name: str, pp: int, vpp: int, m: int, costs: str, limit, options: dict | None = None,
                  timeout: float | None = None) -> dict | None:
    """Plan ``name`` (pipeloom's registry, ``options`` as ``-O``) in a fresh process, so that nothing an earlier
    plan cached counts, and simulate it: ``makespan``, ``peak``, the ``limit`` it planned under, the proven
    ``bound`` at that limit and its ``term`` (``lower_bound``; None at vpp 1), the plan's ``cpu_s`` and the
    process's peak RSS after planning (``rss_mb``). None when it ran past ``timeout`` seconds."""
    try:
        out = subprocess.run([sys.executable, "-c", _PLAN_CHILD, json.dumps([name, pp, vpp, m, costs, limit, options])],
                             check=True, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


__all__ = ["alternate", "median", "paired_ratios", "plan_in_child", "quartiles", "ratio_summary", "round_orders",
           "timed", "write_json", "write_section", "write_text"]
