"""Traced memory: measure a real ``torch.nn.Module`` per pipeline chunk (needs torch).

:func:`trace_chunk` runs one forward of a chunk under
:func:`torch.autograd.graph.saved_tensors_hooks` and records every tensor autograd saves for the
backward. By default it runs under :class:`torch._subclasses.fake_tensor.FakeTensorMode` on
fake CPU tensors built from the parameters' shapes, so nothing is allocated and a chunk of a
70B model (built on the ``meta`` device) traces in seconds; the CPU kernels are the ones
dispatched, so what is saved is exactly what a real CPU run saves.

Counting rules:

* Dedupe by storage: views (``reshape``, ``transpose``, slices) and a tensor saved by several
  ops count once, at its storage's full size.
* Parameters and buffers (and views of them) are not activations.
* W split: the weight gradient of a GEMM ``y = x W^T`` is ``dW = dy^T x``. The GEMMs are the
  linears the runtime defers (:func:`pipeloom.autograd.splitgrad.deferrable_linears`: every
  :class:`torch.nn.Linear` but one tied to an embedding), or every module of the types passed in
  ``gemm_types``. Saved storages that are inputs of such
  a GEMM stay alive until W (``w_input_bytes``); B also makes ``dy`` of the shape of each GEMM's
  output and keeps it for W (``w_grad_bytes``). The rest of the saved bytes are freed by B.
  So a microbatch holds ``activation_bytes`` after F, ``w_held_bytes = w_input_bytes +
  w_grad_bytes`` after B and nothing after W.

:func:`measure_chunk` is the real-memory cross-check: it runs a real forward/backward on CPU
under :mod:`torch.profiler` with ``profile_memory=True`` and reads the bytes the CPU allocator
holds after the forward (activations + outputs) and at its peak during the backward.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import nn


@dataclass(slots=True)
class TracedChunk:
    """Memory of one chunk for one microbatch, in bytes."""

    params: int
    param_bytes: int
    activation_bytes: int
    """A: unique storages saved for backward by one forward (parameters excluded)"""
    w_input_bytes: int
    """saved GEMM inputs, kept until W"""
    w_grad_bytes: int
    """GEMM output gradients made by B and kept until W"""
    input_bytes: int
    """of which: the chunk's own input (a floating input is held by the runtime until B even when
    no backward op saved it; token ids count only when saved)"""
    output_bytes: int
    """size of the chunk's output (sent to the next chunk; not counted above)"""
    by_op: dict[str, int] = field(default_factory=dict)
    """activation bytes per autograd op (node type) that saved the storage"""

    @property
    def w_held_bytes(self) -> int:
        return self.w_input_bytes + self.w_grad_bytes

    @property
    def b_freed_bytes(self) -> int:
        return self.activation_bytes - self.w_input_bytes

    def to_dict(self) -> dict:
        return {"params": self.params, "param_bytes": self.param_bytes, "activation_bytes": self.activation_bytes,
                "w_input_bytes": self.w_input_bytes, "w_grad_bytes": self.w_grad_bytes,
                "w_held_bytes": self.w_held_bytes, "input_bytes": self.input_bytes,
                "output_bytes": self.output_bytes, "by_op": dict(self.by_op)}


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _fake_like(mode, t: torch.Tensor, device: str) -> torch.Tensor:
    with mode:
        f = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=device)
    return f


def _unique_param_stats(module: nn.Module) -> tuple[int, int]:
    seen, n, nbytes = set(), 0, 0
    for p in module.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        n += p.numel()
        nbytes += p.numel() * p.element_size()
    return n, nbytes


def trace_chunk(module: nn.Module, example_input, *, target: torch.Tensor | None = None,
                loss_fn: Callable | None = None, fake: bool = True, device: str = "cpu",
                gemm_types: Sequence[type] | None = None) -> TracedChunk:
    """Trace one forward of ``module`` on ``example_input`` (a tensor: token ids or hidden states).

    With ``loss_fn`` and ``target`` the loss is computed too (last chunk), so what the loss keeps
    (e.g. the fp32 log-softmax of cross entropy) is counted. ``fake=False`` runs for real on the
    tensors as given. Floating inputs are made to require grad (a middle chunk's input does).
    """
    params, param_bytes = _unique_param_stats(module)
    if not isinstance(example_input, torch.Tensor):
        raise TypeError(f"example_input must be a torch.Tensor, got {type(example_input).__name__}")
    mode = None
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode()
        state = {n: _fake_like(mode, p, device).requires_grad_(p.requires_grad)
                 for n, p in module.named_parameters(remove_duplicate=False)}
        state.update({n: _fake_like(mode, b, device) for n, b in module.named_buffers(remove_duplicate=False)})
        x = _fake_like(mode, example_input, device)
        y = _fake_like(mode, target, device) if target is not None else None
    else:
        state = None
        x = example_input.detach()
        y = target
    if x.is_floating_point():
        x.requires_grad_(True)
    owned = {_key(t) for t in (state.values() if state is not None else
                               list(module.parameters()) + list(module.buffers()))}

    records: list[tuple[int, int]] = []        # (storage key, nbytes)
    keep: list[torch.Tensor] = []              # keeps storages alive so keys stay unique

    def pack(t: torch.Tensor):
        k = _key(t)
        if k not in owned:
            records.append((k, t.untyped_storage().nbytes()))
            keep.append(t)
        return t

    gemm_in: set[int] = set()
    gemm_out = [0]

    def hook(_mod, inputs, output):
        for i in inputs:
            if isinstance(i, torch.Tensor):
                gemm_in.add(_key(i))
        if isinstance(output, torch.Tensor) and output.requires_grad:
            gemm_out[0] += output.numel() * output.element_size()

    if gemm_types is None:  # the linears the runtime's split backward defers (not a tied head)
        from ..autograd.splitgrad import deferrable_linears
        gemms = deferrable_linears(module)
    else:
        gemms = [m for m in module.modules() if isinstance(m, tuple(gemm_types))]
    handles = [m.register_forward_hook(hook) for m in gemms]
    try:
        ctx = mode if mode is not None else _Null()
        with ctx, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if state is not None:
                from torch.func import functional_call

                out = functional_call(module, state, (x,), tie_weights=False)
            else:
                out = module(x)
            root = out
            if loss_fn is not None and target is not None:
                root = loss_fn(out, y)
        names = _saving_ops(root)
    finally:
        for h in handles:
            h.remove()
    seen: set[int] = set()
    total = w_in = 0
    by_op: dict[str, int] = defaultdict(int)
    for k, nb in records:
        if k in seen:
            continue
        seen.add(k)
        total += nb
        by_op[names.get(k, "other")] += nb
        if k in gemm_in:
            w_in += nb
    xin = _key(x)
    input_bytes = 0
    if xin in seen:
        input_bytes = x.untyped_storage().nbytes()
    elif x.is_floating_point():
        # a received activation is kept by the pipeline runtime until B (it returns x.grad to the
        # previous chunk) even when no backward op saved it
        input_bytes = x.untyped_storage().nbytes()
        total += input_bytes
        by_op["chunk input (held by runtime)"] += input_bytes
    out_bytes = out.numel() * out.element_size() if isinstance(out, torch.Tensor) else 0
    return TracedChunk(params=params, param_bytes=param_bytes, activation_bytes=total, w_input_bytes=w_in,
                       w_grad_bytes=gemm_out[0], input_bytes=input_bytes, output_bytes=out_bytes,
                       by_op=dict(sorted(by_op.items(), key=lambda kv: -kv[1])))


def _saving_ops(root) -> dict[int, str]:
    """Storage key -> name of the first autograd node (walking back from ``root``) that saved it."""
    names: dict[int, str] = {}
    if not isinstance(root, torch.Tensor) or root.grad_fn is None:
        return names
    stack, visited = [root.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in visited:
            continue
        visited.add(id(node))
        label = type(node).__name__.removesuffix("Backward0").removesuffix("Backward")
        for attr in dir(node):
            if not attr.startswith("_saved_") and attr != "saved_tensors":
                continue
            try:
                val = getattr(node, attr)
            except Exception:  # freed or not a tensor attribute
                continue
            for t in (val if isinstance(val, (tuple, list)) else (val,)):
                if isinstance(t, torch.Tensor):
                    names.setdefault(_key(t), label)
        stack.extend(fn for fn, _ in node.next_functions)
    return names


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def trace_chunks(modules: Sequence[nn.Module], example_input: torch.Tensor, *, target: torch.Tensor | None = None,
                 loss_fn: Callable | None = None, fake: bool = True, device: str = "cpu",
                 gemm_types: Sequence[type] | None = None) -> list[TracedChunk]:
    """Trace every chunk of a pipeline in order; chunk k+1's example input has chunk k's output shape."""
    out = []
    x = example_input
    for i, m in enumerate(modules):
        last = i == len(modules) - 1
        tc = trace_chunk(m, x, target=target if last else None, loss_fn=loss_fn if last else None, fake=fake,
                         device=device, gemm_types=gemm_types)
        out.append(tc)
        if not last:
            x = _output_like(m, x, device)
    return out


def _output_like(module: nn.Module, x: torch.Tensor, device: str) -> torch.Tensor:
    """A real zero tensor of the shape/dtype the chunk outputs (found with a fake run)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.func import functional_call

    mode = FakeTensorMode()
    state = {n: _fake_like(mode, p, device) for n, p in module.named_parameters(remove_duplicate=False)}
    state.update({n: _fake_like(mode, b, device) for n, b in module.named_buffers(remove_duplicate=False)})
    fx = _fake_like(mode, x, device)
    with mode, torch.no_grad():
        o = functional_call(module, state, (fx,), tie_weights=False)
    return torch.zeros(tuple(o.shape), dtype=o.dtype)


# ------------------------------------------------------------------------------------- real run
@dataclass(slots=True)
class MeasuredChunk:
    """Real CPU allocator figures for one forward/backward of a chunk (bytes above the start)."""

    after_forward_bytes: int
    """held after the forward: saved activations + output (+ loss)"""
    activation_bytes: int
    """after_forward_bytes minus the output (and loss) tensors"""
    peak_bytes: int
    """highest level during forward + backward (includes parameter gradients)"""
    grad_bytes: int
    """parameter gradient bytes (preallocated before the run unless preallocate_grads=False)"""


def live_bytes(prof) -> tuple[int, int]:
    """(final, peak) live CPU bytes of a finished :class:`torch.profiler.profile` (``profile_memory=True``).

    Replays the profiler's raw allocator records (one ``[memory]`` record per allocation or free,
    with its size signed and its timestamp) in time order: exact, not rounded to whole ops.
    """
    recs = [(e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
            if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    recs.sort(key=lambda r: r[0])
    cur = peak = 0
    for _, n in recs:
        cur += n
        peak = max(peak, cur)
    return cur, peak


def measure_chunk(module: nn.Module, example_input: torch.Tensor, *, target: torch.Tensor | None = None,
                  loss_fn: Callable | None = None, preallocate_grads: bool = True) -> MeasuredChunk:
    """Run a real forward + backward on CPU and read the allocator's bookkeeping.

    Uses :mod:`torch.profiler` with ``profile_memory=True``, whose allocator records give the
    live-bytes curve (:func:`live_bytes`). The backward seeds the output with ones (or calls ``loss.backward()``;
    the logits are dropped first, as a pipeline's last stage does). Parameter gradients are
    preallocated (``preallocate_grads``) so the peak shows activations and working memory only.
    """
    from torch.profiler import ProfilerActivity, profile

    for p in module.parameters():  # a preallocated gradient buffer, as trainers keep (static memory)
        p.grad = torch.zeros_like(p) if preallocate_grads else None
    x = example_input.detach().clone()
    if x.is_floating_point():
        x.requires_grad_(True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof_f:
        out = module(x)
        loss = None
        if loss_fn is not None and target is not None:
            loss = loss_fn(out, target)
            out = None  # a pipeline's last stage keeps the loss, not the logits
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof_b:
        if loss is not None:
            loss.backward()
        else:
            out.backward(torch.ones_like(out))
    after_fw, peak_f = live_bytes(prof_f)
    _, peak_b = live_bytes(prof_b)
    peak = max(peak_f, after_fw + peak_b)
    held_out = loss.numel() * loss.element_size() if loss is not None else out.numel() * out.element_size()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in module.parameters() if p.grad is not None)
    return MeasuredChunk(after_forward_bytes=after_fw, activation_bytes=after_fw - held_out, peak_bytes=peak,
                         grad_bytes=grads)


# ------------------------------------------------------------------------------------- a real schedule
def traced_activation_peak(schedule, device: int, chunks: dict[int, TracedChunk]) -> int:
    """Peak activation bytes of ``device`` over its job list, from traced chunks.

    The memory rules are :mod:`pipeloom.core.rules`' (:func:`~pipeloom.core.rules.peak_memory`):
    F holds the chunk's ``activation_bytes`` (A), B leaves ``H = w_held_bytes`` (the GEMM inputs
    and output grads W needs), so it frees ``A - H``; W frees ``H``, BW frees A. ``chunks`` maps each global chunk of the device to its
    :class:`TracedChunk` (one microbatch). Transient working memory is not included.
    """
    from ..core.rules import peak_memory

    seq = schedule.devices[device]
    missing = sorted({c for _, _, c in seq} - set(chunks))
    if missing:
        raise ValueError(f"device {device} runs chunks {missing} that have no traced figures")
    a = [0.0] * schedule.num_chunks
    b = [0.0] * schedule.num_chunks
    for c, t in chunks.items():
        a[c], b[c] = t.activation_bytes, t.activation_bytes - t.w_held_bytes
    return int(round(peak_memory(seq, a, b)[0]))



class SavedBytes:
    """Counts, live, the bytes autograd keeps saved for backward (parameters excluded) and their peak, while
    the ``with`` block runs forwards; a saved tensor stops counting when autograd releases it (by the
    backward that used it, or when its graph is dropped). ``now``/``peak`` in bytes; ``reset()`` zeroes both."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self._hooks = None

    def reset(self) -> None:
        self.now = self.peak = 0

    def _pack(self, t: torch.Tensor):
        if isinstance(t, nn.Parameter):
            return t
        return (_Held(self, t.numel() * t.element_size()), t)

    @staticmethod
    def _unpack(x):
        return x[1] if isinstance(x, tuple) else x

    def __enter__(self) -> "SavedBytes":
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


class _Held:
    """One saved tensor's bytes, counted while autograd holds it."""

    __slots__ = ("owner", "nbytes")

    def __init__(self, owner: SavedBytes, nbytes: int) -> None:
        self.owner, self.nbytes = owner, nbytes
        owner.now += nbytes
        owner.peak = max(owner.peak, owner.now)

    def __del__(self) -> None:
        self.owner.now -= self.nbytes


def measure_schedule(schedule, device: int, modules: dict[int, nn.Module], *, inputs: Sequence[torch.Tensor],
                     targets: Sequence[torch.Tensor], loss_fn: Callable, activation: tuple[tuple[int, ...], torch.dtype],
                     seed: int = 0) -> int:
    """Replay ``device``'s job list of ``schedule`` for real on CPU; return the peak live bytes.

    ``modules`` maps each global chunk of the device to its module; ``inputs``/``targets`` are per
    microbatch (token ids of chunk 0, loss targets of the last chunk); ``activation`` is the
    (shape, dtype) of what chunks pass each other.

    What a job waits for and what it makes are :mod:`pipeloom.core.rules`' (``needs``,
    ``PRODUCES``): an event another device makes is a receive, made on the fly (random, as a
    receive allocates it); one this device made is handed over locally, as the runtime does (the
    activation of chunk k-1 becomes chunk k's input, the input gradient of chunk k+1 seeds chunk
    k's backward); a job whose local input does not exist yet is refused. A sent output's data is
    freed at once (Megatron's ``deallocate_output_tensor``); parameter gradients are preallocated
    (static, not in the peak). A pair the schedule splits into B and W runs with the runtime's own
    split backward (:class:`pipeloom.autograd.splitgrad.SplitGrad`): during F every deferrable
    ``nn.Linear`` stashes its input, B differentiates only the chunk input and the other
    parameters (the linears' ``dy`` land in the stash), W adds ``dW = dy^T x`` and frees the stash.
    Uses the profiler's allocator records (:func:`live_bytes`).
    """
    from torch.autograd import Variable
    from torch.profiler import ProfilerActivity, profile

    from ..core.ir import Kind, device_of
    from ..core.rules import ACT, EVENT_NAMES, GRAD, PRODUCES, needs
    from ..autograd.splitgrad import SplitGrad, weight_grads

    nc, pp, placement = schedule.num_chunks, schedule.pp, schedule.placement
    split = {(mb, c) for seq in schedule.devices for kind, mb, c in seq if kind is Kind.B}
    here = set(modules)
    for m in modules.values():
        for p in m.parameters():
            p.grad = torch.zeros_like(p)
    done: set[tuple[int, int, int]] = set()      # events (rules.ACT/GRAD/WGRAD, mb, chunk) made here
    handed: dict[tuple[int, int, int], torch.Tensor] = {}  # local hand-offs: event -> tensor
    state: dict = {}
    stashes: dict = {}
    gen = torch.Generator().manual_seed(seed)
    shape, dtype = activation

    def take(ev: int, mb: int, c: int, job) -> torch.Tensor | None:
        """The tensor of a needed event: local hand-off, else a receive (random)."""
        if device_of(c, pp, placement) == device:
            if (ev, mb, c) not in done:
                raise ValueError(f"job {job} of device {device} needs {EVENT_NAMES[ev]} of (mb {mb}, chunk {c}), "
                                 "which this device has not made yet")
            return handed.pop((ev, mb, c), None)
        return torch.randn(shape, generator=gen).to(dtype)

    sgs = {c: SplitGrad(modules[c]) for c in here if any(cc == c for _, cc in split)}
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            for job in schedule.devices[device]:
                kind, mb, c = job
                mod = modules[c]
                got = {ev: take(ev, emb, ec, job) for ev, emb, ec in needs(kind, mb, c, nc)
                       if (ev, emb, ec) != (ACT, mb, c)}
                if kind is Kind.F:
                    x = inputs[mb] if c == 0 else got[ACT].detach().requires_grad_(True)
                    if (mb, c) in split:
                        with sgs[c].deferring(stashes.setdefault((mb, c), [])):
                            out = mod(x)
                    else:
                        out = mod(x)
                    if c == nc - 1:
                        out = loss_fn(out, targets[mb])
                    elif device_of(c + 1, pp, placement) == device:
                        handed[(ACT, mb, c)] = out.detach()  # the next chunk's input, kept here
                    else:
                        out.data = torch.empty((1,), dtype=out.dtype)  # sent: free the data, keep the graph
                    state[(mb, c)] = (x, out)
                    del x, out
                elif kind is Kind.W:
                    weight_grads(stashes.pop((mb, c)), lambda p: p.grad)
                else:  # B or BW
                    x, out = state.pop((mb, c))
                    grad = torch.ones((), dtype=out.dtype) if c == nc - 1 else got[GRAD]
                    params = [p for p in mod.parameters() if p.requires_grad]
                    wrt = ([x] if x.requires_grad else []) + (sgs[c].kept(params) if kind is Kind.B else params)
                    # the engine directly: a sent output's data is a stub, its shape no longer checks
                    # out. Only deferred weights to differentiate (B): run it for the stash's dy and
                    # drop the grads (the runtime's autograd.grad); else accumulate into .grad
                    only_deferred = kind is Kind.B and not wrt
                    Variable._execution_engine.run_backward(
                        tensors=(out,), grad_tensors=(grad,), keep_graph=False, create_graph=False,
                        inputs=tuple(params if only_deferred else wrt), allow_unreachable=True,
                        accumulate_grad=not only_deferred)
                    if c > 0 and device_of(c - 1, pp, placement) == device:
                        handed[(GRAD, mb, c)] = x.grad  # the previous chunk's output gradient, kept here
                    del x, out, grad
                done.update((ev, mb, c) for ev in PRODUCES[kind])
    finally:
        for sg in sgs.values():
            sg.close()
    return live_bytes(prof)[1]
