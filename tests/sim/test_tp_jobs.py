"""Per-job durations under the TP overlap modes (pipeloom.sim.tp_jobs), by hand, and the simulated ordering of
the modes against the committed measurement of bench/tp_overlap.py (docs/bench/tp_overlap.md)."""
from __future__ import annotations

import importlib.util
import pathlib

import pytest

from pipeloom.core.ir import Job, Kind, Placement, Schedule
from pipeloom.sim.tp_jobs import TPJobTerms, chunked_exposed, fused_pairs, tp_job_durations

F, B, W, BW = Kind.F, Kind.B, Kind.W, Kind.BW
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _sched(*jobs, m=3, nc=1):
    return Schedule(name="t", pp=1, vpp=nc, microbatches=m, placement=Placement.INTERLEAVED,
                    devices=(tuple(Job(k, mb, c) for k, mb, c in jobs),))


def _dur(sched, mode, comm=4.0, share=0.5, k=1, dB=2.0, dW=3.0):
    nc = sched.num_chunks
    return tp_job_durations(sched, [1.0] * nc, [dB] * nc, [dW] * nc, TPJobTerms(comm, share, mode, k))


# F0 F1 B0 W0 B1 W1: both Bs have their own W next (the runtime fuses them); F2 B2 ... W2 last: split
PLAN = _sched((F, 0, 0), (F, 1, 0), (B, 0, 0), (W, 0, 0), (F, 2, 0), (B, 1, 0), (B, 2, 0), (W, 1, 0), (W, 2, 0))


def test_fused_pairs_are_a_b_with_its_own_w_next():
    assert fused_pairs(PLAN.devices) == {(0, 2)}


def test_durations_by_hand_per_mode():
    # comm 4, column share 0.5: column wgrad of a W = 1.5, column dgrad of a B = 1.0
    off, _ = _dur(PLAN, "off")
    assert off[0] == [1, 1, 2 + 4, 3, 1, 2 + 4, 2 + 4, 3, 3]
    asy, det = _dur(PLAN, "async")
    assert asy[0][2] == pytest.approx(2 + (4 - 1.5))    # fused with its W: the wgrad hides 1.5
    assert asy[0][5] == asy[0][6] == 6                   # split B: nothing hides the collective
    assert det["tp_fused_b"] == 1
    ch, _ = _dur(PLAN, "chunked", k=2)
    assert ch[0][2] == pytest.approx(2 + 2.5)           # fused: as async, no token pieces
    assert ch[0][5] == pytest.approx(2 + chunked_exposed(4, 1.0, 2)) == pytest.approx(2 + 2 + 1.5)
    bw = _sched((F, 0, 0), (BW, 0, 0), m=1)
    assert _dur(bw, "off")[0][0][1] == 2 + 3 + 4 and _dur(bw, "async")[0][0][1] == pytest.approx(2 + 3 + 2.5)


def test_fill_moves_pending_w_into_b_as_the_runtime_takes_it():
    fill, det = _dur(PLAN, "fill")
    d = fill[0]
    # B1 (index 5): W1 is its own -> stop at once, nothing filled; B2 (6): W1 pending (B1 ran) -> 3 of W1,
    # then W2 is B2's own -> stop; every split B lasts B + comm, the moved work runs under the collective
    assert d[5] == 2 + 4 and d[6] == 2 + 4
    assert d[7] == 0.0 and d[8] == 3.0
    assert det["tp_fill_moved"] == pytest.approx(3.0)
    assert det["tp_exposed"] == pytest.approx((4 - 1.5) + 4 + (4 - 3))
    # fill moves W work, it does not remove it: the jobs sum to the off plan's minus the hidden 3 and 1.5
    assert sum(d) == pytest.approx(sum(_dur(PLAN, "off")[0][0]) - 3 - 1.5)
    # a BW of the same chunk between the B and the W: no fill (it adds to the same gradients first)
    s = _sched((F, 0, 0), (F, 1, 0), (F, 2, 0), (B, 0, 0), (B, 1, 0), (BW, 2, 0), (W, 0, 0), (W, 1, 0))
    d = _dur(s, "fill")[0][0]
    assert d[4] == 6 and d[6] == 3.0
    # a W whose B has not run yet is not taken
    s = _sched((F, 0, 0), (F, 1, 0), (B, 1, 0), (W, 0, 0), (B, 0, 0), (W, 1, 0), m=2)
    assert _dur(s, "fill")[0][0][3] == 3.0


def test_comm_per_chunk():
    s = _sched((F, 0, 0), (F, 0, 1), (B, 0, 1), (B, 0, 0), (W, 0, 1), (W, 0, 0), m=1, nc=2)
    d = tp_job_durations(s, [1, 1], [2, 2], [3, 3], TPJobTerms((1.0, 5.0), 0.5, "off"))[0][0]
    assert d[2] == 2 + 5 and d[3] == 2 + 1
    with pytest.raises(ValueError, match="3 values"):
        tp_job_durations(s, [1, 1], [2, 2], [3, 3], TPJobTerms((1.0, 5.0, 2.0), 0.5, "off"))
    for bad in (dict(comm=-1.0), dict(comm=1.0, col_share=2.0), dict(comm=1.0, mode="sometimes")):
        with pytest.raises(ValueError):
            TPJobTerms(**bad)


def _predict():
    path = ROOT / "bench" / "tp_overlap_predict.py"
    spec = importlib.util.spec_from_file_location("tp_overlap_predict", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_simulated_mode_ordering_matches_the_committed_measurement():
    """Every mode the bench measured faster than its blocking control on the emulated link is predicted faster
    too, and the three ratios come in the same order (the committed table, not a constant)."""
    mod = _predict()
    text = (ROOT / "docs" / "bench" / "tp_overlap.md").read_text(encoding="utf-8")
    got = mod.measured(text)
    pred = mod.predict(got)
    assert set(pred) == set(got["ratios"]) == {"async", "chunked", "fill"}
    for mode, ratio in got["ratios"].items():
        assert (pred[mode][2] < 1) == (ratio < 1), (mode, pred[mode], ratio)
    assert sorted(pred, key=lambda k: pred[k][2]) == sorted(got["ratios"], key=got["ratios"].get)
    # the predicted-beside-measured table in the docs is this prediction
    for line in mod.table(text).splitlines()[2:]:
        assert line in text, line


def _reg(sched, mode, regather, n=2, comm=4.0, share=0.5, dB=2.0, dW=3.0):
    nc = sched.num_chunks
    return tp_job_durations(sched, [1.0] * nc, [dB] * nc, [dW] * nc,
                            TPJobTerms(comm, share, mode, 1, regather=regather, regather_groups=n))


def test_regather_by_hand_per_job():
    """Sequence parallelism: W re-gathers the column groups' inputs double-buffered; a fused B or BW starts each
    gather before its group's dgrad; off runs them blocking; a W after its fused B has nothing left to gather."""
    # re-gather 2 in 2 groups (c = 1) under a W of 3 (1.5 per group): only the first gather shows
    off, det0 = _reg(PLAN, "off", 2.0)
    assert off[0][3] == 3 + 2 and off[0][7] == off[0][8] == 3 + 2 and det0["tp_regather_exposed"] == 6
    asy, det = _reg(PLAN, "async", 2.0)
    assert asy[0][7] == asy[0][8] == pytest.approx(3 + chunked_exposed(2.0, 3.0, 2)) == pytest.approx(3 + 1)
    # B0 fused with W0: its gathers under the column dgrad (share 0.5 x B 2 = 1): 2 - 1 exposed; W0 none
    assert asy[0][2] == pytest.approx(2 + (4 - 1.5) + (2 - 1)) and asy[0][3] == 3
    assert det["tp_regather_exposed"] == pytest.approx(1 + 1 + 1)
    # gathers longer than the GEMMs: 4 in 2 groups under a W of 3: 2 + max(0, 2 - 1.5)
    assert _reg(PLAN, "async", 4.0)[0][0][7] == pytest.approx(3 + 2.5)
    # none (kept inputs): the plain durations
    assert _reg(PLAN, "async", 0.0)[0] == _dur(PLAN, "async")[0]
    bw = _sched((F, 0, 0), (BW, 0, 0), m=1)
    assert _reg(bw, "async", 2.0)[0][0][1] == pytest.approx(2 + 3 + 2.5 + 1)


def test_fill_moves_only_row_parallel_work_when_inputs_are_gathered_again():
    # W1 movable: its row-parallel share (1 - 0.5) x 3 = 1.5, not the column groups whose inputs need a gather
    d, det = _reg(PLAN, "fill", 2.0)
    assert det["tp_fill_moved"] == pytest.approx(1.5)
    assert d[0][7] == pytest.approx(1.5 + chunked_exposed(2.0, 1.5, 2))


def test_bad_regather_is_refused():
    with pytest.raises(ValueError, match="finite number >= 0"):
        TPJobTerms(1.0, regather=-1.0)
    with pytest.raises(ValueError, match="groups"):
        TPJobTerms(1.0, regather=1.0, regather_groups=0)
