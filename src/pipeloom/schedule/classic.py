"""Classic schedules: FThenB (GPipe), 1F1B, eager 1F1B, interleaved VPP (Megatron), any m.

All use the fused backward BW (input and weight grad together), like their originals.

Interleaved order: microbatches are taken in groups; inside a group
a device runs the group's forwards on its local chunk 0, then chunk 1, ... (backward: last chunk
first). With m % pp == 0 every group has pp microbatches (Megatron's balanced VPP:
``vpp_stage = (k % (pp*vpp)) // pp``). With m % pp != 0 the remainder is not left as a short
last group (the "remainder last" layout, whose long tail gave a 26% bubble): the r extra
microbatches are spread evenly over the groups, so every group has at least pp
microbatches and the steady phase keeps the balanced bubble (14% there). Option
``remainder="last"`` reproduces the old behaviour for comparison.
Warm-up forwards on device d: ``2*(pp-d-1) + (vpp-1)*g0`` (g0 = first group size; Megatron's
formula with g0 = pp), then one forward / one backward, then the cool-down backwards.
"""
from __future__ import annotations

from ..core.ir import BW, F, Placement, make_schedule
from .registry import Option, PlanSpec, register
from ..core.errors import ScheduleError


@register("fthenb", description="GPipe: all forwards, then all backwards (fused BW)", vpp="1")
def fthenb(spec: PlanSpec):
    pp, m = spec.pp, spec.microbatches
    devs = [[F(i, d) for i in range(m)] + [BW(i, d) for i in range(m)] for d in range(pp)]
    return make_schedule("fthenb", pp, 1, m, Placement.INTERLEAVED, devs)


def _one_f_one_b(pp: int, m: int, warmup_of) -> list[list]:
    devs = []
    for d in range(pp):
        w = min(warmup_of(d), m)
        seq = [F(i, d) for i in range(w)]
        for i in range(m - w):
            seq += [F(w + i, d), BW(i, d)]
        seq += [BW(i, d) for i in range(m - w, m)]
        devs.append(seq)
    return devs


@register("1f1b", description="1F1B (PipeDream-flush): pp-d-1 warm-up forwards, then one forward one backward",
          vpp="1")
def one_f_one_b(spec: PlanSpec):
    pp, m = spec.pp, spec.microbatches
    return make_schedule("1f1b", pp, 1, m, Placement.INTERLEAVED, _one_f_one_b(pp, m, lambda d: pp - d - 1))


@register("eager1f1b", description="eager 1F1B: 2(pp-d)-1 warm-up forwards, more memory, hides comm latency",
          vpp="1")
def eager_one_f_one_b(spec: PlanSpec):
    pp, m = spec.pp, spec.microbatches
    return make_schedule("eager1f1b", pp, 1, m, Placement.INTERLEAVED,
                         _one_f_one_b(pp, m, lambda d: 2 * (pp - d) - 1))


def microbatch_groups(m: int, pp: int, remainder: str = "spread") -> list[list[int]]:
    """Split microbatches 0..m-1 into consecutive groups (see module docstring)."""
    if remainder not in ("spread", "last"):
        raise ScheduleError(f"remainder must be 'spread' or 'last', got {remainder!r}")
    q, r = divmod(m, pp)
    if q == 0:
        sizes = [r]
    elif remainder == "last":
        sizes = [pp] * q + ([r] if r else [])
    else:
        sizes = [pp + r // q + (1 if i < r % q else 0) for i in range(q)]
    groups, start = [], 0
    for s in sizes:
        groups.append(list(range(start, start + s)))
        start += s
    return groups


@register("interleaved", description="interleaved 1F1B (Megatron VPP), any vpp (default 2), any m (remainder spread)",
          vpp="any", default_vpp=2, placement=Placement.INTERLEAVED,
          options=(Option(name="remainder", type="choice", choices=("spread", "last"), default="spread",
                          help="microbatches beyond a multiple of pp: spread over the groups, or a short last group"),))
def interleaved(spec: PlanSpec):
    pp, vpp, m = spec.pp, spec.vpp, spec.microbatches
    remainder = spec.options.get("remainder", "spread")
    if remainder == "last" and m % pp:
        # the old behaviour: the short last group is laid out as if padded to pp microbatches,
        # then the padding's jobs are deleted (removing whole microbatches keeps the order deadlock-free)
        padded = -(-m // pp) * pp
        groups = microbatch_groups(padded, pp, remainder)
    else:
        groups = microbatch_groups(m, pp, remainder)
    devs = []
    for d in range(pp):
        chunks = [d + v * pp for v in range(vpp)]  # interleaved placement: local chunk v = global d + v*pp
        fwd = [F(mb, chunks[v]) for g in groups for v in range(vpp) for mb in g]
        bwd = [BW(mb, chunks[v]) for g in groups for v in reversed(range(vpp)) for mb in g]
        total = len(fwd)
        if vpp == 1:
            w = pp - d - 1
        else:
            w = 2 * (pp - d - 1) + (vpp - 1) * len(groups[0])
        w = min(w, total)
        seq = fwd[:w]
        for i in range(total - w):
            seq += [fwd[w + i], bwd[i]]
        seq += bwd[total - w:]
        devs.append([j for j in seq if j.mb < m])
    name = "interleaved"
    return make_schedule(name, pp, vpp, m, Placement.INTERLEAVED, devs)
