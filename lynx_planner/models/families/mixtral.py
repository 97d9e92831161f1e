"""Mixtral: the Mistral block with a softmax-routed MoE of SwiGLU experts on every layer."""

from __future__ import annotations

from ...io import InputError
from ..spec import MoESpec
from ._common import decoder

MODEL_TYPES = ("mixtral",)
CLASS_PREFIX = "Mixtral"
IGNORED = frozenset({"router_jitter_noise"})  # a training-time perturbation of the router logits: no memory, no time


def read(f, model_type: str) -> dict:
    kw = decoder(f, "mixtral")
    window = f.get("sliding_window", required=False)
    if window:
        kw |= dict(layer_types=("sliding",) * kw["num_layers"], window=window)
    kw["moe"] = MoESpec(experts=f.get("num_local_experts"), top_k=f.get("num_experts_per_tok"),
                        expert_ffn=kw["ffn_hidden"])
    return kw
