"""OLMo 2: post-norm (an RMSNorm on the attention and on the MLP output, before each residual add; none before
them), q/k RMSNorm over all heads of the projection, rotary in fp32; OLMo's RMSNorm multiplies by its weight in fp32
before casting back (autograd keeps the fp32 product's input too)."""

from __future__ import annotations

from ._common import decoder

MODEL_TYPES = ("olmo2",)
CLASS_PREFIX = "Olmo2"
IGNORED = frozenset()


def read(f, model_type: str) -> dict:
    kw = decoder(f, "olmo2")
    bias = f.get("attention_bias", False, bool)
    if bias:
        from ...io import InputError

        raise InputError(f"{f.where}: field 'attention_bias': true is not supported for model_type 'olmo2'")
    return kw | dict(norm_layout="post", qk_norm=True, qk_norm_scope="all")


def norm(ops, prefix: str, src: str, elems: int, rows: int) -> str:
    """Olmo2RMSNorm: x.float(), pow, mean, add eps, rsqrt, mul, times the weight in fp32, back to bf16."""
    from ...analytic.ops import ACT, STAT, ew

    x32 = ew(ops, f"{prefix}:_to_copy#0", STAT * elems, inputs=[src], read=ACT * elems)
    ew(ops, f"{prefix}:pow#0", STAT * elems, saves=[x32])
    ew(ops, f"{prefix}:mean#0", STAT * rows, read=STAT * elems)
    ew(ops, f"{prefix}:add#0", STAT * rows)
    rstd = ew(ops, f"{prefix}:rsqrt#0", STAT * rows, saves=["self"])
    y = ew(ops, f"{prefix}:mul#0", STAT * elems, inputs=[x32, rstd], saves=[rstd, x32])
    ew(ops, f"{prefix}:mul#1", STAT * elems, saves=[y])
    return ew(ops, f"{prefix}:_to_copy#1", ACT * elems, read=STAT * elems)


def _rope32(ops, src: str, elems: int, first: int) -> str:
    """Rotary with fp32 cos/sin: the products and sum in fp32, rotate_half in bf16."""
    from ...analytic.ops import ACT, STAT, ew

    a = ew(ops, f"self_attn:mul#{first}", STAT * elems, inputs=[src], read=ACT * elems)
    neg = ew(ops, f"self_attn:neg#{first // 2}", ACT * elems // 2, inputs=[src])
    cat = ew(ops, f"self_attn:cat#{first // 2}", ACT * elems, inputs=[neg, src])
    b = ew(ops, f"self_attn:mul#{first + 1}", STAT * elems, inputs=[cat], read=ACT * elems)
    return ew(ops, f"self_attn:add#{first // 2}", STAT * elems, inputs=[a, b])


def attention(ops, tp, spec, par, ln: str, kind: str) -> str:
    from ... import costs
    from ...analytic.attention import _flash, window_share
    from ...analytic.ops import ACT, STAT, ew

    s, b, h, t = par.seq_len, par.micro_batch_size, spec.hidden, par.tp
    n, d, heads, kv = s * b, spec.dim, spec.heads // t, spec.kv // t
    # q/k norms span all heads: under TP each rank holds its heads' share (Megatron normalises per rank, as here)
    src = tp.before_column(ops, "self_attn.q_proj", costs.gemm_s(2.0 * n * h * (heads + 2 * kv) * d, ops.hw))
    q = ops.gemm("self_attn.q_proj:mm#0", n, h, heads * d, saves=[ln], inputs=[src])
    q = norm(ops, "self_attn.q_norm", q, n * heads * d, n)
    k = ops.gemm("self_attn.k_proj:mm#0", n, h, kv * d, saves=[ln], inputs=[src])
    k = norm(ops, "self_attn.k_norm", k, n * kv * d, n)
    v = ops.gemm("self_attn.v_proj:mm#0", n, h, kv * d, saves=[ln], inputs=[src])
    q = _rope32(ops, q, n * heads * d, 0)
    k = _rope32(ops, k, n * kv * d, 2)
    q = ew(ops, "self_attn:_to_copy#0", ACT * n * heads * d, inputs=[q], read=STAT * n * heads * d)
    k = ew(ops, "self_attn:_to_copy#1", ACT * n * kv * d, inputs=[k], read=STAT * n * kv * d)
    core = _flash(ops, q, k, v, b, s, heads, d, d, window_share(spec, kind, s * ops.context))
    ops.gemm("self_attn.o_proj:mm#0", n, heads * d, h, saves=[core], inputs=[core])
    return tp.after_row(ops, "self_attn.o_proj")


def layer(ops, tp, spec, par, kind, g) -> None:
    """x + norm(attn(x)), then + norm(mlp(·))."""
    from ...analytic.ops import ACT, ew
    from ...schema import BLOCK_INPUT

    attn_kind, is_moe = kind
    n = par.seq_len * par.micro_batch_size
    n_loc = n // par.tp if par.sequence_parallel else n
    x = ACT * n_loc * spec.hidden
    attn = g.attention(ops, tp, spec, par, BLOCK_INPUT, attn_kind)
    normed = norm(ops, "post_attention_layernorm", attn, n_loc * spec.hidden, n_loc)
    add0 = ew(ops, ":add#0", x, inputs=[BLOCK_INPUT, normed], read=2 * x)
    out = g.mlp(ops, tp, spec, par, add0, is_moe)
    normed = norm(ops, "post_feedforward_layernorm", out, n_loc * spec.hidden, n_loc)
    ew(ops, ":add#1", x, inputs=[add0, normed], read=2 * x)


GRAPH = {"layer": layer, "attention": attention, "norm": norm}
