"""A Hugging Face ``config.json`` as a :class:`~pipeloom.models.config.ModelConfig` (no torch, no transformers).

``pipeloom memory --model PATH`` (and every other ``--model``) takes a path to a ``config.json``,
or to a directory holding one, as well as a preset name: :func:`resolve_model` is the one place
that turns such a spec into a ModelConfig. The file is read as JSON here; transformers is not
imported and nothing is downloaded.

Architectures (the ``model_type`` field) and what is read from them, following transformers'
modeling code for that architecture, including its defaults for fields the file leaves out:

============  =======================================================================================
llama         RMSNorm, SwiGLU, rotary; ``attention_bias`` (q/k/v/o), ``mlp_bias``, optional ``head_dim``
mistral       as llama without biases (``num_key_value_heads`` defaults to 8)
qwen2         as llama with q/k/v biases (always)
qwen3         q/k RMSNorm per head, explicit ``head_dim`` (default 128), ``attention_bias`` (q/k/v/o)
gpt2          ``n_embd``/``n_layer``/``n_head``/``n_positions``; LayerNorm, GeLU MLP (``n_inner``, default
              4h), fused qkv with biases, learned positions, tied embeddings by default
mixtral       llama attention + ``num_local_experts`` SwiGLU experts of ``intermediate_size``, top
              ``num_experts_per_tok``, a router
qwen3_moe     qwen3 attention + ``num_experts`` experts of ``moe_intermediate_size``, a router, no shared expert
qwen2_moe     qwen2 attention (``qkv_bias``) + routed experts + one shared expert of
              ``shared_expert_intermediate_size`` with a sigmoid gate
============  =======================================================================================

``tie_word_embeddings`` takes the architecture's default when absent (True for gpt2 only).
Required: the shape fields (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
``vocab_size``, ``intermediate_size`` where the architecture has a dense MLP or Mixtral experts,
and their gpt2 names). A missing required field, a wrong type or an unknown ``model_type`` is a
one-line :class:`~pipeloom.models.config.ModelConfigError` naming the file and the field.

MoE models whose dense/sparse layers alternate (``decoder_sparse_step`` > 1 or a non-empty
``mlp_only_layers``) are refused: pipeloom's layers are identical.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .config import ModelConfig, ModelConfigError

_REQUIRED = object()

#: model_type -> defaults of transformers' config class for the fields this module reads
_DEFAULTS: dict[str, dict] = {
    "llama": dict(num_key_value_heads=None, max_position_embeddings=2048, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, attention_bias=False, mlp_bias=False, head_dim=None),
    "mistral": dict(num_key_value_heads=8, max_position_embeddings=4096 * 32, rms_norm_eps=1e-6,
                    tie_word_embeddings=False, head_dim=None),
    "qwen2": dict(num_key_value_heads=32, max_position_embeddings=32768, rms_norm_eps=1e-6,
                  tie_word_embeddings=False),
    "qwen3": dict(num_key_value_heads=32, max_position_embeddings=32768, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, attention_bias=False, head_dim=128),
    "gpt2": dict(n_inner=None, n_positions=1024, layer_norm_epsilon=1e-5, tie_word_embeddings=True,
                 resid_pdrop=0.1),
    "mixtral": dict(num_key_value_heads=8, max_position_embeddings=4096 * 32, rms_norm_eps=1e-5,
                    tie_word_embeddings=False, head_dim=None, num_local_experts=8, num_experts_per_tok=2),
    "qwen3_moe": dict(num_key_value_heads=4, max_position_embeddings=32768, rms_norm_eps=1e-6,
                      tie_word_embeddings=False, attention_bias=False, head_dim=None, num_experts=128,
                      num_experts_per_tok=8, moe_intermediate_size=768, decoder_sparse_step=1,
                      mlp_only_layers=None),
    "qwen2_moe": dict(num_key_value_heads=16, max_position_embeddings=32768, rms_norm_eps=1e-6,
                      tie_word_embeddings=False, qkv_bias=True, head_dim=None, num_experts=60,
                      num_experts_per_tok=4, moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                      decoder_sparse_step=1, mlp_only_layers=None),
}

#: the architectures :func:`from_hf_config` reads
ARCHITECTURES = tuple(_DEFAULTS)

#: published config.json files shipped with pipeloom (only the config, no weights)
CONFIG_DIR = Path(__file__).with_name("hf_configs")


class _Reader:
    def __init__(self, cfg: dict, where: str, arch: str):
        self.cfg, self.where, self.arch = cfg, where, arch
        self.defaults = _DEFAULTS[arch]

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


def load_hf_config(path: str | os.PathLike) -> tuple[dict, str]:
    """(parsed JSON object, the file's path) of ``path``: a config.json file or a directory holding one."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            raise ModelConfigError(f"{path}: the directory holds no config.json")
    try:
        text = p.read_text()
    except OSError as e:
        raise ModelConfigError(f"cannot read model config {p}: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
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
    file name)."""
    if isinstance(src, dict):
        cfg, where = src, "config"
    else:
        cfg, where = load_hf_config(src)
    arch = cfg.get("model_type")
    if arch is None:
        raise ModelConfigError(f"{where}: missing field 'model_type' (one of: {', '.join(ARCHITECTURES)})")
    if arch not in _DEFAULTS:
        raise ModelConfigError(f"{where}: model_type {arch!r} is not supported; supported are: "
                               f"{', '.join(ARCHITECTURES)}")
    r = _Reader(cfg, where, arch)
    label = name or _default_name(where, cfg)
    try:
        return _BUILD[arch](r, label)
    except ModelConfigError as e:
        msg = str(e)
        raise ModelConfigError(msg if msg.startswith(where) else f"{where}: {msg}") from None


def _rope_theta(r: _Reader) -> float:
    rp = r.cfg.get("rope_parameters")
    if isinstance(rp, dict) and isinstance(rp.get("rope_theta"), (int, float)):
        return float(rp["rope_theta"])
    return r.float("rope_theta", 10000.0)


def _kv_heads(r: _Reader, heads: int) -> int:
    kv = r.int("num_key_value_heads", none_ok=True)
    return heads if kv is None else kv


def _llama_like(r: _Reader, label: str, **kw) -> ModelConfig:
    heads = r.int("num_attention_heads")
    base = dict(name=label, hidden=r.int("hidden_size"), layers=r.int("num_hidden_layers"), heads=heads,
                kv_heads=_kv_heads(r, heads), vocab=r.int("vocab_size"), seq=r.int("max_position_embeddings"),
                norm_eps=r.float("rms_norm_eps"), rope_theta=_rope_theta(r),
                init_std=r.float("initializer_range", 0.02), dropout=r.float("attention_dropout", 0.0),
                tied_embeddings=r.bool("tie_word_embeddings"), mlp="swiglu", norm="rmsnorm")
    if "head_dim" in r.defaults or "head_dim" in r.cfg:
        base["head_size"] = r.int("head_dim", none_ok=True)
    base.update(kw)
    return ModelConfig(**base)


def _llama(r, label):
    attn_bias = r.bool("attention_bias")
    return _llama_like(r, label, ffn=r.int("intermediate_size"), qkv_bias=attn_bias, proj_bias=attn_bias,
                       mlp_bias=r.bool("mlp_bias"))


def _mistral(r, label):
    return _llama_like(r, label, ffn=r.int("intermediate_size"))


def _qwen2(r, label):
    return _llama_like(r, label, ffn=r.int("intermediate_size"), qkv_bias=True)


def _qwen3(r, label):
    attn_bias = r.bool("attention_bias")
    return _llama_like(r, label, ffn=r.int("intermediate_size"), qkv_bias=attn_bias, proj_bias=attn_bias,
                       qk_norm=True)


def _gpt2(r, label):
    h = r.int("n_embd")
    act = r.raw("activation_function", "gelu_new")
    if not isinstance(act, str) or "gelu" not in act:
        raise ModelConfigError(f"{r.where}: field 'activation_function' {act!r} is not a GeLU; pipeloom models "
                               f"gpt2 with a GeLU MLP")
    return ModelConfig(name=label, hidden=h, layers=r.int("n_layer"), heads=r.int("n_head"),
                       ffn=r.int("n_inner", none_ok=True) or 4 * h, vocab=r.int("vocab_size"),
                       seq=r.int("n_positions"), mlp="gelu", norm="layernorm", bias=True,
                       gelu_saved=4 if act == "gelu_new" else 1,  # traced; gelu_fast (7 saves) is not modelled
                       tied_embeddings=r.bool("tie_word_embeddings"), learned_positions=True,
                       dropout=r.float("resid_pdrop"), norm_eps=r.float("layer_norm_epsilon"),
                       init_std=r.float("initializer_range", 0.02))


def _mixtral(r, label):
    ffn = r.int("intermediate_size")
    return _llama_like(r, label, ffn=ffn, experts=r.int("num_local_experts"),
                       experts_per_token=r.int("num_experts_per_tok"), expert_ffn=ffn)


def _dense_layers_refused(r: _Reader) -> None:
    step = r.int("decoder_sparse_step")
    only = r.raw("mlp_only_layers")
    if step != 1:
        raise ModelConfigError(f"{r.where}: field 'decoder_sparse_step' is {step}: dense and MoE layers alternate, "
                               f"which pipeloom does not model (it needs 1: every layer MoE)")
    if only:
        raise ModelConfigError(f"{r.where}: field 'mlp_only_layers' lists dense layers {only!r}, which pipeloom "
                               f"does not model (it needs [] : every layer MoE)")


def _qwen3_moe(r, label):
    _dense_layers_refused(r)
    attn_bias = r.bool("attention_bias")
    moe_ffn = r.int("moe_intermediate_size")
    return _llama_like(r, label, ffn=r.int("intermediate_size", moe_ffn), qkv_bias=attn_bias,
                       proj_bias=attn_bias, qk_norm=True, experts=r.int("num_experts"),
                       experts_per_token=r.int("num_experts_per_tok"), expert_ffn=moe_ffn)


def _qwen2_moe(r, label):
    _dense_layers_refused(r)
    moe_ffn = r.int("moe_intermediate_size")
    shared = r.raw("shared_expert_intermediate_size")
    if shared in (None, 0):
        raise ModelConfigError(f"{r.where}: field 'shared_expert_intermediate_size' must be an integer >= 1 "
                               f"(qwen2_moe always has a shared expert), got {shared!r}")
    return _llama_like(r, label, ffn=r.int("intermediate_size", moe_ffn), qkv_bias=r.bool("qkv_bias"),
                       experts=r.int("num_experts"), experts_per_token=r.int("num_experts_per_tok"),
                       expert_ffn=moe_ffn, shared_experts=1,
                       shared_expert_ffn=r.int("shared_expert_intermediate_size"), shared_expert_gate=True)


_BUILD = {"llama": _llama, "mistral": _mistral, "qwen2": _qwen2, "qwen3": _qwen3, "gpt2": _gpt2,
          "mixtral": _mixtral, "qwen3_moe": _qwen3_moe, "qwen2_moe": _qwen2_moe}


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


__all__ = ["ARCHITECTURES", "CONFIG_DIR", "from_hf_config", "hf_config_path", "load_hf_config", "resolve_model",
           "shipped_configs"]
