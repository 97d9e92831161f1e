"""Phi-3 (and Phi-4-mini): the Llama block with fused projections — one qkv_proj (v stays a view of its output, so
attention keeps the whole qkv tensor) and one gate_up_proj (SiLU and the product keep the whole gate_up output) —
partial rotary (partial_rotary_factor), and a sliding window on every layer when `sliding_window` is set."""

from __future__ import annotations

from ._common import decoder

MODEL_TYPES = ("phi3",)
CLASS_PREFIX = "Phi3"
IGNORED = frozenset()


def read(f, model_type: str) -> dict:
    kw = decoder(f, "phi3")
    if f.get("attention_bias", False, bool):
        from ...io import InputError

        raise InputError(f"{f.where}: field 'attention_bias': true is not supported for model_type 'phi3'")
    f.zero("resid_pdrop")
    f.zero("embd_pdrop")
    window = f.get("sliding_window", required=False)
    if window:
        kw |= dict(layer_types=("sliding",) * kw["num_layers"], window=window)
    kw["rotary_fraction"] = f.get("partial_rotary_factor", 1.0, kind=float, required=False)
    return kw


def rope(ops, src: str, nbytes: int, rot: int, first: int) -> str:
    """HF apply_rotary_pos_emb on the rotary part (rot of nbytes), then cat with the pass-through part."""
    from ...analytic.ops import ew

    a = ew(ops, f"self_attn:mul#{first}", rot, inputs=[src])
    neg = ew(ops, f"self_attn:neg#{first // 2}", rot // 2, inputs=[src])
    cat = ew(ops, f"self_attn:cat#{first}", rot, inputs=[neg, src])
    b = ew(ops, f"self_attn:mul#{first + 1}", rot, inputs=[cat])
    added = ew(ops, f"self_attn:add#{first // 2}", rot, inputs=[a, b])
    return ew(ops, f"self_attn:cat#{first + 1}", nbytes, inputs=[added, src])


def attention(ops, tp, spec, par, ln: str, kind: str) -> str:
    from ... import costs
    from ...analytic.attention import _flash, window_share
    from ...analytic.ops import ACT, ew

    s, b, h, t = par.seq_len, par.micro_batch_size, spec.hidden, par.tp
    n, d, heads, kv = s * b, spec.dim, spec.heads // t, spec.kv // t
    src = tp.before_column(ops, "self_attn.qkv_proj", costs.gemm_s(2.0 * n * h * (heads + 2 * kv) * d, ops.hw))
    qkv = ops.gemm("self_attn.qkv_proj:mm#0", n, h, (heads + 2 * kv) * d, saves=[ln], inputs=[src])
    rot = int(d * spec.rotary_fraction)
    q = rope(ops, qkv, ACT * n * heads * d, ACT * n * heads * rot, 0)
    k = rope(ops, qkv, ACT * n * kv * d, ACT * n * kv * rot, 2)
    core = _flash(ops, q, k, qkv, b, s, heads, d, d, window_share(spec, kind, s * ops.context))
    out = ew(ops, "self_attn:clone#0", ACT * n * heads * d, inputs=[core])  # the transposed output made contiguous
    ops.gemm("self_attn.o_proj:mm#0", n, heads * d, h, saves=[out], inputs=[out])
    return tp.after_row(ops, "self_attn.o_proj")


def mlp(ops, tp, spec, par, ln: str, is_moe: bool) -> str:
    from ... import costs
    from ...analytic.ops import ACT, ew

    n, h, f = par.seq_len * par.micro_batch_size, spec.hidden, spec.ffn_hidden // par.tp
    src = tp.before_column(ops, "mlp.gate_up_proj", costs.gemm_s(4.0 * n * h * f, ops.hw))
    gu = ops.gemm("mlp.gate_up_proj:mm#0", n, h, 2 * f, saves=[ln], inputs=[src])
    act = ew(ops, "mlp.activation_fn:silu#0", ACT * n * f, inputs=[gu], saves=[gu], read=ACT * n * f)
    prod = ew(ops, "mlp:mul#0", ACT * n * f, inputs=[gu, act], saves=[act, gu])
    ops.gemm("mlp.down_proj:mm#0", n, f, h, saves=[prod], inputs=[prod])
    return tp.after_row(ops, "mlp.down_proj")


GRAPH = {"attention": attention, "mlp": mlp}
