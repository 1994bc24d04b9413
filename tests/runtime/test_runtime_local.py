"""The executor in ONE process (a world of size 1, pp=1 with several chunks: every hand-off is local).

Fast checks of split backward (B then W later), BW, random job orders, bf16 master grads, the
job log and error paths, without spawning processes.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pipeloom.models.llama import LlamaConfig, build_chunk_modules, build_reference, even_layer_split, loss_fn, synthetic_batch
from pipeloom.runtime import NonFiniteLossError, PipelineExecutor, chunk_modules, reference_step
from pipeloom.trace.writer import JobLog
from pipeloom.runtime.launch import free_port
from fuzzplans import random_plan
from pipeloom.core.ir import Job, Kind, Schedule
from pipeloom.schedule import io as schedule_io

CFG = LlamaConfig(n_layers=6, dim=32, n_heads=4, n_kv_heads=2, max_seq_len=8)
ORIGINAL_LINEAR_FORWARD = nn.Linear.forward


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only add contention
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    torch.set_num_threads(threads)


def _data(m: int, seed: int = 0):
    x, y = synthetic_batch(CFG, 2 * m, 8, seed=seed)
    return list(x.chunk(m)), list(y.chunk(m))


def _run(sched: Schedule, seed: int = 0, **kw):
    split = even_layer_split(CFG.layers, sched.num_chunks)
    mods = build_chunk_modules(CFG, split, seed=seed)
    ex = PipelineExecutor(sched, dict(enumerate(mods)), loss_fn, pp_rank=0, pp_ranks=[0], **kw)
    xs, ys = _data(sched.microbatches, seed)
    loss = ex.step(xs, ys)
    return ex, loss, xs, ys


def _ref(seed, xs, ys):
    return reference_step(build_reference(CFG, seed=seed), loss_fn, xs, ys)


@settings(max_examples=10, deadline=None)
@given(vpp=st.integers(1, 3), m=st.integers(1, 4), seed=st.integers(0, 1000), split=st.sampled_from([0.0, 0.6, 1.0]))
def test_random_orders_match_reference(vpp, m, seed, split):
    sched = random_plan(1, vpp, m, seed=seed, split=split)
    ex, loss, xs, ys = _run(sched, seed=seed % 7)
    ref_loss, ref_grads = _ref(seed % 7, xs, ys)
    assert abs(loss - ref_loss) <= 1e-5
    names = set()
    for name, p in ex.named_parameters():
        names.add(name)
        assert (p.grad - ref_grads[name]).abs().max().item() <= 1e-5, name
    assert names == set(ref_grads)


def test_w_really_is_deferred():
    # B then W: after B only the non-linear params (norms, embedding) have their grads
    sched = Schedule("t", 1, 1, 1, "interleaved", ((Job(Kind.F, 0, 0), Job(Kind.B, 0, 0), Job(Kind.W, 0, 0)),))
    mods = build_chunk_modules(CFG, [list(range(CFG.layers))])
    ex = PipelineExecutor(sched, {0: mods[0]}, loss_fn, pp_rank=0, pp_ranks=[0])
    xs, ys = _data(1)
    ex._inputs, ex._targets = xs, ys
    ex._negotiate_shapes()
    ex._inp, ex._out, ex._local, ex._stash, ex._outbox = {}, {}, {}, {}, []
    ex._losses = torch.zeros(1)
    ex.grads.reset()
    ex.grads.lend()  # as step() does: autograd accumulates fp32 grads into the step buffer
    ex._run_f(Job(Kind.F, 0, 0))
    ex._run_b(Job(Kind.B, 0, 0))
    wq = mods[0].layers["0"].attn.wq.weight
    emb = mods[0].embed.weight
    assert ex.grads[wq].abs().sum() == 0 and ex.grads[emb].abs().sum() > 0
    assert len(ex._stash[(0, 0)]) > 0
    # the stash keeps data, not autograd history (that would hold the chunk's graph from B until W)
    assert all(x.grad_fn is None and not x.requires_grad for _, x, _dy in ex._stash[(0, 0)])
    assert all(dy is not None for _, _x, dy in ex._stash[(0, 0)])
    ex._run_w(Job(Kind.W, 0, 0))
    assert ex.grads[wq].abs().sum() > 0 and (0, 0) not in ex._stash


def test_linears_are_hooked_only_in_chunks_with_w_jobs():
    # chunk 0 splits its backward (B + W), chunk 1 runs BW: only chunk 0's linears are deferred,
    # by forward hooks on the instances: no forward is replaced, on the instances or on the class
    F0, F1 = Job(Kind.F, 0, 0), Job(Kind.F, 0, 1)
    sched = Schedule("t", 1, 2, 1, "interleaved", ((F0, F1, Job(Kind.BW, 0, 1), Job(Kind.B, 0, 0), Job(Kind.W, 0, 0)),))
    mods = build_chunk_modules(CFG, even_layer_split(CFG.layers, 2))
    ex = PipelineExecutor(sched, dict(enumerate(mods)), loss_fn, pp_rank=0, pp_ranks=[0])
    lin = [[sub for sub in m.modules() if isinstance(sub, nn.Linear)] for m in mods]
    assert lin[0] and all(sub._forward_hooks for sub in lin[0])
    assert lin[1] and not any(sub._forward_hooks for sub in lin[1])
    assert not any("forward" in sub.__dict__ for sub in lin[0] + lin[1])
    assert nn.Linear.forward is ORIGINAL_LINEAR_FORWARD
    xs, ys = _data(1)
    loss = ex.step(xs, ys)
    ref_loss, ref = _ref(0, xs, ys)
    assert abs(loss - ref_loss) < 1e-5
    for n, p in ex.named_parameters():
        torch.testing.assert_close(p.grad, ref[n], atol=1e-5, rtol=1e-5)


def test_bf16_params_get_fp32_master_grads():
    sched = random_plan(1, 2, 3, seed=4, split=0.5)
    ex, loss, xs, ys = _run(sched, param_dtype=torch.bfloat16)
    _, ref_grads = _ref(0, xs, ys)
    params = ex.parameters()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in params)
    assert all(p.dtype == torch.bfloat16 for m in ex.modules.values() for p in m.parameters())
    worst = max((p.grad - ref_grads[n]).abs().max().item() for n, p in ex.named_parameters())
    assert 0 < worst < 5e-2
    opt = torch.optim.SGD(params, lr=0.1)
    opt.step()
    ex.sync_params()
    for p, mp in ex.master.items():
        assert torch.equal(p, mp.to(torch.bfloat16))


def test_grads_accumulate_over_steps_like_torch():
    sched = random_plan(1, 2, 2, seed=1)
    ex, _, xs, ys = _run(sched)
    first = {n: p.grad.clone() for n, p in ex.named_parameters()}
    ex.step(xs, ys)  # no zero_grad: grads add up, as with loss.backward()
    for n, p in ex.named_parameters():
        torch.testing.assert_close(p.grad, 2 * first[n])


def test_grads_handed_out_are_never_overwritten_by_later_steps():
    """.grad is a view of the step's own buffer (no copy); the next step accumulates into a new one."""
    sched = random_plan(1, 2, 2, seed=1)
    ex, _, xs, ys = _run(sched)
    kept = {n: p.grad for n, p in ex.named_parameters()}
    snap = {n: g.clone() for n, g in kept.items()}
    for _, p in ex.named_parameters():
        p.grad = None  # like optimizer.zero_grad(set_to_none=True)
    ex.step(xs, ys)
    for n, p in ex.named_parameters():
        assert torch.equal(kept[n], snap[n])  # the old grads were not zeroed or added to
        torch.testing.assert_close(p.grad, snap[n])
        assert p.grad.data_ptr() != kept[n].data_ptr()


def test_failed_step_gives_back_the_grads_unchanged():
    """During a step the fp32 parameters' .grad are views of the step buffer (autograd accumulates
    into them); a step that fails puts every parameter's old .grad back, untouched."""
    sched = random_plan(1, 2, 3, seed=2)
    ex, _, xs, ys = _run(sched)
    before = {n: p.grad for n, p in ex.named_parameters()}
    snap = {n: g.clone() for n, g in before.items()}
    good = ex.loss_fn
    ex.loss_fn = lambda out, t: good(out, t) * (float("nan") if ex.current_job.mb == 2 else 1.0)
    with pytest.raises(NonFiniteLossError):
        ex.step(xs, ys)
    for n, p in ex.named_parameters():
        assert p.grad is before[n] and torch.equal(p.grad, snap[n]), n


def test_nan_loss_is_reported_with_microbatch():
    sched = random_plan(1, 2, 3, seed=2)
    split = even_layer_split(CFG.layers, 2)
    mods = build_chunk_modules(CFG, split)
    calls = []

    def bad_loss(out, t):
        calls.append(1)
        return loss_fn(out, t) * (float("inf") if ex.current_job.mb == 1 else 1.0)

    ex = PipelineExecutor(sched, dict(enumerate(mods)), bad_loss, pp_rank=0, pp_ranks=[0])
    with pytest.raises(NonFiniteLossError, match="at microbatch 1"):
        ex.step(*_data(3))


def test_job_log_lines(tmp_path):
    sched = random_plan(1, 2, 2, seed=3)
    log = JobLog(str(tmp_path), rank=0, local_rank=0, world_size=1, pp=1, dp=1, pp_rank=0, dp_rank=0,
                 schedule=schedule_io.to_dict(sched), costs=None, profile_steps=(1, 2))
    ex, _, xs, ys = _run(sched, log=log)
    ex.step(xs, ys)
    ex.step(xs, ys)
    log.close(2)
    lines = [json.loads(s) for s in (tmp_path / "workerlog.0").read_text().splitlines()]
    assert [x["event"] for x in lines if x["event"] != "job"] == ["meta", "profile_start", "sync", "step_end",
                                                                   "profile_stop"]
    jobs = [x for x in lines if x["event"] == "job"]
    assert {x["step"] for x in jobs} == {1}
    assert [f"{x['kind']}{x['mb']}.{x['chunk']}" for x in jobs] == [str(j) for j in sched.devices[0]]
    # CPU: every job carries ready <= start <= end <= done, and one rank's jobs tile its time
    for x in jobs:
        assert x["ready"] <= x["start"] <= x["end"] <= x["done"]
    for a, b in zip(jobs, jobs[1:]):
        assert a["done"] <= b["ready"] < a["done"] + 5e-3  # nothing to wait for in a world of one


@pytest.mark.parametrize("kw,match", [
    (dict(profile_steps="1:2"), "needs --log-dir"),
    (dict(profile_steps="3:5", steps=3, log_dir="logs"), "starts after the last step"),
])
def test_run_config_rejects_a_profile_window_that_logs_nothing(kw, match):
    from pipeloom.runtime.driver import RunConfig
    with pytest.raises(ValueError, match=match):
        RunConfig(**kw)
    RunConfig(profile_steps="2:9", steps=3, log_dir="logs")  # a window that only starts inside the run is fine


def test_rejects_wrong_modules_and_invalid_schedule():
    sched = random_plan(1, 2, 2, seed=0)
    mods = build_chunk_modules(CFG, even_layer_split(CFG.layers, 2))
    with pytest.raises(ValueError, match="holds chunks"):
        PipelineExecutor(sched, {0: mods[0]}, loss_fn, pp_rank=0, pp_ranks=[0])
    bad = Schedule("bad", 1, 1, 1, "interleaved", ((Job(Kind.F, 0, 0),),))
    with pytest.raises(ValueError, match="invalid"):
        PipelineExecutor(bad, {0: mods[0]}, loss_fn, pp_rank=0, pp_ranks=[0])
    ex = PipelineExecutor(sched, dict(enumerate(mods)), loss_fn, pp_rank=0, pp_ranks=[0])
    with pytest.raises(ValueError, match="microbatches"):
        ex.step(*_data(3))


def test_split_backward_of_a_chunk_made_only_of_linears():
    """Chunk 0 holds nothing but linears (no input grad, no other parameter): B still runs the
    backward so that W gets every dy. One Linear is used in both chunks: its grad is the sum of
    both uses, left once in .grad (not once per chunk)."""
    torch.manual_seed(0)
    a, shared, c, d = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 3)
    mods = {0: nn.Sequential(a, shared), 1: nn.Sequential(c, shared, d)}
    full = nn.Sequential(a, shared, c, shared, d)
    mse = lambda out, t: ((out - t) ** 2).mean()  # noqa: E731
    xs = [torch.randn(5, 6) for _ in range(3)]
    ys = [torch.randn(5, 3) for _ in range(3)]
    ref_loss, ref = reference_step(full, mse, xs, ys)
    for split in (1.0, 0.5, 0.0):
        full.zero_grad(set_to_none=True)
        ex = PipelineExecutor(random_plan(1, 2, 3, seed=1, split=split), mods, mse, pp_rank=0, pp_ranks=[0])
        assert len(ex.parameters()) == len(list(full.parameters()))  # the shared one once
        loss = ex.step(xs, ys)
        assert abs(loss - ref_loss) < 1e-6
        for name, p in full.named_parameters():
            torch.testing.assert_close(p.grad, ref[name], atol=1e-6, rtol=1e-5)
        ex.close()  # hooks off: the next executor decides afresh
        assert not any(sub._forward_hooks for m in mods.values() for sub in m.modules())


def test_chunk_modules_from_layers():
    layers = [nn.Linear(4, 4) for _ in range(5)]
    pre, post = nn.Linear(3, 4), nn.Linear(4, 2)
    mods = chunk_modules(layers, [[0, 1], [2], [3, 4]], range(3), pre=pre, post=post)
    x = torch.randn(2, 3)
    h = x
    for k in range(3):
        h = mods[k](h)
    full = nn.Sequential(pre, *layers, post)
    torch.testing.assert_close(h, full(x))
    with pytest.raises(ValueError, match="contiguous"):
        chunk_modules(layers, [[0, 2], [1, 3, 4]], [0])


def test_executor_runs_chunks_cut_by_a_partition():
    # the "full model + partition" path: cut the reference's blocks with pipeloom.partition
    from pipeloom.partition import uniform
    from pipeloom.models.llama import LlamaChunk

    part = uniform(CFG.layers, 1, 3)
    sched = random_plan(1, 3, 2, seed=9, split=0.5)
    full = build_reference(CFG, seed=2)
    ref_grads = _ref(2, *_data(2, 2))[1]

    class Pre(nn.Module):
        def __init__(self, emb):
            super().__init__()
            self.embed = emb

        def forward(self, x):
            return self.embed(x)

    class Post(nn.Module):
        def __init__(self, norm, head):
            super().__init__()
            self.norm, self.head = norm, head

        def forward(self, x):
            return self.head(self.norm(x))

    class Layer(nn.Module):  # a block with the rotary tables bound
        def __init__(self, blk):
            super().__init__()
            self.blk = blk

        def forward(self, x):
            s = x.shape[1]
            return self.blk(x, full.rope_cos[:s], full.rope_sin[:s])

    assert isinstance(full, LlamaChunk)
    layers = [Layer(full.layers[str(i)]) for i in range(CFG.layers)]
    mods = chunk_modules(layers, part.chunks, range(3), pre=Pre(full.embed), post=Post(full.norm, full.head))
    ex = PipelineExecutor(sched, mods, loss_fn, pp_rank=0, pp_ranks=[0])
    ex.step(*_data(2, 2))
    got = {id(p): p.grad for p in full.parameters()}
    for name, p in full.named_parameters():
        assert (got[id(p)] - ref_grads[name]).abs().max().item() <= 1e-5, name


def test_rank_failure_puts_the_root_cause_first():
    """Rank 3 hangs; ranks 1 and 2 time out in a chain (1 waits for 2, 2 waits for 3) in whatever
    order their reports arrive: the one naming rank 3 leads."""
    from pipeloom.runtime.launch import root_cause_first
    chain = [(1, "rank 1: job BW0.1 waited for grad(mb=0, chunk 2->1) from rank 2 (pp stage 2): timed out after 2s"),
             (2, "rank 2: job BW0.2 waited for grad(mb=0, chunk 3->2) from rank 3 (pp stage 3): timed out after 2s")]
    assert [e[0] for e in root_cause_first(chain)] == [2, 1]
    assert [e[0] for e in root_cause_first(chain[::-1])] == [2, 1]
    # a collective's timeout names no peer: it goes after the waits that do
    coll = (0, "rank 0: step 0: all-reduce of the microbatch losses: timed out after 2s")
    assert [e[0] for e in root_cause_first([coll] + chain)] == [2, 1, 0]
    # a rank's own error (a dead process, a NaN) still comes before any wait
    dead = (3, "process exited with code -9 without reporting")
    assert root_cause_first([coll] + chain + [dead])[0] == dead


class _FakeReducer:
    """Records the executor's calls into a shared event list (and checks what it is handed)."""

    def __init__(self, events: list) -> None:
        self.events = events
        self.buffer = None

    def start(self, buffer) -> None:
        self.buffer = buffer
        self.events.append(("start",))

    def chunk_done(self, chunk: int) -> None:
        self.events.append(("chunk_done", chunk))

    def finish(self) -> None:
        self.events.append(("finish",))


@pytest.mark.parametrize("split", [0.0, 0.6, 1.0])
def test_reducer_sees_chunk_done_after_each_chunks_last_weight_grad_job(split):
    sched = random_plan(1, 3, 3, seed=4, split=split)
    events: list = []

    def on_job(job, run):
        events.append(("job", job))
        run(job)

    split_ = even_layer_split(CFG.layers, sched.num_chunks)
    mods = build_chunk_modules(CFG, split_)
    fake = _FakeReducer(events)
    ex = PipelineExecutor(sched, dict(enumerate(mods)), loss_fn, pp_rank=0, pp_ranks=[0], reducer=fake,
                          on_job=on_job)
    xs, ys = _data(sched.microbatches)
    ex.step(xs, ys)
    # expected, from the job list: every job in order; after the last W/BW of a chunk, its chunk_done
    jobs = list(sched.devices[0])
    want: list = [("start",)]
    for i, j in enumerate(jobs):
        want.append(("job", j))
        if j.kind in (Kind.W, Kind.BW) and not any(
                later.chunk == j.chunk and later.kind in (Kind.W, Kind.BW) for later in jobs[i + 1:]):
            want.append(("chunk_done", j.chunk))
    want.append(("finish",))
    assert events == want
    assert fake.buffer is ex.grads
    # chunk_done(k) really comes when chunk k's gradients are complete: they equal the reference's
    ref_loss, ref = _ref(0, xs, ys)
    for n, p in ex.named_parameters():
        torch.testing.assert_close(p.grad, ref[n], atol=1e-5, rtol=1e-5)


def test_unknown_reducer_is_named():
    sched = random_plan(1, 1, 1, seed=0)
    mods = build_chunk_modules(CFG, [list(range(CFG.layers))])
    with pytest.raises(ValueError, match="unknown gradient reducer 'zero9'; choose one of: allreduce"):
        PipelineExecutor(sched, {0: mods[0]}, loss_fn, pp_rank=0, pp_ranks=[0], reducer="zero9")


def test_on_job_wraps_every_handler_and_can_skip_it():
    sched = random_plan(1, 2, 2, seed=3, split=0.5)
    mods = build_chunk_modules(CFG, even_layer_split(CFG.layers, 2))
    seen = []
    ex = PipelineExecutor(sched, dict(enumerate(mods)), loss_fn, pp_rank=0, pp_ranks=[0],
                          on_job=lambda job, run: (seen.append(job), run(job)))
    xs, ys = _data(2)
    loss = ex.step(xs, ys)
    assert seen == list(sched.devices[0])
    assert abs(loss - _ref(0, xs, ys)[0]) < 1e-5
    assert set(ex.handlers) == set(Kind)
    ex.on_job = lambda job, run: None  # no handler runs: no microbatch is computed
    assert ex.step(xs, ys) == 0.0
