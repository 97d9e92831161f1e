"""Llama 4 (text; `llama4` multimodal configs are read through their text_config): chunked attention
(attention_chunk_size) on the rotary layers and full attention on the NoPE layers (no_rope_layers: every 4th),
rotary as a complex product in fp32 followed by a weightless L2 q/k norm (use_qk_norm), temperature-scaled queries on
the NoPE layers, MoE layers (moe_layers / interleave_moe_layer_step) with a sigmoid top-k router, routed experts of
intermediate_size and a shared expert of the same width, dense layers of intermediate_size_mlp.

The MoE layers are priced as the training stacks route tokens (grouped GEMMs over tokens x top_k, the op graph
shared with the other MoE families); transformers' own Llama4TextMoe runs every expert on every token (a dense bmm),
which no training stack does, so the tiny-config test compares its dense layers only."""

from __future__ import annotations

from ...io import InputError
from ..spec import MoESpec
from ._common import decoder, layer_types

MODEL_TYPES = ("llama4_text",)
CLASS_PREFIX = "Llama4Text"
# attn_scale, floor_scale, attn_temperature_tuning: the NoPE layers' query temperature (its ops are priced whatever
# their values); router_jitter_noise: a training-time perturbation; for_llm_compressor: quantisation tooling
IGNORED = frozenset({"attn_scale", "floor_scale", "attn_temperature_tuning", "router_jitter_noise",
                     "for_llm_compressor", "no_rope_layer_interval"})


def read(f, model_type: str) -> dict:
    kw = decoder(f, "llama4_text", head_dim=128, vocab=202_048)
    n = kw["num_layers"]
    if f.get("attention_bias", False, bool):
        raise InputError(f"{f.where}: field 'attention_bias': true is not supported for model_type 'llama4_text'")
    nope = f.ints("no_rope_layers")
    interval = f.cfg.get("no_rope_layer_interval", 4)
    use_rope = [bool(x) for x in nope] if nope else [(i + 1) % interval != 0 for i in range(n)]
    if len(use_rope) != n:
        raise InputError(f"{f.where}: field 'no_rope_layers': expected {n} entries, not {len(use_rope)}")
    chunk = f.get("attention_chunk_size", 8192)
    kinds = layer_types(f, n) if f.has("layer_types") else \
        tuple("chunked" if rope else "full" for rope in use_rope)
    step = f.get("interleave_moe_layer_step", 1)
    moe_ids = f.ints("moe_layers") or list(range(step - 1, n, step))
    kw["moe"] = MoESpec(experts=f.get("num_local_experts"), top_k=f.get("num_experts_per_tok"),
                        expert_ffn=kw["ffn_hidden"], shared_experts=1, shared_ffn=kw["ffn_hidden"],
                        dense_ids=tuple(i for i in range(n) if i not in moe_ids), scoring="sigmoid")
    kw["ffn_hidden"] = f.get("intermediate_size_mlp")
    return kw | dict(qk_l2_norm=f.get("use_qk_norm", True, bool), layer_types=kinds, chunk=chunk if kinds and "chunked" in kinds else None,
                     nope_layers=tuple(i for i in range(n) if not use_rope[i]))


def _l2(ops, prefix: str, src: str, elems: int, rows: int, j: int) -> str:
    """Llama4TextL2Norm: x.float() * rsqrt(mean(x^2) + eps), back to bf16 (no weight)."""
    from ...analytic.ops import ACT, STAT, ew

    x32 = ew(ops, f"{prefix}:_to_copy#{2 * j}", STAT * elems, inputs=[src], read=ACT * elems)
    ew(ops, f"{prefix}:pow#{j}", STAT * elems, saves=[x32])
    ew(ops, f"{prefix}:mean#{j}", STAT * rows, read=STAT * elems)
    ew(ops, f"{prefix}:add#{j}", STAT * rows)
    rstd = ew(ops, f"{prefix}:rsqrt#{j}", STAT * rows, saves=["self"])
    ew(ops, f"{prefix}:mul#{j}", STAT * elems, inputs=[x32, rstd], saves=[rstd, x32])
    return ew(ops, f"{prefix}:_to_copy#{2 * j + 1}", ACT * elems, read=STAT * elems)


def attention(ops, tp, spec, par, ln: str, kind: str) -> str:
    from ... import costs
    from ...analytic.attention import _flash, window_share
    from ...analytic.ops import ACT, STAT, ew

    s, b, h, t = par.seq_len, par.micro_batch_size, spec.hidden, par.tp
    n, d, heads, kv = s * b, spec.dim, spec.heads // t, spec.kv // t
    src = tp.before_column(ops, "self_attn.q_proj", costs.gemm_s(2.0 * n * h * (heads + 2 * kv) * d, ops.hw))
    q = ops.gemm("self_attn.q_proj:mm#0", n, h, heads * d, saves=[ln], inputs=[src])
    k = ops.gemm("self_attn.k_proj:mm#0", n, h, kv * d, saves=[ln], inputs=[src])
    v = ops.gemm("self_attn.v_proj:mm#0", n, h, kv * d, saves=[ln], inputs=[src])
    qe, ke = n * heads * d, n * kv * d
    if kind == "nope":  # queries scaled by a per-position temperature (fp32), no rotary, no q/k norm
        pos = ew(ops, "self_attn:arange#0", 8 * s, inputs=[])
        x = ew(ops, "self_attn:add#0", 8 * s, inputs=[pos])
        for op in ("_to_copy#0", "add#1", "div#0", "floor#0", "log1p#0", "mul#0", "add#2"):
            x = ew(ops, f"self_attn:{op}", STAT * s, inputs=[x])
        q = ew(ops, "self_attn:mul#1", STAT * qe, inputs=[q, x], saves=[x], read=ACT * qe)
        q = ew(ops, "self_attn:_to_copy#1", ACT * qe, inputs=[q], read=STAT * qe)
    else:
        q32 = ew(ops, "self_attn:_to_copy#0", STAT * qe, inputs=[q], read=ACT * qe)
        k32 = ew(ops, "self_attn:_to_copy#1", STAT * ke, inputs=[k], read=ACT * ke)
        qc = ew(ops, "self_attn:mul#0", STAT * qe, inputs=[q32])
        kc = ew(ops, "self_attn:mul#1", STAT * ke, inputs=[k32])
        q = ew(ops, "self_attn:_to_copy#2", ACT * qe, inputs=[qc], read=STAT * qe)
        k = ew(ops, "self_attn:_to_copy#3", ACT * ke, inputs=[kc], read=STAT * ke)
        if spec.qk_l2_norm:
            q = _l2(ops, "self_attn.qk_norm", q, qe, n * heads, 0)
            k = _l2(ops, "self_attn.qk_norm", k, ke, n * kv, 1)
    core = _flash(ops, q, k, v, b, s, heads, d, d, window_share(spec, kind, s * ops.context))
    ops.gemm("self_attn.o_proj:mm#0", n, heads * d, h, saves=[core], inputs=[core])
    return tp.after_row(ops, "self_attn.o_proj")


def router(ops, spec, n: int, src: str, ln: str):
    """Llama4Router: GEMM, top-k, the chosen logits scattered into -inf, sigmoid in fp32, back to bf16."""
    from ...analytic.mlp import IDX
    from ...analytic.ops import ACT, STAT, ew

    m = spec.moe
    e, k = m.experts, m.top_k
    logits = ops.gemm("mlp.router:mm#0", n, spec.hidden, e, saves=[ln], inputs=[src])
    top = ew(ops, "mlp.router:topk#0", ACT * n * k, inputs=[logits], read=ACT * n * e, aux_bytes=IDX * n * k)
    full = ew(ops, "mlp.router:full_like#0", ACT * n * e, inputs=[logits], read=0)
    sc = ew(ops, "mlp.router:scatter_#0", ACT * n * e, inputs=[full, top], inplace=True)
    x32 = ew(ops, "mlp.router:_to_copy#0", STAT * n * e, inputs=[sc], read=ACT * n * e)
    sig = ew(ops, "mlp.router:sigmoid#0", STAT * n * e, inputs=[x32], saves=["self"])
    return top, ew(ops, "mlp.router:_to_copy#1", ACT * n * e, inputs=[sig], read=STAT * n * e), ACT


def mlp(ops, tp, spec, par, ln: str, is_moe: bool) -> str:
    from ... import costs
    from ...analytic.mlp import moe, swiglu

    if is_moe:
        return moe(ops, tp, spec, par, ln, router=router)
    n, h, f = par.seq_len * par.micro_batch_size, spec.hidden, spec.ffn_hidden // par.tp
    src = tp.before_column(ops, "feed_forward.gate_proj", costs.gemm_s(4.0 * n * h * f, ops.hw))
    swiglu(ops, None, "feed_forward", n, h, f, src, ln, act_module="activation_fn")
    return tp.after_row(ops, "feed_forward.down_proj")


GRAPH = {"attention": attention, "mlp": mlp}
