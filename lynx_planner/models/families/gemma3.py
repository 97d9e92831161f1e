"""Gemma 3 (text; `gemma3` multimodal configs are read through their text_config): GeGLU (tanh GeLU), sandwich norms
(an RMSNorm before and after both attention and MLP), per-head q/k norms, local sliding-window layers between global
ones (sliding_window_pattern: every 6th layer global), the embedding scaled by sqrt(hidden) and tied to the head by
default. Gemma's RMSNorm scales by (1 + weight) in fp32."""

from __future__ import annotations

from ...io import InputError
from ._common import decoder, layer_types

MODEL_TYPES = ("gemma3_text",)
CLASS_PREFIX = "Gemma3"
EMBEDDING = "Gemma3TextScaledWordEmbedding"
# query_pre_attn_scalar: the softmax scale; rope_local_base_freq: the local layers' rotary base;
# cache_implementation: inference only
IGNORED = frozenset({"query_pre_attn_scalar", "rope_local_base_freq", "cache_implementation"})


def read(f, model_type: str) -> dict:
    # transformers' Gemma3TextConfig defaults where the published configs leave fields out
    kw = decoder(f, "gemma3_text", tie=True, head_dim=256, act="gelu_pytorch_tanh", act_field="hidden_activation",
                 vocab=262_208)
    f.get("hidden_act", kind=str, required=False)  # Gemma reads hidden_activation; hidden_act is a leftover of Gemma 1
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if f.get(key, kind=float, required=False) is not None:
            raise InputError(f"{f.where}: field {key!r}: soft-capping is not supported (null expected)")
    if f.get("attention_bias", False, bool) or f.get("use_bidirectional_attention", False, bool):
        raise InputError(f"{f.where}: fields 'attention_bias'/'use_bidirectional_attention': only false is "
                         "supported")
    n = kw["num_layers"]
    pattern = f.get("sliding_window_pattern", 6)
    kinds = layer_types(f, n, default="full") if f.has("layer_types") else \
        tuple("sliding" if (i + 1) % pattern else "full" for i in range(n))
    window = f.get("sliding_window", 4096)
    return kw | dict(mlp="geglu", norm_layout="sandwich", qk_norm=True, layer_types=kinds,
                     window=window if kinds and "sliding" in kinds else None)


def norm(ops, prefix: str, src: str, elems: int, rows: int) -> str:
    """Gemma3RMSNorm: x.float() normalised, times (1 + weight.float()), back to bf16."""
    from ...analytic.ops import ACT, STAT, ew

    width = elems // rows
    x32 = ew(ops, f"{prefix}:_to_copy#0", STAT * elems, inputs=[src], read=ACT * elems)
    ew(ops, f"{prefix}:pow#0", STAT * elems, saves=[x32])
    ew(ops, f"{prefix}:mean#0", STAT * rows, read=STAT * elems)
    ew(ops, f"{prefix}:add#0", STAT * rows)
    rstd = ew(ops, f"{prefix}:rsqrt#0", STAT * rows, saves=["self"])
    y = ew(ops, f"{prefix}:mul#0", STAT * elems, inputs=[x32, rstd], saves=[rstd, x32])
    w32 = ew(ops, f"{prefix}:_to_copy#1", STAT * width, inputs=[], read=ACT * width)
    w1 = ew(ops, f"{prefix}:add#1", STAT * width, inputs=[w32])
    ew(ops, f"{prefix}:mul#1", STAT * elems, inputs=[y, w1], saves=[w1, y])
    return ew(ops, f"{prefix}:_to_copy#2", ACT * elems, read=STAT * elems)


def attention(ops, tp, spec, par, ln: str, kind: str) -> str:
    from ... import costs
    from ...analytic.attention import _flash, _rope, window_share

    s, b, h, t = par.seq_len, par.micro_batch_size, spec.hidden, par.tp
    n, d, heads, kv = s * b, spec.dim, spec.heads // t, spec.kv // t
    from ...analytic.ops import ACT

    src = tp.before_column(ops, "self_attn.q_proj", costs.gemm_s(2.0 * n * h * (heads + 2 * kv) * d, ops.hw))
    q = ops.gemm("self_attn.q_proj:mm#0", n, h, heads * d, saves=[ln], inputs=[src])
    k = ops.gemm("self_attn.k_proj:mm#0", n, h, kv * d, saves=[ln], inputs=[src])
    v = ops.gemm("self_attn.v_proj:mm#0", n, h, kv * d, saves=[ln], inputs=[src])
    q = norm(ops, "self_attn.q_norm", q, n * heads * d, n * heads)
    k = norm(ops, "self_attn.k_norm", k, n * kv * d, n * kv)
    q = _rope(ops, q, ACT * n * heads * d, 0)
    k = _rope(ops, k, ACT * n * kv * d, 2)
    core = _flash(ops, q, k, v, b, s, heads, d, d, window_share(spec, kind, s * ops.context))
    ops.gemm("self_attn.o_proj:mm#0", n, heads * d, h, saves=[core], inputs=[core])
    return tp.after_row(ops, "self_attn.o_proj")


def layer(ops, tp, spec, par, kind, g) -> None:
    """x + post_norm(attn(norm(x))), then + post_ff_norm(mlp(pre_ff_norm(·)))."""
    from ...analytic.ops import ACT, ew
    from ...schema import BLOCK_INPUT

    attn_kind, is_moe = kind
    n = par.seq_len * par.micro_batch_size
    n_loc = n // par.tp if par.sequence_parallel else n
    e, x = n_loc * spec.hidden, ACT * n_loc * spec.hidden
    ln = norm(ops, "input_layernorm", BLOCK_INPUT, e, n_loc)
    attn = g.attention(ops, tp, spec, par, ln, attn_kind)
    attn = norm(ops, "post_attention_layernorm", attn, e, n_loc)
    add0 = ew(ops, ":add#0", x, inputs=[BLOCK_INPUT, attn], read=2 * x)
    ln = norm(ops, "pre_feedforward_layernorm", add0, e, n_loc)
    out = g.mlp(ops, tp, spec, par, ln, is_moe)
    out = norm(ops, "post_feedforward_layernorm", out, e, n_loc)
    ew(ops, ":add#1", x, inputs=[add0, out], read=2 * x)


def embedding(ops, spec, par, x: int) -> str:
    from ...analytic.ops import ew

    return ew(ops, ":mul#0", x)  # times sqrt(hidden)


GRAPH = {"layer": layer, "attention": attention, "norm": norm, "embedding": embedding}
