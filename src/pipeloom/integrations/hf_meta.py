"""A transformers model's seeded initialization, materialized one parameter at a time (needs torch, transformers).

``pipeloom run --model PATH --tp N`` compares every TP rank with the unsplit model that
:func:`pipeloom.integrations.hf.build_model` makes from a seed (``AutoModelForCausalLM.from_config`` after
``torch.manual_seed(seed)``). A rank needs only its shards of its own chunks, but their values come out of one
random stream drawn over the whole model, in transformers' order. This module reproduces that stream without
holding the model:

* :func:`meta_model` builds the model's modules on the ``meta`` device (no memory, no random numbers drawn).
* :func:`seeded_init` replays, on the real CPU generator, the draws the seeded build makes, in its order: a
  module's ``__init__`` makes its own parameters (torch's default initialization, ``reset_parameters``, for
  ``nn.Linear`` and ``nn.Embedding``), then its children in registration order, and a transformers sub-model
  (``PreTrainedModel``: the decoder ``model``, then the whole causal LM) ends with ``post_init``, whose
  ``initialize_weights`` walks its modules children first (``smart_apply``) and initializes each one not done
  yet (``_initialize_weights``, under transformers' init guards). So the decoder's weights are drawn twice
  (default, then ``post_init``) before the LM head is even made.

  At each step only that module's own tensors exist on CPU (fresh; NaN-filled for ``post_init``); what the
  caller keeps of them (``keep``: a name -> function taking the full tensor to the part kept, e.g. a shard) is
  copied out, the rest freed. The peak is the tensors kept plus the largest module's own tensors (one
  parameter for the Llama-shaped families), never the model.

With saved weights (``--weights``) nothing is drawn: :func:`load_slices` reads only the kept slices from the
safetensors files (memory-mapped: the bytes of the shards, never a whole tensor but the replicated ones), and
:func:`init_buffers` computes the buffers a checkpoint does not hold (the rotary frequencies) with
transformers' own ``_init_weights`` of their modules.

What it assumes, and checks where it can: modules without ``reset_parameters`` draw nothing when built (true of
transformers' norms and rotary embeddings), and ``post_init`` sets every kept tensor entirely (a kept tensor
with NaN left in it is an error naming it). ``tests/integrations/test_hf_meta.py`` compares the replay bitwise with
the whole seeded build for every family :mod:`pipeloom.integrations.hf_tp` shards.
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch
from torch import nn

__all__ = ["meta_model", "seeded_init", "init_buffers", "load_slices", "materialize_", "meta_tensors"]

Keep = Mapping[str, Callable[[torch.Tensor], torch.Tensor]]


def meta_model(cfg) -> nn.Module:
    """The causal LM of transformers config ``cfg`` (fp32, dropout off) with every tensor on ``meta``."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return model.eval()


def _own(mod: nn.Module) -> list[tuple[dict, str, torch.Tensor]]:
    return [(store, n, t) for store in (mod._parameters, mod._buffers) for n, t in store.items() if t is not None]


def _swap_in(mod: nn.Module, fill: float | None) -> list[tuple[dict, str, torch.Tensor]]:
    """Give ``mod``'s own parameters and buffers fresh CPU tensors of their shapes (NaN-filled unless ``fill``
    is None: uninitialized); return the originals for :func:`_swap_out`."""
    orig = _own(mod)
    for store, n, t in orig:
        new = torch.empty(t.shape, dtype=t.dtype) if fill is None else torch.full(t.shape, fill, dtype=t.dtype)
        store[n] = nn.Parameter(new, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else new
    return orig


def _swap_out(orig) -> None:
    for store, n, t in orig:
        store[n] = t


def _has_nan(t: torch.Tensor) -> bool:
    """NaN at the first or last element (indexing views; nothing allocated)."""
    if t.numel() == 0 or not t.is_floating_point():
        return False
    return bool(t[(0,) * t.dim()].isnan().item() or t[(-1,) * t.dim()].isnan().item()) if t.dim() else \
        bool(t.isnan().item())


@torch.no_grad()
def seeded_init(model: nn.Module, seed: int, keep: Keep) -> dict[str, torch.Tensor]:
    """The values ``torch.manual_seed(seed); AutoModelForCausalLM.from_config(cfg)`` gives the parameters and
    buffers named in ``keep`` (names as ``model.named_parameters()`` / ``named_buffers()``), each passed through
    its function and copied (contiguous), computed on CPU one module at a time; ``model`` is a
    :func:`meta_model` and stays on ``meta``. The process's random state is restored afterwards."""
    from transformers import initialization as hf_init
    from transformers.modeling_utils import PreTrainedModel

    names = {id(m): (name + ".") if name else "" for name, m in model.named_modules()}
    out: dict[str, torch.Tensor] = {}
    custom = model.is_custom_code()

    def init_walk(mod: nn.Module, fn) -> None:  # transformers' smart_apply of initialize_weights
        for child in mod.children():
            init_walk(child, child._initialize_weights if isinstance(child, PreTrainedModel) else fn)
        if getattr(mod, "_is_hf_initialized", False):  # done by an inner sub-model's post_init (or met twice)
            return
        orig = _swap_in(mod, float("nan"))
        fn(mod, custom)
        for store, n, _ in orig:
            name = names[id(mod)] + n
            if name in keep:
                v = keep[name](store[n].detach()).clone(memory_format=torch.contiguous_format)
                if _has_nan(v):
                    raise RuntimeError(f"{name}: transformers' post_init does not initialize it; its seeded "
                                       f"value cannot be replayed one parameter at a time")
                out[name] = v
        _swap_out(orig)

    built: set[int] = set()

    def build(mod: nn.Module) -> None:  # the module's __init__: its own default init, its children, post_init
        if id(mod) in built:  # a shared module is made once
            return
        built.add(id(mod))
        if _own(mod) and callable(getattr(mod, "reset_parameters", None)):
            orig = _swap_in(mod, None)
            mod.reset_parameters()  # drawn only to advance the stream: post_init overwrites it (checked above)
            _swap_out(orig)
        for child in mod.children():
            build(child)
        if isinstance(mod, PreTrainedModel):  # its __init__ ends with post_init -> initialize_weights
            with hf_init.guard_torch_init_functions():
                init_walk(mod, mod._initialize_weights)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        build(model)
    missing = sorted(set(keep) - set(out))
    if missing:
        raise KeyError(f"not tensors of the model: {', '.join(missing[:4])}")
    return out


def materialize_(module: nn.Module, values: Mapping[str, torch.Tensor], prefix: str = "") -> nn.Module:
    """Put ``values[prefix + name]`` in place of each ``meta`` parameter and buffer of ``module`` (a parameter
    stays an ``nn.Parameter`` with its attributes); returns ``module``."""
    for mname, mod in module.named_modules():
        p = prefix + (mname + "." if mname else "")
        for store, n, t in _own(mod):
            if t.device.type != "meta":
                continue
            v = values[p + n]
            if isinstance(t, nn.Parameter):
                new = nn.Parameter(v, requires_grad=t.requires_grad)
                new.__dict__.update(t.__dict__)
                v = new
            store[n] = v
    return module


def meta_tensors(module: nn.Module) -> list[str]:
    """Names of ``module``'s parameters and buffers still on ``meta``."""
    return [n for n, t in (*module.named_parameters(), *module.named_buffers()) if t.device.type == "meta"]


#: safetensors dtypes numpy holds (read through numpy: only the slice is copied, into torch's memory)
_NUMPY_DTYPES = {"F64", "F32", "F16", "I64", "I32", "I16", "I8", "U8", "BOOL"}


def load_slices(directory: str, cuts) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` for the tensors named in ``cuts`` (``name -> (dim, start, length)`` or None for the whole
    tensor), read from the ``*.safetensors`` files of ``directory`` (one or several shards) as fp32, each slice
    read alone from the memory-mapped file (``safe_open(...).get_slice``; through numpy where it holds the dtype,
    else, bf16, through torch's view of the mapped file) and copied. A name no file holds is an error naming it."""
    import glob
    import os

    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
        with safe_open(path, framework="numpy") as fh:
            for name in fh.keys():
                if name not in cuts or name in out:
                    continue
                cut, sl = cuts[name], fh.get_slice(name)
                idx = (slice(None),) * len(sl.get_shape()) if cut is None else \
                    (slice(None),) * cut[0] + (slice(cut[1], cut[1] + cut[2]),)
                if sl.get_dtype() in _NUMPY_DTYPES:
                    out[name] = torch.tensor(sl[idx], dtype=torch.float32)  # a copy of the slice
                else:
                    with safe_open(path, framework="pt") as pt:
                        out[name] = pt.get_slice(name)[idx].to(torch.float32).clone(
                            memory_format=torch.contiguous_format)
    missing = sorted(set(cuts) - set(out))
    if missing:
        raise KeyError(f"{directory}: no safetensors file holds {', '.join(missing[:4])}")
    return out


@torch.no_grad()
def init_buffers(model: nn.Module, names) -> dict[str, torch.Tensor]:
    """The values transformers' ``_init_weights`` gives the buffers ``names`` of ``model`` (a :func:`meta_model`),
    computed on CPU module by module (for buffers that draw no random numbers: the rotary frequencies, which a
    checkpoint does not hold); the random state is left as it was."""
    from transformers.modeling_utils import PreTrainedModel

    names = set(names)
    owners = {id(m): (p + ".") if p else "" for p, m in model.named_modules()}
    out: dict[str, torch.Tensor] = {}
    with torch.random.fork_rng(devices=[]):
        for mod in model.modules():
            mine = [n for n in mod._buffers if owners[id(mod)] + n in names]
            if not mine or isinstance(mod, PreTrainedModel):
                continue
            orig = _swap_in(mod, float("nan"))
            model._init_weights(mod)
            for n in mine:
                v = mod._buffers[n]
                if _has_nan(v):
                    raise RuntimeError(f"{owners[id(mod)] + n}: transformers' _init_weights does not set it")
                out[owners[id(mod)] + n] = v
            _swap_out(orig)
    return out

