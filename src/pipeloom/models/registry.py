"""The model-architecture registry: one :class:`Family` per Hugging Face ``model_type`` (no torch).

A family says everything pipeloom needs of one architecture, in one file under
:mod:`pipeloom.models.families`:

* **config reader** (``read``): the ``config.json`` fields, with transformers' defaults for those the file
  leaves out (``defaults``), as a :class:`~pipeloom.models.config.ModelConfig`. The ModelConfig's
  features (head width, biases, q/k norms, experts ...) are what the shared formulas count: parameters
  and FLOPs in :mod:`pipeloom.models.flops`, bytes in :mod:`pipeloom.memory.analytic`, layer costs in
  :mod:`pipeloom.partition.layer_costs` and the tuner.
* **FLOP and parameter items** (``layer_params``, ``layer_flops``; optional): a family whose layer the
  shared formulas do not describe (an attention block with low-rank projections, a parallel
  attention + MLP block) counts its own layer; :mod:`pipeloom.models.flops` asks the family of a
  ModelConfig (its ``arch``) first, so the memory model's static bytes, the layer costs and the tuner
  follow it.
* **layer groups** (``layer_groups``; optional): for a model whose layers are not all alike (DeepSeek's first
  dense layers, then MoE layers), the runs of like layers; the totals (:func:`pipeloom.models.flops.total_params`,
  ``active_params``, ``layers_params``) sum over them.
* **torch chunk builder** (``torch``; :class:`TorchChunks`): how
  :mod:`pipeloom.integrations.hf` cuts the family's transformers model into pipeline chunks, with
  hooks for what the model's ``forward`` adds around its layers (an embedding scale, a logit
  soft-cap); None = ``pipeloom run --model`` refuses the family (memory, FLOPs and planning still
  work).

Adding a family is one new module under ``models/families/`` that calls :func:`register`, and one
import line in ``models/families/__init__.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .config import ModelConfig, ModelConfigError

_REQUIRED = object()


class ConfigReader:
    """Typed access to one ``config.json`` (parsed) for a family's ``read``: a field of the file, else the
    family's transformers default, else a one-line :class:`ModelConfigError` naming the file and the field."""

    def __init__(self, cfg: Mapping, where: str, family: "Family"):
        self.cfg, self.where, self.family = cfg, where, family
        self.arch = family.model_type
        self.defaults = family.defaults

    def has(self, key: str) -> bool:
        """True when the file or the family's defaults know ``key``."""
        return key in self.cfg or key in self.defaults

    def raw(self, key: str, default=_REQUIRED):
        if key in self.cfg:
            return self.cfg[key]
        if default is _REQUIRED:
            default = self.defaults.get(key, _REQUIRED)
        if default is _REQUIRED:
            raise ModelConfigError(f"{self.where}: missing field {key!r} (needed for model_type {self.arch!r})")
        return default

    def int(self, key: str, default=_REQUIRED, *, none_ok: bool = False):
        v = self.raw(key, default)
        if v is None and none_ok:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ModelConfigError(f"{self.where}: field {key!r} must be an integer >= 1, got {v!r}")
        return v

    def bool(self, key: str, default=_REQUIRED) -> bool:
        v = self.raw(key, default)
        if not isinstance(v, bool):
            raise ModelConfigError(f"{self.where}: field {key!r} must be true or false, got {v!r}")
        return v

    def float(self, key: str, default=_REQUIRED) -> float:
        v = self.raw(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ModelConfigError(f"{self.where}: field {key!r} must be a number, got {v!r}")
        return float(v)


@dataclass(frozen=True, kw_only=True, slots=True)
class TorchChunks:
    """How :mod:`pipeloom.integrations.hf` cuts a family's transformers causal LM into pipeline chunks.

    The chunk builder is shared: chunk 0 holds the token embedding (and learned positions), each chunk
    its decoder layers, the last chunk the final norm and the head; every chunk recomputes the position
    ids, the causal masks and the rotary ``(cos, sin)``. The hooks are for what a family's ``forward``
    adds beyond that; they receive torch tensors but need not import torch (tensor methods suffice)."""

    embedding: Callable[[Any, Any], Any] | None = None
    """(hidden states right after the token embedding, transformers config) -> hidden states (e.g. the
    ``sqrt(hidden)`` scaling of Gemma); None = unchanged"""
    logits: Callable[[Any, Any], Any] | None = None
    """(logits of the head, transformers config) -> logits (e.g. a ``tanh`` soft-cap); None = unchanged"""


@dataclass(frozen=True, kw_only=True, slots=True)
class Family:
    """One architecture (a Hugging Face ``model_type``): config reader, FLOP items, torch chunk builder."""

    model_type: str
    """the ``model_type`` field of its config.json"""
    summary: str
    """one line: what is read and how the architecture differs from its neighbours (docs, --help)"""
    defaults: Mapping[str, object]
    """transformers' config-class defaults of the fields ``read`` reads (used when the file is silent)"""
    read: Callable[[ConfigReader, str], ModelConfig]
    """(reader of the file, label) -> the ModelConfig; raise ModelConfigError for what pipeloom cannot model"""
    layer_params: Callable[[ModelConfig, int], int] | None = None
    """(model, tp) -> parameters of one layer on one TP rank; None = :func:`pipeloom.models.flops.layer_params`'
    shared formula"""
    layer_flops: Callable[[ModelConfig, float, int], tuple[float, float, float]] | None = None
    """(model, tokens, seq) -> (F, B, W) FLOPs of one layer; None = the shared formula"""
    layer_groups: Callable[[ModelConfig], Sequence[tuple[int, ModelConfig]]] | None = None
    """model -> ``(count, layer model)`` runs, in order, for a model whose layers are not all alike (DeepSeek's
    first dense layers, then MoE layers); their counts sum to ``model.layers``. :func:`pipeloom.models.flops.total_params`
    and ``active_params`` sum over them; where pipeloom costs one layer for all (memory per chunk, layer costs)
    the model itself stands for every layer. None = every layer is ``model``"""
    torch: TorchChunks | None = field(default_factory=TorchChunks)
    """how ``pipeloom run --model`` cuts its transformers model; None = not runnable (estimates only)"""

    def __post_init__(self) -> None:
        if not isinstance(self.model_type, str) or not self.model_type.strip():
            raise ValueError(f"Family.model_type must be a non-empty string, got {self.model_type!r}")
        if not callable(self.read):
            raise ValueError(f"Family {self.model_type!r}: read must be callable")


_FAMILIES: dict[str, Family] = {}


def register(family: Family, *, replace: bool = False) -> Family:
    """Add ``family`` to the registry (under its ``model_type``); returns it. A second family for the same
    ``model_type`` is refused unless ``replace``."""
    if not isinstance(family, Family):
        raise TypeError(f"register() takes a Family, got {type(family).__name__}")
    if family.model_type in _FAMILIES and not replace:
        raise ValueError(f"model_type {family.model_type!r} is already registered")
    _FAMILIES[family.model_type] = family
    return family


def unregister(model_type: str) -> None:
    """Remove a family (for tests that register one of their own)."""
    _FAMILIES.pop(model_type, None)


def get(model_type: str) -> Family | None:
    """The family registered for ``model_type``, or None."""
    return _FAMILIES.get(model_type)


def families() -> tuple[Family, ...]:
    """Every registered family, in registration order."""
    return tuple(_FAMILIES.values())


def architectures(*, runnable: bool = False) -> tuple[str, ...]:
    """The registered ``model_type`` names; ``runnable``: only those ``pipeloom run --model`` cuts."""
    return tuple(f.model_type for f in _FAMILIES.values() if not runnable or f.torch is not None)


__all__ = ["ConfigReader", "Family", "TorchChunks", "architectures", "families", "get", "register", "unregister"]
