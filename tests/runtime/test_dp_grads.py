"""The data-parallel reducers in ONE process (a world of size 1): chunk segments of the gradient
buffer, and the overlapped reducer's timing: each chunk's reduction starts right after the chunk's
last W/BW on the rank, exactly once, with the chunk's final gradients (a recording collective)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from fuzzplans import random_plan
from pipeloom.core.ir import Kind
from pipeloom.models.llama import LlamaConfig, build_chunk_modules, build_reference, even_layer_split, loss_fn, synthetic_batch
from pipeloom.runtime import PipelineExecutor, reference_step
from pipeloom.runtime.grads import (Arrivals, GradBuffer, OverlappedAllReduce, ZeroReduceScatter, barrier,
                                    chunk_segments, wait_named)
from pipeloom.runtime.launch import free_port
from pipeloom.runtime.p2p import PeerError

CFG = LlamaConfig(n_layers=6, dim=32, n_heads=4, n_kv_heads=2, max_seq_len=8)


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    torch.set_num_threads(threads)


def test_segments_group_by_first_chunk_pad_and_wait_for_sharing_chunks():
    a, b, shared, c = (nn.Parameter(torch.zeros(n)) for n in (3, 5, 2, 7))
    chunks = {0: [a, shared], 2: [b, shared], 5: [c]}
    segs = chunk_segments([a, shared, b, c], chunks, 4)
    assert [(s.chunk, s.start, s.n, s.end) for s in segs] == [(0, 0, 5, 8), (2, 8, 5, 16), (5, 16, 7, 24)]
    assert segs[0].waits == {0, 2} and segs[1].waits == {2} and segs[2].waits == {5}
    buf = GradBuffer([a, shared, b, c], chunks, torch.device("cpu"))
    assert buf.flat.numel() == 17  # no padding until a reducer asks for it
    buf.align(4)
    assert buf.flat.numel() == 24
    for p in (a, shared, b, c):  # every view still lies inside its chunk's segment, none overlap
        buf[p].fill_(1.0)
    assert buf.flat.sum().item() == 17
    assert buf.flat[5:8].abs().sum().item() == 0 and buf.flat[13:16].abs().sum().item() == 0  # padding


class _Recording(OverlappedAllReduce):
    """An overlapped reducer that pretends to have 2 replicas: its "collective" copies the slice at
    launch time (what a real all-reduce would send) and completes at once."""

    def __init__(self, events: list) -> None:
        super().__init__(None)
        self.size, self.arrivals, self.events = 2, Arrivals(None, "test"), events

    def _collective(self, seg):
        self.events.append(("launch", seg.chunk, self.buffer.flat[seg.start:seg.end].clone()))

        class Done:
            def wait(self, timeout=None):
                return True
        return Done()

    def _after(self) -> None:
        pass


@pytest.mark.parametrize("split,seed", [(0.0, 1), (0.6, 4), (1.0, 7)])
def test_overlap_starts_each_chunk_once_after_its_last_weight_grad_job_with_final_grads(split, seed):
    sched = random_plan(1, 3, 3, seed=seed, split=split)
    events: list = []
    mods = build_chunk_modules(CFG, even_layer_split(CFG.layers, sched.num_chunks))
    red = _Recording(events)
    ex = PipelineExecutor(sched, dict(enumerate(mods)), loss_fn, pp_rank=0, pp_ranks=[0], reducer=red,
                          on_job=lambda job, run: (events.append(("job", job)), run(job)))
    x, y = synthetic_batch(CFG, 2 * sched.microbatches, 8, seed=seed)
    xs, ys = list(x.chunk(sched.microbatches)), list(y.chunk(sched.microbatches))
    ex.step(xs, ys)
    # expected from the job list alone: after the last W/BW of chunk k, chunk k's launch
    jobs = list(sched.devices[0])
    want = []
    for i, j in enumerate(jobs):
        want.append(("job", j))
        if j.kind in (Kind.W, Kind.BW) and not any(n.chunk == j.chunk and n.kind in (Kind.W, Kind.BW)
                                                   for n in jobs[i + 1:]):
            want.append(("launch", j.chunk))
    assert [e[:2] for e in events] == want
    assert any(e[0] == "job" for e in events[events.index(next(e for e in events if e[0] == "launch")):]), \
        "the first reduction starts before the last job (it overlaps the drain)"
    # what was sent at launch is the chunk's final gradient: the single-process reference's
    _, ref = reference_step(build_reference(CFG), loss_fn, xs, ys)
    names = {p: n for m in mods for n, p in m.named_parameters()}
    for _, k, sent in (e for e in events if e[0] == "launch"):
        seg = next(s for s in ex.grads.segments if s.chunk == k)
        want_flat = torch.cat([ref[names[p]].flatten() for p in seg.params])
        torch.testing.assert_close(sent[:seg.n], want_flat, atol=1e-5, rtol=1e-5)


def test_zero_shards_tile_each_padded_segment():
    ps = [nn.Parameter(torch.zeros(n)) for n in (5, 3, 9)]
    buf = GradBuffer(ps, {0: ps[:2], 1: ps[2:]}, torch.device("cpu"))
    red = ZeroReduceScatter(None)
    red.size = 3
    buf.align(3)
    red.buffer = buf
    for seg in buf.segments:
        shards = []
        for r in range(3):
            red.rank = r
            shards.append(red.shard(seg))
        assert shards[0][0] == seg.start and shards[-1][1] == seg.end
        assert all(shards[i][1] == shards[i + 1][0] for i in range(2))
        assert len({hi - lo for lo, hi in shards}) == 1


def test_a_wait_that_times_out_names_the_collective():
    class Never:
        def wait(self, timeout=None):
            return False
    with pytest.raises(PeerError, match=r"rank 0: step 3: data-parallel all-reduce of chunk 1: timed out after 0.5s"):
        wait_named(Never(), 0.5, "step 3: data-parallel all-reduce of chunk 1", Arrivals(None, "t"))
    barrier(None, 5.0, "a barrier of one")  # passes at once


@pytest.mark.parametrize("kw,match", [(dict(zero=2), "zero must be 0"), (dict(rank_order="pp"), "rank order must be")])
def test_run_config_rejects_bad_dp_options(kw, match):
    from pipeloom.runtime.driver import RunConfig
    with pytest.raises(ValueError, match=match):
        RunConfig(**kw)


def test_cli_run_rejects_zero_2(capsys):
    from pipeloom.cli import main
    with pytest.raises(SystemExit) as e:
        main(["run", "--zero", "2"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeloom: error:") and "--zero" in err and err.count("\n") == 1
