"""DeepSeek-V3 (and Kimi K2, a DeepSeek-V3 shape with its own model_type): multi-head latent attention, sigmoid
group-limited routing over many small experts plus shared experts, the first k layers dense, and
multi-token-prediction modules (num_nextn_predict_layers)."""

from __future__ import annotations

from ...io import InputError
from ..spec import MLASpec, MoESpec
from ._common import decoder

MODEL_TYPES = ("deepseek_v3", "kimi_k2")
CLASS_PREFIX = "DeepseekV3"
# ep_size: the inference checkpoint's expert split; rope_interleave: the rotation's element order (same bytes);
# aux_loss_alpha, seq_aux: loss weights (routed_scaling_factor: one multiply in the router's graph, read for exports)
IGNORED = frozenset({"ep_size", "rope_interleave", "aux_loss_alpha", "seq_aux",
                     "scoring_func", "topk_method"})


def read(f, model_type: str) -> dict:
    kw = decoder(f, "deepseek_v3")
    if f.get("moe_layer_freq", 1) != 1:
        raise InputError(f"{f.where}: field 'moe_layer_freq': only 1 (every layer after the dense ones) is supported")
    if f.cfg.get("scoring_func", "sigmoid") != "sigmoid":
        raise InputError(f"{f.where}: field 'scoring_func': {f.cfg['scoring_func']!r} is not supported (sigmoid)")
    n_shared = f.get("n_shared_experts", 0)
    expert_ffn = f.get("moe_intermediate_size")
    kw["moe"] = MoESpec(experts=f.get("n_routed_experts"), top_k=f.get("num_experts_per_tok"),
                        expert_ffn=expert_ffn, shared_experts=n_shared, shared_ffn=n_shared * expert_ffn,
                        dense_layers=f.get("first_k_dense_replace", 0),
                        norm_topk_prob=f.get("norm_topk_prob", True, bool), scoring="sigmoid",
                        n_group=f.get("n_group", required=False), topk_group=f.get("topk_group", required=False),
                        scaling=float(f.get("routed_scaling_factor", 1.0, kind=float, required=False)))
    kw["mla"] = MLASpec(q_lora_rank=f.get("q_lora_rank", required=False) or None,
                        kv_lora_rank=f.get("kv_lora_rank"), qk_rope_head_dim=f.get("qk_rope_head_dim"),
                        qk_nope_head_dim=f.get("qk_nope_head_dim"), v_head_dim=f.get("v_head_dim"))
    kw["head_dim"] = None
    f.get("head_dim", required=False)  # transformers sets it to qk_rope_head_dim; MLA's dims are above
    f.get("attention_bias", False, bool)  # noqa: the MLA projections have no biases in DeepSeek-V3
    if f.cfg.get("attention_bias"):
        raise InputError(f"{f.where}: field 'attention_bias': true is not supported for model_type {model_type!r}")
    kw["mtp_layers"] = f.get("num_nextn_predict_layers", 0)
    return kw
