"""MLP op graphs of the Hugging Face decoder families, as lynx's profiler records them for the HF model: the SwiGLU
MLP (gate, up, down; SiLU and the product keep their inputs) and the MoE block.

MoE (transformers' grouped-GEMM experts, Megatron's GroupedMLP): a router GEMM and softmax (or DeepSeek's sigmoid
with group-limited top-k) keeping its probabilities and top-k indices, the tokens permuted by expert, one grouped GEMM
per projection over the tokens routed to this rank (balanced routing: tokens x top_k of them, whatever the EP size),
the routing weights applied and the tokens unpermuted and summed, plus shared experts. With expert parallelism the
permuted tokens go through an all-to-all dispatch before the expert GEMMs and an all-to-all combine after them,
priced on the intra-node link when the EP group (TP x EP consecutive ranks) fits in a node, else on the inter-node
one. Experts are tensor parallel like the dense MLP (Megatron's default expert-TP = TP); the router is replicated.
"""

from __future__ import annotations

from .. import costs
from ..models.spec import ModelSpec
from ..schema import ParallelConfig
from .ops import ACT, STAT, _OpList, _TP, ew

IDX = 8  # bytes of an int64 index


def swiglu(ops: _OpList, tp: _TP | None, prefix: str, n: int, h: int, f: int, src: str, ln: str,
           bias: bool = False, act: str = "silu", act_module: str = "act_fn") -> str:
    """gate_proj, SiLU, up_proj, product, down_proj on n tokens of width h, FFN f (already split by TP); `bias`:
    the projections have biases (mlp_bias: addmm); `act`: the gate's activation (gelu: GeGLU)."""
    mm = "addmm" if bias else "mm"
    if tp is not None:
        src = tp.before_column(ops, f"{prefix}.gate_proj", costs.gemm_s(4.0 * n * h * f, ops.hw))
    gate = ops.gemm(f"{prefix}.gate_proj:{mm}#0", n, h, f, saves=[ln], inputs=[src])
    act = ew(ops, f"{prefix}.{act_module}:{act}#0", ACT * n * f, saves=[gate])
    up = ops.gemm(f"{prefix}.up_proj:{mm}#0", n, h, f, saves=[ln], inputs=[src])
    prod = ew(ops, f"{prefix}:mul#0", ACT * n * f, inputs=[act, up], saves=[up, act])
    ops.gemm(f"{prefix}.down_proj:{mm}#0", n, f, h, saves=[prod], inputs=[prod])
    return ops.last


def dense_mlp(ops: _OpList, tp: _TP, spec: ModelSpec, par: ParallelConfig, ln: str) -> str:
    n = par.seq_len * par.micro_batch_size
    swiglu(ops, tp, "mlp", n, spec.hidden, spec.ffn_hidden // par.tp, ln, ln, bias=spec.mlp_bias,
           act="gelu" if spec.mlp == "geglu" else "silu")
    return tp.after_row(ops, "mlp.down_proj")


def _softmax_router(ops: _OpList, spec: ModelSpec, n: int, src: str, ln: str) -> tuple[str, str, int]:
    """(top-k indices op, routing weights op, bytes per weight) of the softmax router (Mixtral, Qwen-MoE)."""
    m = spec.moe
    e, k = m.experts, m.top_k
    ops.gemm("mlp.gate:mm#0", n, spec.hidden, e, saves=[ln], inputs=[src])
    ew(ops, "mlp.gate:_to_copy#0", STAT * n * e, read=ACT * n * e)
    ew(ops, "mlp.gate:_softmax#0", STAT * n * e, saves=["self"])
    top = ew(ops, "mlp.gate:topk#0", STAT * n * k, read=STAT * n * e, aux_bytes=IDX * n * k)
    w = top
    if m.norm_topk_prob:
        total = ew(ops, "mlp.gate:sum#0", STAT * n, inputs=[top], read=STAT * n * k)
        clone = ew(ops, "mlp.gate:clone#0", STAT * n * k, inputs=[top])
        w = ew(ops, "mlp.gate:div_#0", STAT * n * k, inputs=[top, total], saves=[total, clone], inplace=True)
    if spec.family == "mixtral":
        return top, w, STAT  # Mixtral keeps fp32 weights and casts the summed output
    return top, ew(ops, "mlp.gate:_to_copy#1", ACT * n * k, inputs=[w], read=STAT * n * k), ACT


def _deepseek_router(ops: _OpList, spec: ModelSpec, n: int, src: str, ln: str) -> tuple[str, str, int]:
    """DeepSeek-V3's router: fp32 GEMM, sigmoid scores plus a bias for the choice, top-k among the best groups, the
    chosen sigmoid scores renormalised and scaled. Groups: as many as the top-2 sums need (n_group = 8 in V3)."""
    m = spec.moe
    e, k, h = m.experts, m.top_k, spec.hidden
    g, tg = 8 if e % 8 == 0 and e >= 64 else 1, 4 if e % 8 == 0 and e >= 64 else 1
    g, tg = m.n_group or g, m.topk_group or tg
    x32 = ew(ops, "mlp.gate:_to_copy#0", STAT * n * h, inputs=[src], read=ACT * n * h)
    w32 = ew(ops, "mlp.gate:_to_copy#1", STAT * e * h, inputs=[], read=ACT * e * h)
    ops.gemm("mlp.gate:mm#0", n, h, e, saves=[w32, x32], inputs=[x32, w32])
    ops.ops[-1].out_bytes = STAT * n * e  # an fp32 GEMM
    sig = ew(ops, "mlp.gate:sigmoid#0", STAT * n * e, saves=["self"])
    biased = ew(ops, "mlp.gate:add#0", STAT * n * e)
    ew(ops, "mlp.gate:topk#0", STAT * n * g * 2, read=STAT * n * e, aux_bytes=IDX * n * g * 2)
    gs = ew(ops, "mlp.gate:sum#0", STAT * n * g)
    gtop = ew(ops, "mlp.gate:topk#1", STAT * n * tg, aux_bytes=IDX * n * tg)
    z = ew(ops, "mlp.gate:zeros_like#0", STAT * n * g, inputs=[gs])
    sc = ew(ops, "mlp.gate:scatter_#0", STAT * n * g, inputs=[z, gtop], inplace=True)
    ew(ops, "mlp.gate:_to_copy#2", n * e, inputs=[sc])
    mask = ew(ops, "mlp.gate:bitwise_not#0", n * e)
    filled = ew(ops, "mlp.gate:masked_fill#0", STAT * n * e, inputs=[biased, mask], saves=[mask])
    top = ew(ops, "mlp.gate:topk#2", STAT * n * k, inputs=[filled], read=STAT * n * e, aux_bytes=IDX * n * k)
    got = ew(ops, "mlp.gate:gather#0", STAT * n * k, inputs=[sig, top], saves=[sig])
    w = got
    if m.norm_topk_prob:
        total = ew(ops, "mlp.gate:sum#1", STAT * n, inputs=[got])
        total = ew(ops, "mlp.gate:add#1", STAT * n, inputs=[total])
        clone = ew(ops, "mlp.gate:clone#0", STAT * n * k, inputs=[got])
        w = ew(ops, "mlp.gate:div_#0", STAT * n * k, inputs=[got, total], saves=[total, clone], inplace=True)
    return top, ew(ops, "mlp.gate:mul#0", STAT * n * k, inputs=[w]), STAT


def _experts(ops: _OpList, spec: ModelSpec, par: ParallelConfig, n: int, src: str, top: str, w: str, wb: int) -> str:
    """Permute, (dispatch), grouped SwiGLU GEMMs, (combine), weight, unpermute and sum."""
    m = spec.moe
    h, nk, f, ep = spec.hidden, n * m.top_k, m.expert_ffn // par.tp, par.ep
    srt = ew(ops, "mlp.experts:sort#0", IDX * nk, inputs=[top], aux_bytes=IDX * nk)
    tok = ew(ops, "mlp.experts:floor_divide#0", IDX * nk)
    perm = ew(ops, "mlp.experts:index#0", ACT * nk * h, inputs=[src, tok], saves=[tok])
    pw = ew(ops, "mlp.experts:index#1", wb * nk, inputs=[w, srt])
    ew(ops, "mlp.experts:_to_copy#0", STAT * nk, inputs=[srt])
    ew(ops, "mlp.experts:histc#0", STAT * m.experts // ep)
    offs = ew(ops, "mlp.experts:cumsum#0", STAT * m.experts // ep)
    a2a = costs.ep_all_to_all_s(ACT * nk * h, ep, par.tp, ops.hw)  # its traffic inside and between nodes
    if ep > 1:
        ops.last = perm  # the dispatch sends the permuted tokens
        perm = ops.collective("mlp.experts:ep_dispatch#0", a2a, a2a, ACT * nk * h)
    g0 = ops.gemm("mlp.experts:_grouped_mm#0", nk, h, 2 * f, saves=[offs, perm], inputs=[perm, offs])
    act = ew(ops, "mlp.experts.act_fn:silu#0", ACT * nk * f, inputs=[g0], saves=[g0], read=ACT * nk * f)
    prod = ew(ops, "mlp.experts:mul#0", ACT * nk * f, inputs=[act, g0], saves=[g0, act])
    out = ops.gemm("mlp.experts:_grouped_mm#1", nk, f, h, saves=[offs, prod], inputs=[prod, offs])
    if ep > 1:
        out = ops.collective("mlp.experts:ep_combine#0", a2a, a2a, ACT * nk * h)
    weighted = ew(ops, "mlp.experts:mul#1", wb * nk * h, inputs=[out, pw], saves=[pw, out])
    empty = ew(ops, "mlp.experts:empty_like#0", IDX * nk, inputs=[srt])
    ar = ew(ops, "mlp.experts:arange#0", IDX * nk, inputs=[])
    inv = ew(ops, "mlp.experts:index_put_#0", IDX * nk, inputs=[empty, srt, ar], inplace=True)
    back = ew(ops, "mlp.experts:index#2", wb * nk * h, inputs=[weighted, inv], saves=[inv])
    total = ew(ops, "mlp.experts:sum#0", wb * n * h, inputs=[back], read=wb * nk * h)
    if wb != ACT:
        total = ew(ops, "mlp.experts:_to_copy#1", ACT * n * h, read=wb * n * h)
    return total


def moe(ops: _OpList, tp: _TP, spec: ModelSpec, par: ParallelConfig, ln: str, router=None) -> str:
    """The MoE block of the spec's family; returns the id carrying its output. `router`: a family's own router
    graph (ops, spec, n, src, ln) -> (top-k op, weights op, bytes per weight), else softmax or sigmoid by scoring."""
    m = spec.moe
    assert m is not None
    n, h, t = par.seq_len * par.micro_batch_size, spec.hidden, par.tp
    shared_first = spec.family == "qwen2_moe"
    first = "mlp.shared_expert.gate_proj" if shared_first else "mlp.gate"
    src = tp.before_column(ops, first, costs.gemm_s(6.0 * n * m.top_k * h * m.expert_ffn / t, ops.hw))
    shared = None
    if shared_first:
        shared = swiglu(ops, None, "mlp.shared_expert", n, h, m.shared_ffn // t, src, ln)
        shared = tp.after_row(ops, "mlp.shared_expert.down_proj")
    router = router or (_deepseek_router if m.scoring == "sigmoid" else _softmax_router)
    top, w, wb = router(ops, spec, n, src, ln)
    routed = _experts(ops, spec, par, n, src, top, w, wb)
    routed = tp.after_row(ops, "mlp.experts")
    if spec.family == "qwen2_moe":
        g = ops.gemm("mlp.shared_expert_gate:mm#0", n, h, 1, saves=[ln], inputs=[src])
        sig = ew(ops, "mlp:sigmoid#0", ACT * n, inputs=[g], saves=["self"])
        gated = ew(ops, "mlp:mul#0", ACT * n * h, inputs=[sig, shared], saves=[shared, sig])
        return ew(ops, "mlp:add#0", ACT * n * h, inputs=[routed, gated])
    if m.shared_experts:
        swiglu(ops, None, "mlp.shared_experts", n, h, m.shared_ffn // t, src, ln)
        shared = tp.after_row(ops, "mlp.shared_experts.down_proj")
        return ew(ops, "mlp:add#0", ACT * n * h, inputs=[routed, shared])
    return routed
