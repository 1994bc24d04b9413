"""``--costs measured``: the per-chunk fit on synthetic logs (no torch) and the whole run path (gloo)."""
from __future__ import annotations

import json

import pytest

from pipeloom.core.costs import Costs
from pipeloom.schedule.planning import make_spec, plan
from pipeloom.trace.check import fit_chunk_costs
from pipeloom.trace.reader import read_logs
from pipeloom.trace.synth import SynthConfig, write_logs


@pytest.mark.parametrize("name,vpp", [("zbv", 2), ("1f1b", 1), ("interleaved", 2)])
def test_fit_recovers_known_per_chunk_costs(tmp_path, name, vpp):
    pp = 2
    nc = pp * vpp
    # heterogeneous chunks, as with an embedding on the first and the head on the last chunk
    F = [3.0, 1.0, 1.5, 4.0][:nc]
    B = [2.0, 1.0, 2.5, 5.0][:nc]
    W = [1.0, 0.5, 1.5, 2.0][:nc]
    true = Costs(F=F, B=B, W=W, comm=0.5)
    sched = plan(name, make_spec(pp=pp, microbatches=8, vpp=vpp))
    unit = 0.002  # seconds per cost unit in the synthetic log
    write_logs(str(tmp_path), sched, SynthConfig(costs=true, unit=unit, jitter=0.0, profile_steps=(1, 4)))
    fit = fit_chunk_costs(read_logs(str(tmp_path)), unit=unit)
    fF, fB, fW = fit.per_chunk(nc)
    if any(j.kind.value == "BW" for seq in sched.devices for j in seq):  # fused backward: B+W split half/half
        for c in range(nc):
            assert fF[c] == pytest.approx(F[c], rel=1e-3)
            assert fB[c] + fW[c] == pytest.approx(B[c] + W[c], rel=1e-3)
    else:
        assert (fF, fB, fW) == (pytest.approx(F, rel=1e-3), pytest.approx(B, rel=1e-3), pytest.approx(W, rel=1e-3))
    assert fit.comm == pytest.approx(0.5, rel=0.05)


def test_fit_refuses_logs_without_a_complete_step(tmp_path):
    from pipeloom.trace.check import CheckError

    sched = plan("1f1b", make_spec(pp=2, microbatches=4))
    write_logs(str(tmp_path), sched, SynthConfig(jitter=0.0))
    run = read_logs(str(tmp_path))
    with pytest.raises(CheckError, match="no complete step"):
        fit_chunk_costs(run, [])
