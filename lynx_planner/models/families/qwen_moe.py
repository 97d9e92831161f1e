"""Qwen2-MoE and Qwen3-MoE: softmax-routed experts; Qwen2-MoE adds a shared expert behind a sigmoid gate and q/k/v
biases, Qwen3-MoE per-head q/k norms. decoder_sparse_step and mlp_only_layers make some layers dense."""

from __future__ import annotations

from ..spec import MoESpec
from ._common import decoder, qwen_sliding

MODEL_TYPES = ("qwen2_moe", "qwen3_moe")
FAMILIES = ("qwen3_moe",)
CLASS_PREFIX = {"qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe"}
IGNORED = frozenset()


def read(f, model_type: str) -> dict:
    qwen2 = model_type == "qwen2_moe"
    kw = decoder(f, model_type, head_dim=None if qwen2 else 128)
    shared = f.get("shared_expert_intermediate_size") if qwen2 else 0
    kw["moe"] = MoESpec(experts=f.get("num_experts"), top_k=f.get("num_experts_per_tok"),
                        expert_ffn=f.get("moe_intermediate_size"), shared_experts=1 if shared else 0,
                        shared_ffn=shared, shared_gate=bool(shared),
                        norm_topk_prob=f.get("norm_topk_prob", False, bool),
                        step=max(1, f.get("decoder_sparse_step", 1)), dense_ids=tuple(f.ints("mlp_only_layers")))
    if not qwen2 and f.get("attention_bias", False, bool):
        from ...io import InputError

        raise InputError(f"{f.where}: field 'attention_bias': true is not supported for model_type {model_type!r}")
    return kw | dict(qkv_bias=qwen2, qk_norm=not qwen2) | qwen_sliding(f, kw["num_layers"])
