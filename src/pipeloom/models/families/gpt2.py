"""``gpt2``: ``n_embd``/``n_layer``/``n_head``/``n_positions``; LayerNorm, GeLU MLP, fused qkv with biases,
learned positions, tied embeddings by default."""
from __future__ import annotations

from ..config import ModelConfig, ModelConfigError
from ..registry import Family, register


def read(r, label):
    h = r.int("n_embd")
    act = r.raw("activation_function", "gelu_new")
    if not isinstance(act, str) or "gelu" not in act:
        raise ModelConfigError(f"{r.where}: field 'activation_function' {act!r} is not a GeLU; pipeloom models "
                               f"gpt2 with a GeLU MLP")
    return ModelConfig(name=label, arch=r.arch, hidden=h, layers=r.int("n_layer"), heads=r.int("n_head"),
                       ffn=r.int("n_inner", none_ok=True) or 4 * h, vocab=r.int("vocab_size"),
                       seq=r.int("n_positions"), mlp="gelu", norm="layernorm", bias=True,
                       gelu_saved=4 if act == "gelu_new" else 1,  # traced; gelu_fast (7 saves) is not modelled
                       tied_embeddings=r.bool("tie_word_embeddings"), learned_positions=True,
                       dropout=r.float("resid_pdrop"), norm_eps=r.float("layer_norm_epsilon"),
                       init_std=r.float("initializer_range", 0.02))


FAMILY = register(Family(
    model_type="gpt2", read=read,
    summary="``n_embd``/``n_layer``/``n_head``/``n_positions``; LayerNorm, GeLU MLP (``n_inner``, default 4h), "
            "fused qkv with biases, learned positions, tied embeddings by default",
    defaults=dict(n_inner=None, n_positions=1024, layer_norm_epsilon=1e-5, tie_word_embeddings=True,
                  resid_pdrop=0.1)))
