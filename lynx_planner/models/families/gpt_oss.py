"""gpt-oss: GQA with biases on q, k, v and o and a learned sink logit per head in every softmax, sliding-window
(128) layers alternating with full ones, a softmax-after-top-k router with a bias, and experts with biases and a
clamped SwiGLU (swiglu_limit; gate * sigmoid(1.702 gate) * (up + 1)). RMSNorm multiplies its weight in fp32.

The attention core is priced as the fused kernel with sinks (FlashAttention 3's, as the GPU runs it): q, k, v, its
output and logsumexp. transformers' own module has only an eager core on the CPU (no sdpa: it keeps the s x s+1
probabilities), so the tiny-config test compares all but the core."""

from __future__ import annotations

from ..spec import MoESpec
from ._common import decoder, layer_types

MODEL_TYPES = ("gpt_oss",)
CLASS_PREFIX = "GptOss"
# experts_per_token: a duplicate of num_experts_per_tok; initial_context_length: the rope scaling's base length
IGNORED = frozenset({"experts_per_token", "initial_context_length"})


def read(f, model_type: str) -> dict:
    kw = decoder(f, "gpt_oss", head_dim=64)
    n = kw["num_layers"]
    kinds = layer_types(f, n) if f.has("layer_types") else \
        tuple("sliding" if i % 2 == 0 else "full" for i in range(n))  # transformers' default alternation
    window = f.get("sliding_window", 128)
    limit = f.get("swiglu_limit", 7.0, kind=float, required=False)  # a clamp: same ops whatever the limit
    kw["moe"] = MoESpec(experts=f.get("num_local_experts"), top_k=f.get("num_experts_per_tok"),
                        expert_ffn=kw["ffn_hidden"], bias=True)
    bias = f.get("attention_bias", True, bool)
    return kw | dict(qkv_bias=bias, o_bias=bias, attention_sinks=True, layer_types=kinds, swiglu_limit=float(limit),
                     window=window if kinds and "sliding" in kinds else None)


def _rope(ops, src: str, nbytes: int, first: int, j: int) -> str:
    """gpt-oss's _apply_rotary_emb: the two halves x1, x2 -> (x1 cos - x2 sin, x2 cos + x1 sin), concatenated."""
    from ...analytic.ops import ew

    half = nbytes // 2
    a = ew(ops, f"self_attn:mul#{first}", half, inputs=[src])
    b = ew(ops, f"self_attn:mul#{first + 1}", half, inputs=[src])
    lo = ew(ops, f"self_attn:sub#{j}", half, inputs=[a, b])
    c = ew(ops, f"self_attn:mul#{first + 2}", half, inputs=[src])
    d = ew(ops, f"self_attn:mul#{first + 3}", half, inputs=[src])
    hi = ew(ops, f"self_attn:add#{j}", half, inputs=[c, d])
    return ew(ops, f"self_attn:cat#{j}", nbytes, inputs=[lo, hi])


def attention(ops, tp, spec, par, ln: str, kind: str) -> str:
    from ... import costs
    from ...analytic.attention import _flash, window_share
    from ...analytic.ops import ACT

    s, b, h, t = par.seq_len, par.micro_batch_size, spec.hidden, par.tp
    n, d, heads, kv = s * b, spec.dim, spec.heads // t, spec.kv // t
    mm = "addmm" if spec.qkv_bias else "mm"
    src = tp.before_column(ops, "self_attn.q_proj", costs.gemm_s(2.0 * n * h * (heads + 2 * kv) * d, ops.hw))
    q = ops.gemm(f"self_attn.q_proj:{mm}#0", n, h, heads * d, saves=[ln], inputs=[src])
    k = ops.gemm(f"self_attn.k_proj:{mm}#0", n, h, kv * d, saves=[ln], inputs=[src])
    v = ops.gemm(f"self_attn.v_proj:{mm}#0", n, h, kv * d, saves=[ln], inputs=[src])
    q = _rope(ops, q, ACT * n * heads * d, 0, 0)
    k = _rope(ops, k, ACT * n * kv * d, 4, 1)
    core = _flash(ops, q, k, v, b, s, heads, d, d, window_share(spec, kind, s * ops.context))  # the sinks: one logit per head
    ops.gemm(f"self_attn.o_proj:{'addmm' if spec.o_bias else 'mm'}#0", n, heads * d, h, saves=[core], inputs=[core])
    return tp.after_row(ops, "self_attn.o_proj")


def mlp(ops, tp, spec, par, ln: str, is_moe: bool) -> str:
    """Router (GEMM with bias, top-k, softmax over the k), permute, grouped GEMMs with per-token gathered biases,
    the clamped SwiGLU, weight, unpermute and sum; EP dispatch/combine as the shared MoE block prices them."""
    from ... import costs
    from ...analytic.mlp import IDX
    from ...analytic.ops import ACT, STAT, ew

    m = spec.moe
    n, h, t, ep = par.seq_len * par.micro_batch_size, spec.hidden, par.tp, par.ep
    e, k, f = m.experts, m.top_k, m.expert_ffn // t
    nk = n * k
    src = tp.before_column(ops, "mlp.router", costs.gemm_s(6.0 * nk * h * m.expert_ffn / t, ops.hw))
    logits = ops.gemm("mlp.router:addmm#0", n, h, e, saves=[ln], inputs=[src])
    top = ew(ops, "mlp.router:topk#0", ACT * nk, inputs=[logits], read=ACT * n * e, aux_bytes=IDX * nk)
    w = ew(ops, "mlp.router:_softmax#0", ACT * nk, inputs=[top], saves=["self"])
    srt = ew(ops, "mlp.experts:sort#0", IDX * nk, inputs=[top], aux_bytes=IDX * nk)
    tok = ew(ops, "mlp.experts:floor_divide#0", IDX * nk)
    perm = ew(ops, "mlp.experts:index#0", ACT * nk * h, inputs=[src, tok], saves=[tok])
    pw = ew(ops, "mlp.experts:index#1", ACT * nk, inputs=[w, srt])
    ew(ops, "mlp.experts:_to_copy#0", STAT * nk, inputs=[srt])
    ew(ops, "mlp.experts:histc#0", STAT * e // ep)
    offs = ew(ops, "mlp.experts:cumsum#0", STAT * e // ep)
    a2a = costs.all_to_all_s(ACT * nk * h, ep, costs.link(ops.hw, t * ep))
    if ep > 1:
        ops.last = perm
        perm = ops.collective("mlp.experts:ep_dispatch#0", a2a, a2a, ACT * nk * h)
    b0 = ew(ops, "mlp.experts:index#2", ACT * nk * 2 * f, inputs=[srt], saves=[srt])
    g0 = ops.gemm("mlp.experts:_grouped_mm#0", nk, h, 2 * f, saves=[offs, perm], inputs=[perm, offs])
    g0 = ew(ops, "mlp.experts:add_#0", ACT * nk * 2 * f, inputs=[g0, b0], inplace=True)
    gate = ew(ops, "mlp.experts:clamp#0", ACT * nk * f, inputs=[g0], saves=[g0])
    up = ew(ops, "mlp.experts:clamp#1", ACT * nk * f, inputs=[g0], saves=[g0])
    scaled = ew(ops, "mlp.experts:mul#0", ACT * nk * f, inputs=[gate])
    sig = ew(ops, "mlp.experts:sigmoid#0", ACT * nk * f, inputs=[scaled], saves=["self"])
    glu = ew(ops, "mlp.experts:mul#1", ACT * nk * f, inputs=[gate, sig], saves=[sig, gate])
    up1 = ew(ops, "mlp.experts:add#0", ACT * nk * f, inputs=[up])
    prod = ew(ops, "mlp.experts:mul#2", ACT * nk * f, inputs=[up1, glu], saves=[glu, up1])
    b1 = ew(ops, "mlp.experts:index#3", ACT * nk * h, inputs=[srt], saves=[srt])
    out = ops.gemm("mlp.experts:_grouped_mm#1", nk, f, h, saves=[offs, prod], inputs=[prod, offs])
    out = ew(ops, "mlp.experts:add_#1", ACT * nk * h, inputs=[out, b1], inplace=True)
    if ep > 1:
        out = ops.collective("mlp.experts:ep_combine#0", a2a, a2a, ACT * nk * h)
    weighted = ew(ops, "mlp.experts:mul#3", ACT * nk * h, inputs=[out, pw], saves=[pw, out])
    empty = ew(ops, "mlp.experts:empty_like#0", IDX * nk, inputs=[srt])
    ar = ew(ops, "mlp.experts:arange#0", IDX * nk, inputs=[])
    inv = ew(ops, "mlp.experts:index_put_#0", IDX * nk, inputs=[empty, srt, ar], inplace=True)
    back = ew(ops, "mlp.experts:index#4", ACT * nk * h, inputs=[weighted, inv], saves=[inv])
    ew(ops, "mlp.experts:sum#0", ACT * n * h, inputs=[back], read=ACT * nk * h)
    return tp.after_row(ops, "mlp.experts")


def _norm(ops, prefix: str, src: str, elems: int, rows: int) -> str:
    from .olmo2 import norm  # the same RMSNorm: the weight product in fp32, then the cast

    return norm(ops, prefix, src, elems, rows)


GRAPH = {"attention": attention, "mlp": mlp, "norm": _norm}
