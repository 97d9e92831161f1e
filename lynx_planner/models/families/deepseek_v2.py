"""DeepSeek-V2 (and V2-Lite): multi-head latent attention (q through a low-rank projection where q_lora_rank is set),
rotary as a complex product in fp32, softmax routing in fp32 (greedy top-k; V2's group-limited greedy is priced as
greedy, see the note), shared experts, the first k layers dense."""

from __future__ import annotations

from ...io import InputError
from ..spec import MLASpec, MoESpec
from ._common import decoder

MODEL_TYPES = ("deepseek_v2",)
CLASS_PREFIX = "DeepseekV2"
# routed_scaling_factor: one multiply in the router's graph; aux_loss_alpha, seq_aux: loss weights; ep_size: the
# inference checkpoint's expert split
IGNORED = frozenset({"routed_scaling_factor", "aux_loss_alpha", "seq_aux", "ep_size", "scoring_func"})


def read(f, model_type: str) -> dict:
    kw = decoder(f, "deepseek_v2")
    if f.get("moe_layer_freq", 1) != 1:
        raise InputError(f"{f.where}: field 'moe_layer_freq': only 1 (every layer after the dense ones) is supported")
    if f.cfg.get("scoring_func", "softmax") != "softmax":
        raise InputError(f"{f.where}: field 'scoring_func': {f.cfg['scoring_func']!r} is not supported (softmax)")
    method = f.get("topk_method", "greedy", kind=str, required=False)
    n_group, topk_group = f.get("n_group", required=False), f.get("topk_group", required=False)
    experts = f.get("n_routed_experts")
    if method == "group_limited_greedy":
        f.note(f"topk_method 'group_limited_greedy': priced as greedy top-k; the group selection's ops (about "
               f"{4 * (n_group or 1) * 3} bytes per token, fp32 group maxima and masks of {experts} experts: "
               f"{4 * experts} bytes per token transient) are left out")
    elif method != "greedy":
        raise InputError(f"{f.where}: field 'topk_method': {method!r} is not supported (greedy, "
                         "group_limited_greedy)")
    if f.get("attention_bias", False, bool):
        raise InputError(f"{f.where}: field 'attention_bias': true is not supported for model_type 'deepseek_v2'")
    n_shared = f.get("n_shared_experts", 0)
    expert_ffn = f.get("moe_intermediate_size")
    kw["moe"] = MoESpec(experts=experts, top_k=f.get("num_experts_per_tok"), expert_ffn=expert_ffn,
                        shared_experts=n_shared, shared_ffn=n_shared * expert_ffn,
                        dense_layers=f.get("first_k_dense_replace", 0),
                        norm_topk_prob=f.get("norm_topk_prob", False, bool),
                        # the groups only where routing uses them (greedy top-k ignores n_group): exports read them
                        **(dict(n_group=n_group, topk_group=topk_group) if method == "group_limited_greedy" else {}))
    kw["mla"] = MLASpec(q_lora_rank=f.get("q_lora_rank", required=False) or None,
                        kv_lora_rank=f.get("kv_lora_rank"), qk_rope_head_dim=f.get("qk_rope_head_dim"),
                        qk_nope_head_dim=f.get("qk_nope_head_dim"), v_head_dim=f.get("v_head_dim"))
    f.get("head_dim", required=False)  # transformers derives it from the MLA dims above
    kw["head_dim"] = None
    return kw


def attention(ops, tp, spec, par, ln: str, kind: str) -> str:
    """HF DeepseekV2Attention: as V3's MLA, but the rope parts rotate as complex numbers in fp32 (cast, complex
    product, cast back), then q = q_nope ++ q_pe and k written into a new tensor; the fused core of the GPU."""
    from ... import costs
    from ...analytic.attention import _flash, window_share
    from ...analytic.ops import ACT, STAT, ew, hf_rms_norm

    m = spec.mla
    s, b, h, t = par.seq_len, par.micro_batch_size, spec.hidden, par.tp
    n, heads = s * b, spec.heads // t
    qk, rope = m.qk_nope_head_dim + m.qk_rope_head_dim, m.qk_rope_head_dim
    if m.q_lora_rank:
        qa = ops.gemm("self_attn.q_a_proj:mm#0", n, h, m.q_lora_rank, saves=[ln], inputs=[ln])
        qn = hf_rms_norm(ops, "self_attn.q_a_layernorm", qa, n * m.q_lora_rank, n)
        src = tp.before_column(ops, "self_attn.q_b_proj", costs.gemm_s(2.0 * n * m.q_lora_rank * heads * qk, ops.hw))
        q = ops.gemm("self_attn.q_b_proj:mm#0", n, m.q_lora_rank, heads * qk, saves=[qn], inputs=[src])
    else:
        src = tp.before_column(ops, "self_attn.q_proj", costs.gemm_s(2.0 * n * h * heads * qk, ops.hw))
        q = ops.gemm("self_attn.q_proj:mm#0", n, h, heads * qk, saves=[ln], inputs=[src])
    kva = ops.gemm("self_attn.kv_a_proj_with_mqa:mm#0", n, h, m.kv_lora_rank + rope, saves=[ln], inputs=[ln])
    kvn = hf_rms_norm(ops, "self_attn.kv_a_layernorm", kva, n * m.kv_lora_rank, n)
    qr, kr = n * heads * rope, n * rope
    q32 = ew(ops, "self_attn:_to_copy#0", STAT * qr, inputs=[q], read=ACT * qr)
    k32 = ew(ops, "self_attn:_to_copy#1", STAT * kr, inputs=[kva], read=ACT * kr)
    qc = ew(ops, "self_attn:mul#0", STAT * qr, inputs=[q32])
    q_pe = ew(ops, "self_attn:_to_copy#2", ACT * qr, inputs=[qc], read=STAT * qr)
    kc = ew(ops, "self_attn:mul#1", STAT * kr, inputs=[k32])
    k_pe = ew(ops, "self_attn:_to_copy#3", ACT * kr, inputs=[kc], read=STAT * kr)
    q_full = ew(ops, "self_attn:cat#0", ACT * n * heads * qk, inputs=[q, q_pe])
    kvb = ops.gemm("self_attn.kv_b_proj:mm#0", n, m.kv_lora_rank, heads * (m.qk_nope_head_dim + m.v_head_dim),
                   saves=[kvn], inputs=[kvn])
    kb = ACT * n * heads * qk
    k_full = ew(ops, "self_attn:new_empty#0", kb, inputs=[kvb], read=0)
    k_full = ew(ops, "self_attn:copy_#0", kb, inputs=[k_full, kvb], inplace=True)
    k_full = ew(ops, "self_attn:copy_#1", kb, inputs=[k_full, k_pe], inplace=True)
    core = _flash(ops, q_full, k_full, kvb, b, s, heads, qk, m.v_head_dim, window_share(spec, kind, s * ops.context))
    ops.gemm("self_attn.o_proj:mm#0", n, heads * m.v_head_dim, h, saves=[core], inputs=[core])
    return tp.after_row(ops, "self_attn.o_proj")


def router(ops, spec, n: int, src: str, ln: str):
    """fp32 router GEMM, softmax, greedy top-k (renormalised with norm_topk_prob), scaled; fp32 weights."""
    from ...analytic.mlp import IDX
    from ...analytic.ops import ACT, STAT, ew

    m = spec.moe
    e, k, h = m.experts, m.top_k, spec.hidden
    x32 = ew(ops, "mlp.gate:_to_copy#0", STAT * n * h, inputs=[src], read=ACT * n * h)
    w32 = ew(ops, "mlp.gate:_to_copy#1", STAT * e * h, inputs=[], read=ACT * e * h)
    ops.gemm("mlp.gate:mm#0", n, h, e, saves=[w32, x32], inputs=[x32, w32])
    ops.ops[-1].out_bytes = STAT * n * e  # an fp32 GEMM
    ew(ops, "mlp.gate:_softmax#0", STAT * n * e, saves=["self"])
    top = ew(ops, "mlp.gate:topk#0", STAT * n * k, read=STAT * n * e, aux_bytes=IDX * n * k)
    w = top
    if m.norm_topk_prob:
        total = ew(ops, "mlp.gate:sum#0", STAT * n, inputs=[top], read=STAT * n * k)
        total = ew(ops, "mlp.gate:add#0", STAT * n, inputs=[total])
        clone = ew(ops, "mlp.gate:clone#0", STAT * n * k, inputs=[top])
        w = ew(ops, "mlp.gate:div_#0", STAT * n * k, inputs=[top, total], saves=[total, clone], inplace=True)
    return top, ew(ops, "mlp.gate:mul#0", STAT * n * k, inputs=[w]), STAT


def mlp(ops, tp, spec, par, ln: str, is_moe: bool) -> str:
    from ...analytic.mlp import dense_mlp, moe

    return moe(ops, tp, spec, par, ln, router=router) if is_moe else dense_mlp(ops, tp, spec, par, ln)


GRAPH = {"attention": attention, "mlp": mlp}
