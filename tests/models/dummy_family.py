"""A model family that exists only in the tests: ONE new file, registered by ONE line (``register(FAMILY)``).

``pipeloom_dummy`` is a parallel-block decoder (attention and a GeLU MLP side by side after one shared
LayerNorm, as GPT-J / Falcon build theirs) whose attention is linear (no ``s x s`` score matrix). Neither
difference is one of ModelConfig's features, so the family counts its own layer: one LayerNorm instead of
two, and no attention-core FLOPs. Its config file has field names of its own (``d_model``, ``n_layers``,
``n_heads``, ``vocab``, ``mlp_ratio``). It has no transformers model (``torch=None``).
"""
from __future__ import annotations

from pipeloom.models import flops
from pipeloom.models.config import ModelConfig
from pipeloom.models.registry import Family


def read(r, label):
    h = r.int("d_model")
    return ModelConfig(name=label, arch=r.arch, hidden=h, layers=r.int("n_layers"), heads=r.int("n_heads"),
                       ffn=r.int("mlp_ratio") * h, vocab=r.int("vocab"), seq=r.int("context"), mlp="gelu",
                       norm="layernorm", tied_embeddings=r.bool("tie_embeddings"))


def layer_params(model, tp):
    # the shared count has two LayerNorms (2 * 2h); the parallel block has one
    return flops.attention_params(model, tp) + flops.mlp_params(model, tp) + 2 * model.hidden


def layer_flops(model, tokens, seq):
    gemm = 2.0 * tokens * flops.active_layer_params(model)  # linear attention: the GEMMs only
    return gemm, gemm, gemm


FAMILY = Family(model_type="pipeloom_dummy", read=read, layer_params=layer_params, layer_flops=layer_flops,
                summary="a test family: parallel attention + GeLU MLP after one LayerNorm, linear attention",
                defaults=dict(context=256, tie_embeddings=False, mlp_ratio=4), torch=None)
