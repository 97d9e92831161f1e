"""Qwen3: the Llama block with a per-head RMSNorm on q and k (head_dim defaults to 128)."""

from __future__ import annotations

from ...io import InputError
from ._common import decoder, qwen_sliding

MODEL_TYPES = ("qwen3",)
CLASS_PREFIX = "Qwen3"
IGNORED = frozenset()


def read(f, model_type: str) -> dict:
    kw = decoder(f, "qwen3", head_dim=128)
    if f.get("attention_bias", False, bool):
        raise InputError(f"{f.where}: field 'attention_bias': true is not supported for model_type 'qwen3'")
    return kw | dict(qk_norm=True) | qwen_sliding(f, kw["num_layers"])
