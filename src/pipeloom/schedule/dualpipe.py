"""DualPipeV: DualPipe's V variant (DeepSeek-V3 report; deepseek-ai/DualPipe, ``DualPipeV``).

V placement with two chunks per device: device d holds chunk ``c0 = d`` (the forward goes down
devices 0..pp-1) and chunk ``c1 = 2pp-1-d`` (it comes back up). In the steady phase a device
runs the forward of one microbatch and the backward of another as one *overlapped pair*
(``Schedule.overlapped``): the simulator starts both together and charges ``d1 + d2 - hidden``. With the
all-to-all of each job given (``Costs.a2a_F``/``a2a_B``: a MoE layer's dispatch and combine, which the pair
exists to hide, DeepSeek-V3 report sec. 3.2.1) ``hidden = min(comm1, compute2) + min(comm2, compute1)``
(:func:`pipeloom.core.costs.pair_hidden`); without it, ``hidden = overlap * min(d1, d2)`` with the
constant cost option (0 = no overlap, 1 = the shorter job fully hidden behind the longer one).

Phase program of device d (counts per device; ``F0``/``F1`` = forward on c0/c1, ``BW`` = fused
backward, ``B``/``W`` = split backward whose W is deferred to fill a bubble, W in FIFO order):

    1  2(pp-d-1) x  F0                                   warm-up down the V
    2  (d+1)     x  F0 F1
    3  (pp-d-1)  x  B1 W1 F1                             zero-bubble: W covers the wait for F1's input
    4  m-2pp+d+1 x  [F0 & BW1] [F1 & BW0]                main phase: two overlapped pairs
                    (the last device runs its first F0, BW1 one after the other)
    5  (pp-d-1)  x  BW1 [F1 & BW0]
    6  (d+1)     x  B1 B0        the second half defers W (split B/W), the first half is fused BW
    7  (pp-d-1)  x  W B0         (split)
    8  (d+1)     x  W

Every chunk sees m forwards and m backwards (the counts add up for any d). DualPipeV needs
``m >= 2pp``; for fewer microbatches pipeloom builds the program for 2pp microbatches and drops
the jobs of microbatches m..2pp-1: a subsequence of a valid schedule stays valid (the remaining
jobs keep their relative order) and its memory can only drop (a dropped microbatch held memory
from its F to its W), so any m >= 1 works.

DeepSeek's bubble for DualPipe (their F, B = full backward, W, F&B = an overlapped pair):
``(PP/2 - 1)(F&B + B - 3W)``. DualPipeV on ``pp`` devices is DualPipe on 2pp ranks cut in half, so
in pipeloom's terms (B input grad only, DeepSeek's B = B + W) it reads
``(pp - 1)(F&B + (B + W) - 3W)`` with ``F&B = F + (B + W) - overlap * min(F, B + W)``. The
simulated bubble of every device (makespan - busy) equals it exactly when F = B and W <= F, for any
overlap and m >= 2pp (tests/schedule/test_dualpipe.py; measured table in docs/readme/45-optimal-dualpipe.md).
"""
from __future__ import annotations

from ..core.ir import BW, B, F, Job, Placement, W, Schedule
from .registry import Option, PlanSpec, register
from ..core.errors import ScheduleError
from ..core.limits import MAX_SOLVER_SECONDS
from ..sim.simulate import memory_profile


def dualpipev_program(pp: int, m: int, d: int) -> tuple[list[Job], set[int]]:
    """Jobs of device ``d`` (needs ``m >= 2pp``) and the indices that start an overlapped pair."""
    if m < 2 * pp:
        raise ScheduleError(f"dualpipev_program needs microbatches >= 2*pp = {2 * pp}, got {m}")
    c0, c1 = d, 2 * pp - 1 - d
    nf = [0, 0]  # next forward microbatch per phase
    nb = [0, 0]  # next backward microbatch per phase
    wq: list[Job] = []  # deferred weight-grad jobs, FIFO
    seq: list[Job] = []
    pairs: set[int] = set()
    chunk = (c0, c1)

    def fwd(ph: int) -> Job:
        j = F(nf[ph], chunk[ph])
        nf[ph] += 1
        return j

    def bwd(ph: int, zb: bool) -> list[Job]:
        mb = nb[ph]
        nb[ph] += 1
        if zb:
            wq.append(W(mb, chunk[ph]))
            return [B(mb, chunk[ph])]
        return [BW(mb, chunk[ph])]

    def pair(f_ph: int, b_ph: int) -> None:
        pairs.add(len(seq))
        seq.append(fwd(f_ph))
        seq.extend(bwd(b_ph, False))

    for _ in range(2 * (pp - d - 1)):            # 1
        seq.append(fwd(0))
    for _ in range(d + 1):                       # 2
        seq += [fwd(0), fwd(1)]
    for _ in range(pp - d - 1):                  # 3
        seq.extend(bwd(1, True))
        seq.append(wq.pop(0))
        seq.append(fwd(1))
    for i in range(m - 2 * pp + d + 1):          # 4
        if i == 0 and d == pp - 1:
            seq.append(fwd(0))
            seq.extend(bwd(1, False))
        else:
            pair(0, 1)
        pair(1, 0)
    for _ in range(pp - d - 1):                  # 5
        seq.extend(bwd(1, False))
        pair(1, 0)
    zb = False                                   # 6
    for i in range(d + 1):
        if i == (d + 1) // 2 and d % 2 == 1:
            zb = True
        seq.extend(bwd(1, zb))
        if i == (d + 1) // 2 and d % 2 == 0:
            zb = True
        seq.extend(bwd(0, zb))
    for _ in range(pp - d - 1):                  # 7
        seq.append(wq.pop(0))
        seq.extend(bwd(0, True))
    while wq:                                    # 8
        seq.append(wq.pop(0))
    assert nf == [m, m] and nb == [m, m], (nf, nb)
    return seq, pairs


#: DualPipeV with fewer than 2pp microbatches builds the 2pp-microbatch program on every device and drops the
#: microbatches it does not have: pp * 2pp job slots, quadratic in pp (pp 1024: about 6 s, pp 2048: 25 s)
MAX_PROGRAM_SLOTS = 1 << 21


def _shapes(pp: int, vpp: int, m: int, options: dict) -> str | None:
    """dualpipev's declared shapes: at most :data:`MAX_PROGRAM_SLOTS` slots of the program it builds."""
    slots = pp * max(m, 2 * pp)
    if m < 2 * pp and slots > MAX_PROGRAM_SLOTS:
        return (f"dualpipev: pp={pp} with m={m} < 2pp builds the {2 * pp}-microbatch program on every device "
                f"({slots} slots, quadratic in pp; at most {MAX_PROGRAM_SLOTS}): give m >= 2pp = {2 * pp} or "
                f"pp <= {int((MAX_PROGRAM_SLOTS / 2) ** 0.5)}")
    return None


@register("dualpipev", description="DualPipeV (DeepSeek): V placement, F and B of different microbatches "
                                   "overlapped in pairs (cost option overlap), any m (best m >= 2pp)", vpp="2",
          placement=Placement.V,
          options=(Option(name="overlap_pairs", type="bool", default=True,
                          help="overlap F and B of different microbatches in pairs (false: same order, no pairs)"),
                   Option(name="reorder", type="float", default=0.0, min=0, max=MAX_SOLVER_SECONDS,
                          help="seconds of local search after the order is built (single jobs moved within their "
                               "device while the makespan, or the sum of finish times, shrinks; the memory limit, "
                               "else DualPipeV's own peak, and the pairs are kept); 0: DualPipeV's order as published")),
          shapes=_shapes)
def dualpipev(spec: PlanSpec) -> Schedule:
    """DualPipeV schedule; ``spec.costs.overlap`` sets how much of each pair is hidden.

    Option ``overlap_pairs`` (default True): False runs the same order without overlapped pairs (with
    ``overlap = 0`` the pairs hide nothing and only make F wait for B). Option ``reorder`` (seconds, default 0)
    moves single jobs afterwards (:func:`pipeloom.schedule.search.reorder.reorder`) under the memory limit
    (without one: under DualPipeV's own peak).
    """
    pp, m = spec.pp, spec.microbatches
    overlap_pairs = spec.options.get("overlap_pairs", True)
    if not isinstance(overlap_pairs, bool):
        raise ScheduleError(f"dualpipev: option overlap_pairs must be true or false, got {overlap_pairs!r}")
    mm = max(m, 2 * pp)
    devices, overlapped = [], set()
    for d in range(pp):
        seq, pairs = dualpipev_program(pp, mm, d)
        if mm > m:
            keep = [i for i, j in enumerate(seq) if j.mb < m]
            new_index = {old: new for new, old in enumerate(keep)}
            pairs = {new_index[i] for i in pairs if i in new_index and i + 1 in new_index}
            seq = [seq[i] for i in keep]
        devices.append(tuple(seq))
        if overlap_pairs:
            overlapped |= {(d, i) for i in pairs}
    sched = Schedule("dualpipev", pp, 2, m, Placement.V, tuple(devices), frozenset(overlapped),
                     meta={"overlap": spec.costs.overlap, "padded_from": mm if mm > m else None})
    if spec.mem_limit is not None:
        peak = max(memory_profile(sched, spec.mem)[0])
        if peak > spec.mem_limit + 1e-9:
            raise ScheduleError(
                f"dualpipev needs {peak:g} units of activation memory (= {peak / pp:g}p) at pp={pp} m={m}, above "
                f"the limit {spec.mem_limit:g}; DualPipeV's order is fixed: use zbv, vhalf or vmin for tighter limits")
    seconds = float(spec.options.get("reorder", 0.0))
    if seconds > 0:
        from .search.reorder import reorder
        own = max(memory_profile(sched, spec.mem)[0])  # no limit given: never more than DualPipeV's own peak
        sched = reorder(sched, spec.costs, spec.mem, limit=own if spec.mem_limit is None else spec.mem_limit,
                        budget_s=seconds)
    return sched
