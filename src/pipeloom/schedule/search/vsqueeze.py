"""The squeezes of the building blocks (private helper of :mod:`.vblock`, no torch).

A block's repeated pattern is a slot table ``T[d][type][mb]`` (types F0, F1, B1, B0 and, before the second
squeeze, W of chunk 1 and W of chunk 0; see :mod:`.vblock`). The squeezes move the warm-up and cool-down jobs
of that table to earlier free slots after what they wait for (:func:`_deps`: the row's previous job and
the jobs that complete the events it needs, :func:`pipeloom.core.rules.needs` read from the timing
kernel's tables) where the device's memory stays within the cap:

* :func:`_squeeze`: memory counted slot by slot (W where it runs, or right after its B without W rows:
  :func:`_type_mem`);
* :func:`_squeeze_implicit_w`: cool-down only, F and B, W in the free slots (the one walk of a row's memory
  with W in its free slots, :func:`_w_walk`, over the whole row or, incrementally, over the slots a move changes).

Both walk the jobs in time order without the steady phase (:func:`_unsteady_jobs`). Their compiled forms in
``_accel.c`` (``vblock_squeeze``, ``vblock_squeeze_w``) run whenever the extension is built; the Python forms
(``*_py``) are the reference, run without the extension and held to the compiled ones (the same slots) by
tests/schedule/test_vblock_c.py. The tables both read (the job walk, the dependency pairs, the memory change of
each type) are made here once; each form writes the move rule once (one free-slot search, one memory walk).
"""
from __future__ import annotations

from functools import lru_cache

from ...core import rules
from ...core.ir import Kind, Placement
from ...sim import kernel
from .accel import accelerated, ext

_F0, _F1, _B1, _B0 = 0, 1, 2, 3


def _deps(T, pp, d, k, j) -> int:
    """The latest slot of what job ``j`` of type ``k`` on device ``d`` waits for: the job before it in its row
    and the jobs that complete the events it needs (:func:`_dep_table`)."""
    dep = T[d][k][j - 1] if j else -1
    for d2, k2 in _dep_table(pp)[d][k]:
        x = T[d2][k2][j]
        if x > dep:
            dep = x
    return dep


@lru_cache(maxsize=64)
def _dep_table(pp: int) -> tuple[tuple[tuple[tuple[int, int], ...], ...], ...]:
    """Per device and type (F0, F1, B1, B0, W of chunk 1, W of chunk 0), the (device, type) of the jobs that complete
    the events it needs: :func:`pipeloom.core.rules.needs` as the timing kernel's tables read it (V placement,
    two chunks per device: local chunk 0 = chunk d, local chunk 1 = chunk 2pp-1-d)."""
    nc = 2 * pp
    tables = kernel.Rules.make(pp, nc, Placement.V)
    kinds = (Kind.F, Kind.F, Kind.B, Kind.B, Kind.W, Kind.W)
    local1 = (False, True, True, False, True, False)
    where = {}  # (kind, chunk) -> (device, type)
    for d in range(pp):
        for k in range(4):
            where[(kinds[k], nc - 1 - d if local1[k] else d)] = (d, k)
    made_by = {rules.ACT: Kind.F, rules.GRAD: Kind.B}  # the job of the block that completes each event
    out = []
    for d in range(pp):
        row = []
        for k in range(6):
            c = nc - 1 - d if local1[k] else d
            row.append(tuple(where[(made_by[ev], c + off)]
                             for ev, off, _cm in tables.needs[kernel.KIND_INDEX[kinds[k]] * nc + c]))
        out.append(tuple(row))
    return tuple(out)


def _squeeze(pp, m, T, dm, cap, ntypes, movable, warm=True):
    """Move warm-up and cool-down jobs (types in ``movable``) to the earliest free slot after their
    dependencies where the device's running memory stays within ``cap`` (in place).

    Without W jobs (``ntypes`` 4) memory is counted as if W ran right after its B (:func:`_type_mem`), so only
    moves that never raise memory (B) are made then. Runs the compiled form ``vblock_squeeze`` in ``_accel.c``
    or, without the extension, :func:`_squeeze_py` (the reference: the same slots, tests/schedule/test_vblock_c.py)."""
    xm = _type_mem(dm, ntypes)
    if accelerated():
        out = ext.vblock_squeeze(pp, m, ntypes, _flat(T, ntypes), [x for row in xm for x in row], float(cap),
                                 list(_unsteady_jobs(T, pp, ntypes, m)), _dep_flat(pp),
                                 [int(k in movable) for k in range(ntypes)], bool(warm))
        _unflat(T, out, pp, ntypes, m)
        return
    _squeeze_py(pp, m, T, xm, cap, ntypes, movable, warm)


def _type_mem(dm, ntypes: int) -> list[list[float]]:
    """Per device, the memory change the first squeeze counts at each type's slot: ``dm`` itself with W rows
    (``ntypes`` 6); without them (4) a B's change includes its W's (W counted right after its B)."""
    if ntypes == 6:
        return [list(row[:6]) for row in dm]
    return [[row[_F0], row[_F1], row[_B1] + row[4], row[_B0] + row[5]] for row in dm]


def _flat(T, ntypes: int) -> list[int]:
    return [x for rows in T for row in rows[:ntypes] for x in row]


def _unflat(T, flat: list[int], pp: int, ntypes: int, m: int) -> None:
    for d in range(pp):
        for k in range(ntypes):
            at = (d * ntypes + k) * m
            T[d][k][:] = flat[at:at + m]


@lru_cache(maxsize=64)
def _dep_flat(pp: int) -> tuple[int, ...]:
    """:func:`_dep_table` as the compiled squeezes read it: per device and type two (device, type) pairs, -1 padded."""
    out: list[int] = []
    for row in _dep_table(pp):
        for pairs in row:
            flat = [x for pair in pairs for x in pair]
            out += flat + [-1] * (4 - len(flat))
    return tuple(out)


def _squeeze_py(pp, m, T, xm, cap, ntypes, movable, warm=True):
    """:func:`_squeeze` in Python (``xm``: :func:`_type_mem`)."""
    horizon = max(T[d][k][m - 1] for d in range(pp) for k in range(ntypes)) + 2
    occ = [bytearray(horizon) for _ in range(pp)]
    run = [[0.0] * horizon for _ in range(pp)]
    for d in range(pp):
        delta = [0.0] * (horizon + 1)
        for k in range(ntypes):
            x = xm[d][k]
            for t in T[d][k]:
                occ[d][t] = 1
                delta[t] += x
        cur = 0.0
        r = run[d]
        for t in range(horizon):
            cur += delta[t]
            r[t] = cur
    if horizon >= VECTOR_HORIZON:
        # long rows: a move adds its memory to every slot it crosses (pp 128, m 512: 115 000 moves over
        # 27 million slots), done on an array (the same float64 sums, in C)
        import numpy as np

        run = [np.array(r, dtype=np.float64) for r in run]
    vec = horizon >= VECTOR_HORIZON
    mov = [k in movable for k in range(ntypes)]
    for t, d, k, j, cool in _unsteady_jobs(T, pp, ntypes, m):
        if not mov[k] or not (warm or cool):
            continue
        dep = _deps(T, pp, d, k, j)
        x = xm[d][k]
        o = occ[d]
        r = run[d]
        s = o.find(0, dep + 1, t) if dep + 1 < t else -1  # the free slots, found in C (the block is dense)
        while s >= 0:
            if x > 0 and (r[s:t].max() if vec else max(r[s:t])) + x > cap + 1e-9:
                s = o.find(0, s + 1, t) if s + 1 < t else -1
                continue
            o[t] = 0
            o[s] = 1
            if not vec:
                for u in range(s, t):
                    r[u] += x
            else:
                r[s:t] += x
            T[d][k][j] = s
            break


#: rows of at least this many slots keep their running memory in an array in :func:`_squeeze`
VECTOR_HORIZON = 1024


def _unsteady_jobs(T, pp: int, ntypes: int, m: int):
    """The jobs of the block that the squeezes may move, in time order, ``(t, d, k, j, cool)``: every job but
    the steady phase's, which runs from device 0's first B0 (while it still has forwards left) until its last
    F0 (that job included); ``cool``: after it.

    In time order ``(t, d, k, j)`` of the table as given (rows rise, and a move never passes the row's previous
    job: :func:`_deps`), the steady phase is one interval, from ``K1 = (T[0][B0][0], 0, B0, 0)`` to
    ``K2 = (T[0][F0][m-1], 0, F0, m-1)``: the warm-up is each row's prefix below K1, the cool-down its suffix
    above K2, sorted together. When K2 comes first the steady phase never starts and every job is warm-up
    (pp 128, m 512: 1.3 million jobs walked -> 0.2 million). (tests/schedule/test_vblock_c.py holds this
    against a walk of every job in time order that tracks the phase.)"""
    k1 = (T[0][_B0][0], 0, _B0, 0)
    k2 = (T[0][_F0][m - 1], 0, _F0, m - 1)
    if k2 < k1:
        every = sorted((row[j], d, k, j) for d in range(pp) for k, row in enumerate(T[d][:ntypes]) for j in range(m))
        for t, d, k, j in every:
            yield t, d, k, j, False
        return
    warm, cool = [], []
    for d in range(pp):
        for k in range(ntypes):
            row = T[d][k]
            for j in range(m):
                key = (row[j], d, k, j)
                if key >= k1:
                    break
                warm.append(key)
            for j in range(m - 1, -1, -1):
                key = (row[j], d, k, j)
                if key <= k2:
                    break
                cool.append(key)
    warm.sort()
    cool.sort()
    for t, d, k, j in warm:
        yield t, d, k, j, False
    for t, d, k, j in cool:
        yield t, d, k, j, True


def _squeeze_implicit_w(pp, m, T, dm, cap):
    """Second squeeze (cool-down only, F and B, no W jobs): a move is kept when the device's peak, with W
    in the free slots, stays within ``cap`` (in place). Runs the compiled form ``vblock_squeeze_w`` in
    ``_accel.c`` or, without the extension, :func:`_squeeze_implicit_w_py` (the reference)."""
    if accelerated():
        out = ext.vblock_squeeze_w(pp, m, _flat(T, 4), [x for row in dm for x in row], float(cap),
                                   list(_unsteady_jobs(T, pp, 4, m)), _dep_flat(pp))
        _unflat(T, out, pp, 4, m)
        return
    _squeeze_implicit_w_py(pp, m, T, dm, cap)


def _squeeze_implicit_w_py(pp, m, T, dm, cap):
    """:func:`_squeeze_implicit_w` in Python."""
    horizon = max(T[d][k][m - 1] for d in range(pp) for k in range(4)) + 1
    rows = []
    for d in range(pp):
        row = [-1] * (horizon + 2 * m + 2)  # room for the W tail
        for k in range(4):
            for t in T[d][k]:
                row[t] = k
        rows.append(row)
    states = [_w_states(row, dm[d]) for d, row in enumerate(rows)]
    # a device already over ``cap`` keeps the whole-row check (a move might bring it under); the others
    # check only the slots a move changes (:func:`_move_fits`): the same answer in time ~ the distance moved
    # (pp 128, m 512: about 20 s -> 0.3 s)
    fast = [st[3] <= cap + 1e-9 for st in states]
    for t, d, k, j, cool in _unsteady_jobs(T, pp, 4, m):
        if not cool:
            continue
        dep = _deps(T, pp, d, k, j)
        row = rows[d]
        for s in range(dep + 1, t):
            if row[s] >= 0:
                continue
            row[s], row[t] = k, -1
            if fast[d]:
                ok = _move_fits(row, dm[d], states[d], s, t, cap)
                if ok:
                    _move_fits(row, dm[d], states[d], s, t, cap, update=True)
            else:  # the whole row; a kept move leaves it within the cap: from now on the device checks incrementally
                st = _w_states(row, dm[d])
                ok = st[3] <= cap + 1e-9
                if ok:
                    states[d], fast[d] = st, True
            if ok:
                T[d][k][j] = s
                break
            row[s], row[t] = -1, k


def _w_walk(row, dm, st, s: int, t: int, cap: float, update: bool) -> float | None:
    """THE walk of one device's memory with W in the free slots of ``row`` (the types per slot, -1 = free; a free
    slot runs one due W, chunk 1's first, oldest B first), from slot ``s`` on, starting from the state ``st``
    (per slot the chunk-1 and chunk-0 W still due and the memory level after it, :func:`_w_states`) held before
    ``s``. Past slot ``t`` it stops where its state equals ``st`` (from there on nothing differs). Returns the
    peak over the job slots walked, or None as soon as one exceeds ``cap`` (unless ``update``: then ``st`` is
    rewritten with the new states instead)."""
    s1, s0, lv = st[0], st[1], st[2]
    if s:
        due1, due0, cur = s1[s - 1], s0[s - 1], lv[s - 1]
    else:
        due1 = due0 = 0
        cur = 0.0
    pk = 0.0
    lim = cap + 1e-9
    d0, d1, d2, d3, d4, d5 = dm
    for i in range(s, len(row)):
        k = row[i]
        if k < 0:
            if due1:
                due1 -= 1
                cur += d4
            elif due0:
                due0 -= 1
                cur += d5
        else:
            cur += (d0, d1, d2, d3)[k]
            if k == 2:
                due1 += 1
            elif k == 3:
                due0 += 1
            if cur > pk:
                pk = cur
            if cur > lim and not update:
                return None
        if i > t and due1 == s1[i] and due0 == s0[i] and abs(cur - lv[i]) <= 1e-12:
            return pk
        if update:
            s1[i], s0[i], lv[i] = due1, due0, cur
    return pk


def _w_states(row, dm) -> tuple[list[int], list[int], list[float], float]:
    """:func:`_w_walk` over the whole of ``row``: after each slot the chunk-1 and chunk-0 W still due and the
    memory level; and the peak (over job slots: a free slot's W only lowers the level)."""
    n = len(row)
    st = ([0] * n, [0] * n, [0.0] * n)
    pk = _w_walk(row, dm, st, 0, n, float("inf"), True)
    return st[0], st[1], st[2], pk


def _peak_implicit_w(row, dm) -> float:
    """Peak memory of one device whose slots hold the types in ``row`` (-1 = free), W in the free slots."""
    return _w_states(row, dm)[3]


def _move_fits(row, dm, st, s, t, cap, update=False) -> bool:
    """Whether ``row`` (changed at slots ``s`` < ``t`` only, from a row whose peak was within ``cap``, with
    ``st`` its :func:`_w_states`) still peaks within ``cap``: :func:`_w_walk` from slot ``s`` until, past ``t``,
    its state equals the old one. With ``update`` ``st`` is rewritten for the new row instead (the move is kept)."""
    return _w_walk(row, dm, st, s, t, cap, update) is not None
