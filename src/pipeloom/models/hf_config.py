"""A Hugging Face ``config.json`` as a :class:`~pipeloom.models.config.ModelConfig` (no torch, no transformers).

``pipeloom memory --model PATH`` (and every other ``--model``) takes a path to a ``config.json``,
or to a directory holding one, as well as a preset name: :func:`resolve_model` is the one place
that turns such a spec into a ModelConfig. The file is read as JSON here; transformers is not
imported and nothing is downloaded.

Architectures (the ``model_type`` field) are the families of the model registry
(:mod:`pipeloom.models.registry`; one module each in :mod:`pipeloom.models.families`, which lists them
and what is read from them, following transformers' modeling code for that architecture, including its
defaults for fields the file leaves out).

``tie_word_embeddings`` takes the architecture's default when absent (True for gpt2 only).
Required: the shape fields (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
``vocab_size``, ``intermediate_size`` where the architecture has a dense MLP or Mixtral experts,
and their gpt2 names). A missing required field, a wrong type or an unknown ``model_type`` is a
one-line :class:`~pipeloom.models.config.ModelConfigError` naming the file and the field.

MoE models whose dense/sparse layers alternate (``decoder_sparse_step`` > 1 or a non-empty
``mlp_only_layers``) are refused: pipeloom's layers are identical.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..core.files import InputFileError, load_json
from ..core.limits import MAX_LAYERS, check_at_most
from .config import ModelConfig, ModelConfigError
from .families import architectures, get
from .registry import ConfigReader

#: published config.json files shipped with pipeloom (only the config, no weights)
CONFIG_DIR = Path(__file__).with_name("hf_configs")


def load_hf_config(path: str | os.PathLike) -> tuple[dict, str]:
    """(parsed JSON object, the file's path) of ``path``: a config.json file or a directory holding one."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            raise ModelConfigError(f"{path}: the directory holds no config.json")
    try:  # bounded (a weights file given for its config.json is refused unread), every error naming the file
        data = load_json(p, "model config")
    except InputFileError as e:
        raise ModelConfigError(str(e)) from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{p}: expected a JSON object (a Hugging Face config.json)")
    return data, str(p)


def _default_name(where: str, cfg: dict) -> str:
    n = cfg.get("_name_or_path")
    if isinstance(n, str) and n.strip():
        return n.strip().rstrip("/").split("/")[-1]
    p = Path(where)
    return p.parent.name if p.name == "config.json" and p.parent.name else p.stem


def from_hf_config(src: str | os.PathLike | dict, *, name: str | None = None) -> ModelConfig:
    """The :class:`ModelConfig` of a Hugging Face config: a path to ``config.json``, to a directory holding
    one, or the parsed dict. ``name`` labels it in reports (default: ``_name_or_path``, else the directory or
    file name). The ``model_type`` picks the reader (:func:`pipeloom.models.registry.get`)."""
    if isinstance(src, dict):
        cfg, where = src, "config"
    else:
        cfg, where = load_hf_config(src)
    arch = cfg.get("model_type")
    known = ", ".join(architectures())
    if arch is None:
        raise ModelConfigError(f"{where}: missing field 'model_type' (one of: {known})")
    family = get(arch) if isinstance(arch, str) else None
    if family is None:
        raise ModelConfigError(f"{where}: model_type {arch!r} is not supported; supported are: {known}")
    label = name or _default_name(where, cfg)
    try:
        model = family.read(ConfigReader(cfg, where, family), label)
    except ModelConfigError as e:
        msg = str(e)
        raise ModelConfigError(msg if msg.startswith(where) else f"{where}: {msg}") from None
    check_at_most(f"{where}: num_hidden_layers", model.layers, MAX_LAYERS)  # the cap of --layers, for every command
    return model


# ------------------------------------------------------------------------------------- resolution
def shipped_configs() -> dict[str, Path]:
    """Published configs shipped in the package: lower-case name (file stem) -> path."""
    if not CONFIG_DIR.is_dir():
        return {}
    return {p.stem.lower(): p for p in sorted(CONFIG_DIR.glob("*.json"))}


def hf_config_path(spec: str | os.PathLike) -> Path | None:
    """The ``config.json`` file a ``--model`` spec names (a path to it or to its directory, or the name of a
    shipped published config); None for a preset name or anything else. For the torch side, which builds the
    transformers model from that same file."""
    from .presets import PRESETS

    text = str(spec).strip()
    if not text or text.lower() in PRESETS:
        return None
    p = Path(text)
    if p.is_dir() and (p / "config.json").is_file():
        return p / "config.json"
    if p.is_file():
        return p
    return shipped_configs().get(text.lower())


def resolve_model(spec: str | ModelConfig) -> ModelConfig:
    """THE model resolution of every ``--model``: a preset name (:mod:`pipeloom.models.presets`), the name of
    a published config shipped with pipeloom (:func:`shipped_configs`), or a path to a Hugging Face
    ``config.json`` or to a directory holding one. A ModelConfig is returned as it is."""
    from .presets import PRESETS

    if isinstance(spec, ModelConfig):
        return spec
    if not isinstance(spec, (str, os.PathLike)) or not str(spec).strip():
        raise ModelConfigError(f"--model needs a preset name or a path to a config.json, got {spec!r}")
    text = str(spec).strip()
    if text.lower() in PRESETS:
        return PRESETS[text.lower()]
    if os.path.exists(text):
        return from_hf_config(text)
    shipped = shipped_configs()
    if text.lower() in shipped:
        return from_hf_config(shipped[text.lower()], name=shipped[text.lower()].stem)
    if os.sep in text or "/" in text or text.lower().endswith(".json"):
        raise ModelConfigError(f"model config {text}: no such file or directory")
    raise ModelConfigError(f"unknown model preset {text!r} and no such config file: give a preset ({', '.join(PRESETS)}), a published config "
                           f"shipped with pipeloom ({', '.join(p.stem for p in shipped.values()) or 'none'}) "
                           f"or a path to a Hugging Face config.json")


__all__ = ["CONFIG_DIR", "from_hf_config", "hf_config_path", "load_hf_config", "resolve_model",
           "shipped_configs"]
