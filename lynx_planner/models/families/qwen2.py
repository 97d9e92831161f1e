"""Qwen2 / Qwen2.5: the Llama block with biases on q, k and v; a sliding window only with use_sliding_window."""

from __future__ import annotations

from ._common import decoder, qwen_sliding

MODEL_TYPES = ("qwen2",)
CLASS_PREFIX = "Qwen2"
IGNORED = frozenset()


def read(f, model_type: str) -> dict:
    kw = decoder(f, "qwen2")
    return kw | dict(qkv_bias=True) | qwen_sliding(f, kw["num_layers"])
