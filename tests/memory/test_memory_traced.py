"""Traced memory (torch): saved-tensor accounting vs the analytic model and a real CPU run."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from pipeloom.memory import analytic as an  # noqa: E402
from pipeloom.memory.traced import measure_chunk, trace_chunk, trace_chunks  # noqa: E402

llama = pytest.importorskip("pipeloom.models.llama")


class Shared(nn.Module):
    """y = (x * w1) + (x * w2) + x.view(...).sum: x is saved twice, once through a view."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.ones(8))
        self.w2 = nn.Parameter(torch.ones(8))

    def forward(self, x):
        return x * self.w1 + x * self.w2 + (x.view(-1, 8) * self.w1).view(x.shape)


class TwoLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 32, bias=False)
        self.b = nn.Linear(32, 4, bias=False)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


@pytest.mark.parametrize("fake", [True, False])
def test_shared_storage_counted_once_and_params_excluded(fake):
    x = torch.randn(4, 8)
    tc = trace_chunk(Shared(), x, fake=fake)
    # only x (4*8 fp32) is an activation; w1/w2 are parameters
    assert tc.activation_bytes == 4 * 8 * 4
    assert tc.input_bytes == 4 * 8 * 4
    assert tc.params == 16


@pytest.mark.parametrize("fake", [True, False])
def test_w_split_on_linears(fake):
    x = torch.randn(5, 8)
    tc = trace_chunk(TwoLinear(), x, fake=fake)
    # saved: x (a's input), tanh output (b's input; tanh backward uses it too), nothing else
    assert tc.activation_bytes == (5 * 8 + 5 * 32) * 4
    assert tc.w_input_bytes == (5 * 8 + 5 * 32) * 4
    # W also needs the output grads of both GEMMs: (5, 32) and (5, 4)
    assert tc.w_grad_bytes == (5 * 32 + 5 * 4) * 4
    assert tc.b_freed_bytes == 0


@pytest.mark.parametrize("dtype,name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
def test_tiny_llama_traced_equals_analytic(dtype, name):
    cfg = llama.LlamaConfig()
    split = llama.even_layer_split(cfg.layers, 4)
    mods = llama.build_chunk_modules(cfg, split, dtype=dtype)
    x, y = llama.synthetic_batch(cfg, 2)
    traced = trace_chunks(mods, x, target=y, loss_fn=llama.loss_fn)
    model = cfg
    chunks = an.chunk_memory(model, an.TrainConfig(seq=cfg.seq, micro_batch=2, dtype=name, impl="eager"),
                             [len(c) for c in split])
    for t, a in zip(traced, chunks):
        assert t.params == a.params
        # the loss keeps one more fp32 scalar (nll_loss's total weight) than the analytic list
        assert abs(t.activation_bytes - a.activation_bytes) <= 4
        assert t.w_held_bytes == a.w_held_bytes


def test_meta_built_llama_layer_traces_without_memory():
    # a Llama-2-7B-shaped layer (4096 wide, seq 4096): ~800 MB of weights, never allocated
    cfg = llama.LlamaConfig(dim=4096, n_layers=2, n_heads=32, n_kv_heads=8, ffn_dim=11008, vocab_size=32000,
                            max_seq_len=4096)
    with torch.device("meta"):
        chunk = llama.LlamaChunk(cfg, [1], first=False, last=False).to(torch.bfloat16)
    chunk.rope_cos, chunk.rope_sin = chunk.rope_cos.float(), chunk.rope_sin.float()  # as build_chunk_modules
    x = torch.empty(1, 4096, 4096, dtype=torch.bfloat16, device="meta")
    tc = trace_chunk(chunk, x)
    tr = an.TrainConfig(seq=4096, micro_batch=1, dtype="bf16", impl="eager")
    model = cfg
    want = sum(i.bytes for i in an.layer_activations(model, tr)) + an.chunk_input_bytes(model, tr)
    assert an.chunk_input_bytes(model, tr) == 2 * 4096 * 4096
    assert tc.activation_bytes == pytest.approx(want, rel=1e-9)
    assert tc.w_held_bytes == pytest.approx(an.layer_w_held(model, tr), rel=1e-9)


def test_real_cpu_run_matches_traced():
    cfg = llama.LlamaConfig(n_layers=2)
    mods = llama.build_chunk_modules(cfg, [[0], [1]])
    x, y = llama.synthetic_batch(cfg, 2)
    model = cfg
    tr = an.TrainConfig(seq=cfg.seq, micro_batch=2, dtype="fp32", impl="eager")
    for i, m in enumerate(mods):
        last = i == 1
        kw = dict(target=y, loss_fn=llama.loss_fn) if last else {}
        tc = trace_chunk(m, x, **kw)
        real = measure_chunk(m, x, **kw)
        # tensors made before the forward (the chunk input, the targets) are not allocations of the run
        pre = tc.input_bytes + (y.numel() * y.element_size() if last else 0)
        assert real.activation_bytes == pytest.approx(tc.activation_bytes - pre, rel=0.01)
        # peak above the held activations (+ a middle chunk's output): the transient estimate
        ch = an.chunk_memory(model, tr, [1, 1])[i]
        held = real.after_forward_bytes
        extra = real.peak_bytes - held
        bound = an.transient_bytes(model, tr, [ch])
        assert extra == pytest.approx(bound, rel=0.02)
        with torch.no_grad():
            x = m(x)


@pytest.mark.parametrize("name,vpp", [("zbh1", 1)])
def test_real_schedule_replay_matches_estimate(name, vpp):
    from pipeloom.memory.traced import measure_schedule

    cfg = llama.LlamaConfig(n_layers=4)
    pp, m, b = 2, 4, 2
    model = cfg
    tr = an.TrainConfig(seq=cfg.seq, micro_batch=b, dtype="fp32", impl="eager")
    rep = an.estimate(model, tr, schedule=name, pp=pp, vpp=vpp, microbatches=m)
    sched = rep.schedule
    batches = [llama.synthetic_batch(cfg, b, seed=i) for i in range(m)]
    split = llama.even_layer_split(cfg.layers, pp * vpp)
    for d in range(pp):
        chunks = sched.chunks_of(d)
        mods = dict(zip(chunks, llama.build_chunk_modules(cfg, split, chunks=chunks)))
        real = measure_schedule(sched, d, mods, inputs=[x for x, _ in batches], targets=[y for _, y in batches],
                                loss_fn=llama.loss_fn, activation=((b, cfg.seq, cfg.hidden), torch.float32))
        dev = rep.devices[d]
        assert dev.activations_bytes + dev.transient_bytes == pytest.approx(real, rel=0.03)


class _Spy(nn.Module):
    """Records what ``nn.Linear.forward`` is (on the class) every time it runs inside a forward."""

    seen: list = []

    def forward(self, x):
        _Spy.seen.append(nn.Linear.forward)
        return x


def test_schedule_replay_leaves_no_class_or_instance_state():
    """The replay defers weight grads with the runtime's per-instance hooks: nn.Linear itself is
    never touched (neither while tracing nor after) and the modules come back without hooks."""
    from pipeloom.core.ir import Job, Kind, Schedule
    from pipeloom.memory.traced import measure_schedule

    original = nn.Linear.forward
    torch.manual_seed(0)
    mod = nn.Sequential(nn.Linear(6, 6), _Spy(), nn.Linear(6, 3))
    other = nn.Linear(6, 6)  # not in the replay: a class-level patch would change it too
    F0, B0, W0 = Job(Kind.F, 0, 0), Job(Kind.B, 0, 0), Job(Kind.W, 0, 0)
    sched = Schedule("t", 1, 1, 1, "interleaved", ((F0, B0, W0),))
    mse = lambda out, t: ((out - t) ** 2).mean()  # noqa: E731
    _Spy.seen = []
    x, y = torch.randn(4, 6), torch.randn(4, 3)
    measure_schedule(sched, 0, {0: mod}, inputs=[x], targets=[y], loss_fn=mse,
                     activation=((4, 6), torch.float32))
    assert _Spy.seen == [original]
    assert nn.Linear.forward is original
    for sub in list(mod.modules()) + [other]:
        assert "forward" not in sub.__dict__ and not sub._forward_hooks
    # W really ran: the deferred linears' grads equal one plain backward's
    want = nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 3))
    want.load_state_dict({"0.weight": mod[0].weight, "0.bias": mod[0].bias, "1.weight": mod[2].weight,
                          "1.bias": mod[2].bias})
    mse(want(x), y).backward()
    torch.testing.assert_close(mod[0].weight.grad, want[0].weight.grad)
    torch.testing.assert_close(mod[2].weight.grad, want[1].weight.grad)
    torch.testing.assert_close(mod[2].bias.grad, want[1].bias.grad)


def test_schedule_replay_refuses_a_job_before_its_local_input():
    from pipeloom.core.ir import Job, Kind, Schedule
    from pipeloom.memory.traced import measure_schedule

    mod = nn.Linear(6, 3)
    # W before B: the GRAD event it needs (rules.needs) was not made on this device yet
    sched = Schedule("t", 1, 1, 1, "interleaved", ((Job(Kind.F, 0, 0), Job(Kind.W, 0, 0), Job(Kind.B, 0, 0)),))
    with pytest.raises(ValueError, match="needs GRAD of \\(mb 0, chunk 0\\)"):
        measure_schedule(sched, 0, {0: mod}, inputs=[torch.randn(2, 6)], targets=[torch.randn(2, 3)],
                         loss_fn=lambda o, t: ((o - t) ** 2).mean(), activation=((2, 6), torch.float32))


@pytest.mark.parametrize("name,vpp", [("zbh1", 1), ("zbv", 2), ("1f1b", 1)])
def test_traced_activation_peak_equals_analytic_device_activations(name, vpp):
    from pipeloom.memory.traced import traced_activation_peak

    cfg = llama.LlamaConfig(n_layers=4)
    pp, m, b = 2, 4, 2
    tr = an.TrainConfig(seq=cfg.seq, micro_batch=b, dtype="fp32", impl="eager")
    rep = an.estimate(cfg, tr, schedule=name, pp=pp, vpp=vpp, microbatches=m)
    split = llama.even_layer_split(cfg.layers, pp * vpp)
    x, y = llama.synthetic_batch(cfg, b)
    traced = trace_chunks(llama.build_chunk_modules(cfg, split), x, target=y, loss_fn=llama.loss_fn)
    for d in range(pp):
        got = traced_activation_peak(rep.schedule, d, {c: traced[c] for c in rep.schedule.chunks_of(d)})
        # the loss keeps one more fp32 scalar than the analytic list (4 bytes per live last-chunk microbatch)
        assert got == pytest.approx(rep.devices[d].activations_bytes, abs=4 * m)


class Tied(nn.Module):
    """A head tied to the embedding: the runtime does not defer it, so neither does the tracer."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        return self.head(torch.tanh(self.emb(x)))


@pytest.mark.parametrize("fake", [True, False])
def test_tied_head_is_not_a_deferred_gemm(fake):
    x = torch.randint(0, 10, (3, 5))
    tc = trace_chunk(Tied(), x, fake=fake)
    assert tc.w_input_bytes == 0 and tc.w_grad_bytes == 0
    every = trace_chunk(Tied(), x, fake=fake, gemm_types=(nn.Linear,))
    assert every.w_grad_bytes == 3 * 5 * 10 * 4  # the head's output grad, when asked to count every Linear
    assert every.w_input_bytes == 3 * 5 * 8 * 4  # tanh output, the head's input
