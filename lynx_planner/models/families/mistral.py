"""Mistral: the Llama block with a sliding window on every layer when `sliding_window` is set (7B v0.1: 4096)."""

from __future__ import annotations

from ._common import decoder

MODEL_TYPES = ("mistral",)
CLASS_PREFIX = "Mistral"
IGNORED = frozenset()


def read(f, model_type: str) -> dict:
    kw = decoder(f, "mistral")
    window = f.get("sliding_window", required=False)
    if window:
        kw |= dict(layer_types=("sliding",) * kw["num_layers"], window=window)
    return kw
