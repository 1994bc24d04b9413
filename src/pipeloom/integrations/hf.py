"""Hugging Face transformers decoder models as pipeline chunks (imports torch and transformers).

* :func:`load_config` / :func:`build_model` - a causal LM from a ``config.json`` (random weights from a
  seed, as ``AutoModelForCausalLM.from_config`` makes them) or, with ``weights=True``, from the
  safetensors files next to it (``from_pretrained``).
* :func:`pipeline_chunks` - cut a built model into the schedule's chunks: chunk 0 holds the token
  embedding (and GPT-2's learned positions), each chunk its decoder layers, the last chunk the final
  norm and the LM head. A chunk is an ordinary ``nn.Module`` taking one tensor (token ids for chunk 0,
  hidden states otherwise) and returning one tensor (hidden states, or logits for the last chunk), so
  it fits :class:`~pipeloom.runtime.executor.PipelineExecutor` and torch's ``PipelineStage`` alike.
  Sub-modules are shared with the model, not copied, and sit at the model's own paths, so a chunk's
  parameter names are the full model's (``model.layers.3.mlp.up_proj.weight``).
* :func:`tied_parameters` - parameters that several chunks hold (a head tied to the embedding), as
  :class:`~pipeloom.runtime.tied.Tie` s for :class:`~pipeloom.runtime.tied.TiedGrads`.
* :class:`HFRunModel` - what ``pipeloom run --model PATH`` hands the driver: builds this rank's chunks,
  the ties and the single-process reference (the unsplit transformers model's own forward).

Every chunk recomputes what the model's ``forward`` computes once and passes to each layer: the position
ids (0..seq-1; full sequences, no padding, no cache), the causal mask (``create_causal_mask``, or the
sliding-window one for layers whose ``attention_type`` says so) and, for rotary models, the
``(cos, sin)`` pair from the model's rotary module (shared by reference with every chunk).

The model runs with dropout off (``eval()``): the pipeline and the reference must compute the same
function. A MoE model's router auxiliary loss is not added (the loss is the token cross entropy).
Supported families are the runnable ones of the model registry (:func:`supported`: a
:class:`~pipeloom.models.registry.Family` with a :class:`~pipeloom.models.registry.TorchChunks`; checked:
their model ``forward`` adds nothing beyond embedding, positions, layers, norm and head, or the family's
hooks add it); others are refused in one line.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch
from torch import nn

from ..core.files import InputFileError, load_json
from ..models import families as _families
from ..runtime.tied import Tie


def supported() -> tuple[str, ...]:
    """The model_type values whose forward :func:`pipeline_chunks` reproduces: the registry's families with a
    torch chunk builder (:class:`~pipeloom.models.registry.TorchChunks`), in registration order."""
    return _families.architectures(runnable=True)


def _torch_side(model_type):
    fam = _families.get(model_type) if isinstance(model_type, str) else None
    return None if fam is None else fam.torch


class HFModelError(ValueError):
    """A config or model pipeloom cannot run (the message says what and what is allowed)."""


# ---------------------------------------------------------------------------- config and model
def config_path(spec: str) -> str:
    """The config.json of ``spec``: a path to the file itself or a directory holding one, or the name of a
    published config shipped with pipeloom (:func:`pipeloom.models.hf_config.hf_config_path`)."""
    from ..models.hf_config import hf_config_path

    path = hf_config_path(spec)
    if path is None or not os.path.isfile(path):
        raise HFModelError(f"--model {spec}: no such file or directory with a config.json; give a built-in "
                           f"example name, a path to a transformers config.json (or its directory) or a "
                           f"published config shipped with pipeloom")
    return str(path)


def load_config(spec: str):
    """The transformers config of ``spec`` (``AutoConfig.for_model(**config.json)``), checked."""
    from transformers import AutoConfig

    path = config_path(spec)
    try:  # bounded, every error naming the file
        raw = load_json(path, "model config")
    except InputFileError as e:
        raise HFModelError(f"--model {spec}: {e}") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise HFModelError(f"--model {spec}: {path} has no 'model_type'; a transformers config.json names its "
                           f"model family there (one of: {', '.join(supported())})")
    mt = raw.pop("model_type")
    if _torch_side(mt) is None:
        raise HFModelError(f"--model {spec}: model_type {mt!r} is not supported; pipeloom cuts: "
                           f"{', '.join(supported())}")
    try:
        cfg = AutoConfig.for_model(mt, **raw)
    except Exception as e:  # transformers' own validation of the fields
        raise HFModelError(f"--model {spec}: transformers rejects the config: {str(e).splitlines()[0]}") from None
    return cfg


def has_weights(spec: str) -> bool:
    """True when the config's directory holds safetensors weights."""
    d = os.path.dirname(config_path(spec))
    return any(n.endswith(".safetensors") for n in os.listdir(d or "."))


def build_model(spec: str, *, seed: int = 0, weights: bool = False, config=None) -> nn.Module:
    """The causal LM of ``spec`` in fp32, dropout off: random weights from ``seed`` (the same on every
    process: the whole model is initialised in one fixed order), or with ``weights`` the safetensors
    files in the config's directory."""
    from transformers import AutoModelForCausalLM

    cfg = config if config is not None else load_config(spec)
    if weights:
        d = os.path.dirname(config_path(spec)) or "."
        if not has_weights(spec):
            raise HFModelError(f"--weights: no *.safetensors file in {d}; save one with model.save_pretrained(DIR) "
                               f"or drop --weights (random weights from --seed)")
        model = AutoModelForCausalLM.from_pretrained(d, config=cfg, dtype=torch.float32)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return model.eval()


# ---------------------------------------------------------------------------- anatomy
@dataclass
class Anatomy:
    """Where the pieces of a decoder-only causal LM sit (dotted paths from the top model)."""

    embed: str
    layers: str
    norm: str
    head: str
    positions: str | None = None  # learned position embedding (GPT-2's wpe)
    drop: str | None = None       # embedding dropout
    rotary: str | None = None     # rotary module: (cos, sin) = rotary(hidden, position_ids)
    n_layers: int = 0


def _path_of(root: nn.Module, target: nn.Module) -> str:
    for name, m in root.named_modules():
        if m is target:
            return name
    raise HFModelError(f"{type(target).__name__} is not a sub-module of {type(root).__name__}")


def anatomy(model: nn.Module) -> Anatomy:
    """Find embedding, layer list, final norm, head (and positions, rotary) of a transformers causal LM."""
    cfg = model.config
    mt = getattr(cfg, "model_type", None)
    if _torch_side(mt) is None:
        raise HFModelError(f"model_type {mt!r} is not supported; pipeloom cuts: {', '.join(supported())}")
    base = model.base_model
    prefix = _path_of(model, base)
    p = (prefix + ".") if prefix else ""
    n = cfg.num_hidden_layers
    layers = next((name for name, m in base.named_children() if isinstance(m, nn.ModuleList) and len(m) == n), None)
    norm = next((name for name in ("norm", "ln_f", "final_layernorm") if hasattr(base, name)), None)
    head = model.get_output_embeddings()
    if layers is None or norm is None or head is None:
        raise HFModelError(f"{type(model).__name__}: cannot find its layer list, final norm and head")
    an = Anatomy(embed=p + _path_of(base, model.get_input_embeddings()), layers=p + layers, norm=p + norm,
                 head=_path_of(model, head), n_layers=n)
    for attr, name in (("positions", "wpe"), ("drop", "drop"), ("rotary", "rotary_emb")):
        if isinstance(getattr(base, name, None), nn.Module):
            setattr(an, attr, p + name)
    return an


def _mount(root: nn.Module, path: str, module: nn.Module) -> None:
    """Put ``module`` at the dotted ``path`` under ``root``, making empty holder modules on the way."""
    *parents, leaf = path.split(".")
    cur = root
    for part in parents:
        nxt = cur._modules.get(part)
        if nxt is None:
            nxt = nn.Module()
            cur.add_module(part, nxt)
        cur = nxt
    cur.add_module(leaf, module)


class HFChunk(nn.Module):
    """A contiguous slice of a transformers decoder: optional embedding, some layers, optional norm + head.

    ``forward(x)``: token ids (batch, seq) when the chunk has the embedding, else hidden states
    (batch, seq, hidden); returns logits (batch, seq, vocab) when it has the head, else hidden states.
    Sub-modules sit at the full model's paths (parameter names are the model's).
    """

    def __init__(self, model: nn.Module, an: Anatomy, layer_ids: Sequence[int], *, first: bool, last: bool) -> None:
        super().__init__()
        self.config = model.config
        self._hooks = _torch_side(model.config.model_type)
        self.layer_ids = [int(i) for i in layer_ids]
        self.first, self.last = first, last
        full = model.get_submodule(an.layers)
        # the pieces by role, in a plain dict (an attribute would register them a second time)
        parts: dict[str, nn.Module | list | None] = {"layers": [full[i] for i in self.layer_ids]}
        for i in self.layer_ids:
            _mount(self, f"{an.layers}.{i}", full[i])
        roles = [("embed", an.embed if first else None), ("pos", an.positions if first else None),
                 ("drop", an.drop if first else None), ("norm", an.norm if last else None),
                 ("head", an.head if last else None),
                 # the rotary module (buffers only): every chunk needs its (cos, sin); mounted so .to() moves it
                 ("rotary", an.rotary)]
        for role, path in roles:
            parts[role] = model.get_submodule(path) if path else None
            if path:
                _mount(self, path, parts[role])
        self._parts = parts
        # each layer's mask: ``config.layer_types[i]`` as the decoder's own forward picks it (gemma2's layers carry
        # no ``attention_type``), else the layer's ``attention_type`` (llama, qwen2/3); models whose layers have
        # neither pick one mask for the whole decoder from ``config.sliding_window`` (mistral, mixtral), as they do
        whole = "full_attention" if getattr(self.config, "sliding_window", None) is None else "sliding_attention"
        kinds = getattr(self.config, "layer_types", None)
        self._types = [kinds[i] if isinstance(kinds, (list, tuple)) and len(kinds) > i
                       else getattr(m, "attention_type", whole) for i, m in zip(self.layer_ids, parts["layers"])]
        self._window = "sliding_attention" in self._types

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        parts = self._parts
        if parts["embed"] is not None:
            x = parts["embed"](x)
            if self._hooks.embedding is not None:
                x = self._hooks.embedding(x, self.config)
        pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        if parts["pos"] is not None:
            x = x + parts["pos"](pos).to(x.dtype)
        if parts["drop"] is not None:
            x = parts["drop"](x)
        masks = {"full_attention": create_causal_mask(config=self.config, inputs_embeds=x, attention_mask=None,
                                                      cache=None, position_ids=pos)}
        if self._window:
            masks["sliding_attention"] = create_sliding_window_causal_mask(
                config=self.config, inputs_embeds=x, attention_mask=None, cache=None, position_ids=pos)
        extra = {}
        if parts["rotary"] is not None:
            extra["position_embeddings"] = parts["rotary"](x, position_ids=pos)
        for layer, kind in zip(parts["layers"], self._types):
            out = layer(x, attention_mask=masks[kind], position_ids=pos, **extra)
            x = out[0] if isinstance(out, tuple) else out
        if parts["head"] is not None:
            x = parts["head"](parts["norm"](x))
            if self._hooks.logits is not None:
                x = self._hooks.logits(x, self.config)
        return x


def _split(partition, n_layers: int) -> list[list[int]]:
    chunks = partition.chunks if hasattr(partition, "chunks") else partition
    split = [[int(i) for i in c] for c in chunks]
    if [i for c in split for i in c] != list(range(n_layers)) or any(not c for c in split):
        raise HFModelError(f"the partition must list layers 0..{n_layers - 1} once each, contiguous, in order, "
                           f"at least one per chunk; got {split}")
    return split


def pipeline_chunks(model: nn.Module, partition, chunks: Iterable[int] | None = None) -> list[HFChunk]:
    """The modules of ``chunks`` (global chunk ids; default all) of ``model`` cut by ``partition``.

    ``partition``: a :class:`pipeloom.partition.Partition` (its ``chunks``), or a list with the layer
    indices of every global chunk (e.g. :func:`pipeloom.models.slicing.even_layer_split`). Modules are
    shared with ``model`` (chunks on one process that both hold a tied weight share the parameter)."""
    an = anatomy(model)
    split = _split(partition, an.n_layers)
    n = len(split)
    which = list(range(n)) if chunks is None else [int(c) for c in chunks]
    for c in which:
        if not 0 <= c < n:
            raise HFModelError(f"chunk {c} out of range: the partition has {n} chunks")
    return [HFChunk(model, an, split[c], first=c == 0, last=c == n - 1) for c in which]


def tied_parameters(chunks: Sequence[nn.Module]) -> list[Tie]:
    """Parameters held by more than one of ``chunks`` (all chunks of a model, index = global chunk id)."""
    seen: dict[int, list[tuple[int, str]]] = {}
    for k, m in enumerate(chunks):
        for name, p in m.named_parameters(remove_duplicate=False):
            members = seen.setdefault(id(p), [])
            if all(c != k for c, _ in members):
                members.append((k, name))
    return [Tie(tuple(ms)) for ms in seen.values() if len(ms) > 1]


def canonical_names(model: nn.Module) -> dict[str, str]:
    """Every parameter path of ``model`` (tied ones under all their names) -> the name
    ``named_parameters()`` reports it under."""
    first: dict[int, str] = {}
    out = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        out[name] = first.setdefault(id(p), name)
    return out


# ---------------------------------------------------------------------------- for the run driver
@dataclass
class HFRunModel:
    """A transformers model for :func:`pipeloom.runtime.driver.run` (``RunConfig.model``); picklable.

    Without tensor parallelism each rank builds the whole model on CPU, keeps its chunks and drops the rest;
    with it (:meth:`tp_chunks`) a rank materializes only its shards, with the same values."""

    spec: str
    weights: bool = False
    name: str = ""
    layers: int = 0
    vocab: int = 0
    hidden: int = 0
    max_seq: int = 0
    _names: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        cfg = load_config(self.spec)
        if self.weights and not has_weights(self.spec):
            build_model(self.spec, weights=True, config=cfg)  # raises the one-line error
        path = config_path(self.spec)
        where = os.path.basename(os.path.dirname(os.path.abspath(path))) if os.path.basename(path) == "config.json" \
            else os.path.splitext(os.path.basename(path))[0]
        self.name = self.name or f"{cfg.model_type} ({where})"
        self.layers = int(cfg.num_hidden_layers)
        self.vocab = int(cfg.vocab_size)
        self.hidden = int(cfg.hidden_size)
        self.max_seq = int(getattr(cfg, "max_position_embeddings", 0) or getattr(cfg, "n_positions", 0) or 1 << 30)

    def build(self, seed: int) -> nn.Module:
        return build_model(self.spec, seed=seed, weights=self.weights)

    def chunks(self, split: Sequence[Sequence[int]], which: Sequence[int], seed: int,
               device=None) -> tuple[list[nn.Module], list[Tie]]:
        """This rank's chunk modules (in ``which`` order, on ``device``) and the model's ties."""
        model = self.build(seed)
        every = pipeline_chunks(model, split)
        ties = tied_parameters(every)
        mods = [every[k] for k in which]
        if device is not None:
            mods = [m.to(device) for m in mods]
        return mods, ties

    def check_tp(self, tp: int) -> None:
        """One-line ValueError unless this model can run with ``tp`` tensor-parallel ranks
        (:mod:`pipeloom.integrations.hf_tp`)."""
        from .hf_tp import check_hf_tp
        check_hf_tp(load_config(self.spec), tp)

    def tp_chunks(self, split: Sequence[Sequence[int]], which: Sequence[int], seed: int, group,
                  device=None) -> list[nn.Module]:
        """This rank's chunk modules sharded for its rank of the tensor-parallel ``group``
        (:func:`pipeloom.integrations.hf_tp.build_tp_chunks`: only the shards are ever made, from the seed or,
        with ``weights``, read alone from the safetensors files)."""
        from .hf_meta import meta_model
        from .hf_tp import build_tp_chunks
        model = meta_model(load_config(self.spec))
        weights = (os.path.dirname(config_path(self.spec)) or ".") if self.weights else None
        mods = build_tp_chunks(model, pipeline_chunks(model, split, which), seed, group, weights)
        return [m.to(device) for m in mods] if device is not None else mods

    def reference_step(self, seed: int, loss_fn, xs, ys) -> tuple[float, dict[str, torch.Tensor]]:
        """The unsplit model (its own ``forward``): mean microbatch loss and grads by canonical name."""
        model = self.build(seed)
        n = len(xs)
        total = 0.0
        for x, y in zip(xs, ys):
            loss = loss_fn(model(input_ids=x).logits, y)
            (loss / n).backward()
            total += loss.item()
        self._names = canonical_names(model)
        self.reference = model  # the data-parallel check steps its optimizer and compares parameters
        return total / n, {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}

    def canonical(self, name: str) -> str:
        """A chunk's parameter name -> the reference's name for it (after :meth:`reference_step`)."""
        return self._names.get(name, name)


__all__ = ["HFModelError", "HFChunk", "HFRunModel", "Anatomy", "anatomy", "build_model", "canonical_names",
           "config_path", "has_weights", "load_config", "pipeline_chunks", "supported", "tied_parameters"]
