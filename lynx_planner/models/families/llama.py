"""Llama (2, 3, 3.1): the block every other family is described against — RMSNorm, GQA with rotary, SwiGLU."""

from __future__ import annotations

from ._common import decoder

MODEL_TYPES = ("llama",)
CLASS_PREFIX = "Llama"
IGNORED = frozenset()


def read(f, model_type: str) -> dict:
    kw = decoder(f, "llama")
    bias = f.get("attention_bias", False, bool)  # Llama's attention_bias: q, k, v and o projections
    return kw | dict(qkv_bias=bias, o_bias=bias, mlp_bias=f.get("mlp_bias", False, bool))
