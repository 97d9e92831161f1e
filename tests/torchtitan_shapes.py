"""The shape of a model torchtitan 0.3 builds from one of its config_registry functions, read from its
Trainer.Config's model config (what its modules are built from), in the terms of
lynx_planner.exports.torchtitan_model.signature."""

from __future__ import annotations

import importlib
import warnings


def shape(module: str, config: str, flavor: str) -> dict:
    """`config`'s model; where it needs a package not installed here (llama3_405b's float8 needs torchao), the model
    of `flavor` that it names (model_registry(flavor), without its converters)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            spec = getattr(importlib.import_module(f"torchtitan.models.{module}.config_registry"), config)().model_spec
            assert spec.flavor == flavor, (config, spec.flavor)
        except ImportError:
            spec = importlib.import_module(f"torchtitan.models.{module}").model_registry(flavor)
    m = spec.model
    first = m.layers[0]
    att = first.attention
    out = {"layers": len(m.layers), "hidden": m.dim, "vocab": m.vocab_size, "heads": att.n_heads,
           "rope_theta": float(att.rope.theta), "rope_scaling": att.rope.scaling,
           "tied": bool(getattr(m, "enable_weight_tying", False))}
    if hasattr(att, "kv_lora_rank"):
        out["mla"] = (att.q_lora_rank or None, att.kv_lora_rank, att.qk_nope_head_dim, att.qk_rope_head_dim,
                      att.v_head_dim)
    else:
        out |= {"kv_heads": att.n_kv_heads, "head_dim": att.qkv_linear.head_dim, "qk_norm": getattr(att, "qk_norm", None) is not None}
    dense = [layer for layer in m.layers if layer.moe is None]
    moe_layers = [layer for layer in m.layers if layer.moe is not None]
    assert m.layers[:len(dense)] == dense, "dense layers first"
    if dense:
        out["ffn"] = dense[0].feed_forward.w1.out_features
    if moe_layers:
        moe = moe_layers[0].moe
        r = moe.router
        out["moe"] = (moe.num_experts, r.top_k, moe.routed_experts.inner_experts.hidden_dim,
                      moe.shared_experts.w1.out_features if moe.shared_experts is not None else 0, len(dense),
                      r.score_func, r.route_norm, float(r.route_scale), r.num_expert_groups or 1,
                      r.num_limited_groups or 1)
    # gpt-oss's: per-layer windows, a sink logit per head, biased projections, experts' clamped SwiGLU
    windows = tuple(getattr(layer.attention, "sliding_window_size", None) for layer in m.layers)
    if any(windows):
        out["windows"] = windows
    if "sinks" in (att.param_init or {}):
        out["sinks"] = True
    qkv = getattr(att, "qkv_linear", None)  # MLA's projections have no biases
    qkv_bias = any(getattr(getattr(qkv, w, None), "bias", False) for w in ("wqkv", "wq", "wkv"))
    o_bias = bool(getattr(getattr(att, "wo", None), "bias", False))
    if qkv_bias or o_bias:
        out["attention_bias"] = (qkv_bias, o_bias)
    if moe_layers:
        inner = moe.routed_experts.inner_experts
        if r.gate.bias and {"mlp1_bias_EG", "mlp2_bias_ED"} <= set(inner.param_init or {}):
            out["expert_bias"] = True
        if getattr(inner, "swiglu_limit", None) is not None:
            out["swiglu_limit"] = inner.swiglu_limit
    return out
