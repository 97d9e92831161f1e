"""GLM-4.5 / GLM-4.5-Air (glm4_moe): GQA with q/k/v biases (attention_bias), partial rotary (partial_rotary_factor,
0.5), optional per-head q/k norms (use_qk_norm), the first k layers dense, then DeepSeek-V3's MoE (sigmoid
group-limited routing, a shared expert), and multi-token-prediction modules (num_nextn_predict_layers)."""

from __future__ import annotations

from ..spec import MoESpec
from ._common import decoder

MODEL_TYPES = ("glm4_moe",)
CLASS_PREFIX = "Glm4Moe"
# routed_scaling_factor: one multiply in the router's graph, read for exports
IGNORED: frozenset[str] = frozenset()


def read(f, model_type: str) -> dict:
    kw = decoder(f, "glm4_moe")
    n_shared = f.get("n_shared_experts", 0)
    expert_ffn = f.get("moe_intermediate_size")
    kw["moe"] = MoESpec(experts=f.get("n_routed_experts"), top_k=f.get("num_experts_per_tok"),
                        expert_ffn=expert_ffn, shared_experts=n_shared, shared_ffn=n_shared * expert_ffn,
                        dense_layers=f.get("first_k_dense_replace", 0), scoring="sigmoid",
                        norm_topk_prob=f.get("norm_topk_prob", True, bool),
                        n_group=f.get("n_group", required=False), topk_group=f.get("topk_group", required=False),
                        scaling=float(f.get("routed_scaling_factor", 1.0, kind=float, required=False)))
    return kw | dict(qkv_bias=f.get("attention_bias", False, bool), qk_norm=f.get("use_qk_norm", False, bool),
                     rotary_fraction=f.get("partial_rotary_factor", 0.5, kind=float, required=False),
                     mtp_layers=f.get("num_nextn_predict_layers", 0))


def attention(ops, tp, spec, par, ln: str, kind: str) -> str:
    from ... import costs
    from ...analytic.attention import _flash, partial_rope, window_share
    from ...analytic.ops import ACT, ew, hf_rms_norm

    s, b, h, t = par.seq_len, par.micro_batch_size, spec.hidden, par.tp
    n, d, heads, kv = s * b, spec.dim, spec.heads // t, spec.kv // t
    mm = "addmm" if spec.qkv_bias else "mm"
    src = tp.before_column(ops, "self_attn.q_proj", costs.gemm_s(2.0 * n * h * (heads + 2 * kv) * d, ops.hw))
    q = ops.gemm(f"self_attn.q_proj:{mm}#0", n, h, heads * d, saves=[ln], inputs=[src])
    if spec.qk_norm:
        q = hf_rms_norm(ops, "self_attn.q_norm", q, n * heads * d, n * heads)
    k = ops.gemm(f"self_attn.k_proj:{mm}#0", n, h, kv * d, saves=[ln], inputs=[src])
    if spec.qk_norm:
        k = hf_rms_norm(ops, "self_attn.k_norm", k, n * kv * d, n * kv)
    v = ops.gemm(f"self_attn.v_proj:{mm}#0", n, h, kv * d, saves=[ln], inputs=[src])
    q, k = partial_rope(ops, q, k, n, heads, kv, d, spec.rotary_fraction)
    core = _flash(ops, q, k, v, b, s, heads, d, d, window_share(spec, kind, s * ops.context))
    out = ew(ops, "self_attn:clone#0", ACT * n * heads * d, inputs=[core])  # the transposed output made contiguous
    ops.gemm("self_attn.o_proj:mm#0", n, heads * d, h, saves=[out], inputs=[out])
    return tp.after_row(ops, "self_attn.o_proj")


GRAPH = {"attention": attention}
