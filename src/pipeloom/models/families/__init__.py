"""The model families pipeloom reads, one module per Hugging Face ``model_type`` (no torch).

Each module registers one :class:`~pipeloom.models.registry.Family` (config reader with transformers'
defaults, optional FLOP items, the torch chunk builder's hooks); the import lines below are the
registrations, in the order error messages and help texts list the architectures. A new family is one
new module here and one line below.

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
deepseek_v3   MLA (low-rank ``q_lora_rank`` query, ``kv_lora_rank`` latent, ``qk_nope``/``qk_rope``/``v`` head
              widths); the first ``first_k_dense_replace`` layers dense, then ``n_routed_experts`` experts of
              ``moe_intermediate_size`` + ``n_shared_experts`` shared; MTP modules counted apart
deepseek_v2   as deepseek_v3 without MTP; ``q_lora_rank`` null = a full query projection (V2-Lite)
gemma         llama layout, explicit ``head_dim`` (256), gated GeLU MLP, tied embeddings by default
gemma2        as gemma with four RMSNorms per layer, attention and final-logit soft-capping
phi3          llama layout with fused ``qkv_proj`` and ``gate_up_proj``, no biases
============  =======================================================================================

``common`` holds what several of them read alike (Llama-style fields, the rotary base, the refusal of
MoE models whose dense and sparse layers alternate). ``deepseek`` and ``gemma`` register two ``model_type``
each (one module per architecture lineage).
"""
from __future__ import annotations

from ..registry import Family, TorchChunks, architectures, families, get, register, unregister

# the registrations, one line per family
from . import llama  # noqa: E402,F401
from . import mistral  # noqa: E402,F401
from . import qwen2  # noqa: E402,F401
from . import qwen3  # noqa: E402,F401
from . import gpt2  # noqa: E402,F401
from . import mixtral  # noqa: E402,F401
from . import qwen3_moe  # noqa: E402,F401
from . import qwen2_moe  # noqa: E402,F401
from . import deepseek  # noqa: E402,F401  (deepseek_v3, deepseek_v2)
from . import gemma  # noqa: E402,F401  (gemma, gemma2)
from . import phi3  # noqa: E402,F401

__all__ = ["Family", "TorchChunks", "architectures", "families", "get", "register", "unregister"]
