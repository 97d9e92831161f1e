"""Qwen3-Next: a hybrid of Gated DeltaNet (linear attention) layers and gated softmax-attention layers
(`layer_types`, or every `full_attention_interval`-th layer softmax), MoE layers with a shared expert behind a sigmoid
gate, (1 + weight) RMSNorms in fp32, per-head q/k norms and partial rotary (partial_rotary_factor, 0.25) on the
softmax layers, whose q_proj also projects a gate multiplying the attention output (sigmoid).

The Gated DeltaNet layer is its own block type (`linear_attn.*`): in_proj_qkvz and in_proj_ba, a causal depthwise
conv1d with SiLU over q, k and v, beta = sigmoid(b) and the decay g = -exp(A_log) softplus(a + dt_bias) in fp32, the
gated delta rule, a gated RMSNorm (SiLU of z) and out_proj. The delta rule is priced as transformers runs it without
flash-linear-attention (`torch_chunk_gated_delta_rule`, what lynx's profiler sees on the CPU): q, k (L2-normed), v,
beta and g in fp32, the sequence padded to chunks of 64, per chunk 64 x 64 decay and q·k matrices, two triangular
solves, then a loop over the chunks whose every state (key_head_dim x value_head_dim per value head, fp32) autograd
keeps. flash-linear-attention's fused kernel keeps less (q, k, v, the gates and the chunks' solved matrices; it
recomputes the states in its backward): the profile's note says so. The fp32 batched GEMMs of the fallback are priced
at FP32_GEMM times the bf16 tensor-core time (torch's fp32 matmuls do not use TF32 by default).

Tensor parallelism splits the linear-attention heads like the softmax ones (in-projections column parallel, conv1d
and gates by head, out_proj row parallel; key heads must divide by TP). Context parallelism is refused for the
linear-attention layers (the recurrence runs across the whole sequence)."""

from __future__ import annotations

from ...io import InputError, LayoutError
from ..spec import LinearAttentionSpec, MoESpec
from ._common import decoder

MODEL_TYPES = ("qwen3_next",)
CLASS_PREFIX = "Qwen3Next"
IGNORED: frozenset[str] = frozenset()
FP32_GEMM = 16  # bf16 tensor-core over fp32 FLOP/s (A100: 312 / 19.5; H100 SXM: 989 / 67)
_KINDS = {"linear_attention": "linear", "full_attention": "full"}


def read(f, model_type: str) -> dict:
    kw = decoder(f, "qwen3_next", head_dim=256, vocab=151_936)
    n = kw["num_layers"]
    if f.get("attention_bias", False, bool):
        raise InputError(f"{f.where}: field 'attention_bias': true is not supported for model_type 'qwen3_next'")
    f.expect("use_sliding_window", False, False, "Qwen3-Next's attention has no sliding window")
    f.expect("sliding_window", None, None, "Qwen3-Next's attention has no sliding window")
    interval = f.get("full_attention_interval", 4)  # transformers' default when layer_types is not given
    given = f.get("layer_types", [], kind=list, required=False)
    if given:
        if len(given) != n or any(t not in _KINDS for t in given):
            bad = next((t for t in given if t not in _KINDS), None)
            raise InputError(f"{f.where}: field 'layer_types': expected {n} entries among {', '.join(_KINDS)}"
                             + (f", not {bad!r}" if bad is not None else f", not {len(given)}"))
        kinds = [_KINDS[t] for t in given]
    else:
        kinds = ["linear" if (i + 1) % interval else "full" for i in range(n)]
    key_heads, value_heads = f.get("linear_num_key_heads", 16), f.get("linear_num_value_heads", 32)
    if value_heads % key_heads:
        raise InputError(f"{f.where}: field 'linear_num_value_heads' ({value_heads}) must be a multiple of "
                         f"'linear_num_key_heads' ({key_heads})")
    gdn = LinearAttentionSpec(key_heads=key_heads, value_heads=value_heads,
                              key_head_dim=f.get("linear_key_head_dim", 128),
                              value_head_dim=f.get("linear_value_head_dim", 128),
                              conv_kernel=f.get("linear_conv_kernel_dim", 4))
    shared = f.get("shared_expert_intermediate_size", 512)
    if not shared:
        raise InputError(f"{f.where}: field 'shared_expert_intermediate_size' must be at least 1 (Qwen3-Next's MoE "
                         "layers always have a shared expert)")
    kw["moe"] = MoESpec(experts=f.get("num_experts", 512), top_k=f.get("num_experts_per_tok", 10),
                        expert_ffn=f.get("moe_intermediate_size", 512), shared_experts=1, shared_ffn=shared,
                        shared_gate=True, norm_topk_prob=f.get("norm_topk_prob", True, bool),
                        step=f.get("decoder_sparse_step", 1), dense_ids=tuple(f.ints("mlp_only_layers")))
    # partial_rotary_factor: top level in the published configs, inside rope_parameters in transformers 5's
    rope = f.cfg.get("rope_parameters") if isinstance(f.cfg.get("rope_parameters"), dict) else {}
    fraction = f.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.25), kind=float, required=False)
    linear = tuple(i for i, k in enumerate(kinds) if k == "linear")
    if linear:
        f.note("linear_attention layers (Gated DeltaNet): the delta rule priced as transformers' torch fallback "
               "(fp32, chunks of 64, every chunk's recurrent state kept for the backward); flash-linear-attention's "
               "fused kernel keeps less (it recomputes the states)")
    return kw | dict(qk_norm=True, attn_output_gate=True, rotary_fraction=float(fraction),
                     linear_attention=gdn if linear else None, linear_layers=linear,
                     mtp_layers=f.get("num_nextn_predict_layers", 0))


def norm(ops, prefix: str, src: str, elems: int, rows: int) -> str:
    """Qwen3NextRMSNorm: Gemma's (1 + weight) RMSNorm in fp32."""
    from .gemma3 import norm as gemma_norm

    return gemma_norm(ops, prefix, src, elems, rows)


def _gated_attention(ops, tp, spec, par, ln: str, kind: str) -> str:
    """Qwen3NextAttention: q_proj gives q and a gate per head (the gate made contiguous), per-head (1 + w) q/k
    norms, partial rotary, the fused core, its output times sigmoid(gate), o_proj."""
    from ... import costs
    from ...analytic.attention import _flash, partial_rope, window_share
    from ...analytic.ops import ACT, ew

    s, b, h, t = par.seq_len, par.micro_batch_size, spec.hidden, par.tp
    n, d, heads, kv = s * b, spec.dim, spec.heads // t, spec.kv // t
    src = tp.before_column(ops, "self_attn.q_proj", costs.gemm_s(2.0 * n * h * (2 * heads + 2 * kv) * d, ops.hw))
    qg = ops.gemm("self_attn.q_proj:mm#0", n, h, 2 * heads * d, saves=[ln], inputs=[src])
    gate = ew(ops, "self_attn:clone#0", ACT * n * heads * d, inputs=[qg])
    q = norm(ops, "self_attn.q_norm", qg, n * heads * d, n * heads)
    k = ops.gemm("self_attn.k_proj:mm#0", n, h, kv * d, saves=[ln], inputs=[src])
    k = norm(ops, "self_attn.k_norm", k, n * kv * d, n * kv)
    v = ops.gemm("self_attn.v_proj:mm#0", n, h, kv * d, saves=[ln], inputs=[src])
    q, k = partial_rope(ops, q, k, n, heads, kv, d, spec.rotary_fraction)
    core = _flash(ops, q, k, v, b, s, heads, d, d, window_share(spec, kind, s * ops.context))
    out = ew(ops, "self_attn:clone#1", ACT * n * heads * d, inputs=[core])
    sig = ew(ops, "self_attn:sigmoid#0", ACT * n * heads * d, inputs=[gate], saves=["self"])
    gated = ew(ops, "self_attn:mul#4", ACT * n * heads * d, inputs=[out, sig], saves=[sig, out])
    ops.gemm("self_attn.o_proj:mm#0", n, heads * d, h, saves=[gated], inputs=[gated])
    return tp.after_row(ops, "self_attn.o_proj")


def _fp32_bmm(ops, id: str, m: int, k: int, n: int, batch: int, inputs: list[str], saves: list[str]) -> str:
    """A batched fp32 matmul of the fallback: fp32 outputs, FP32_GEMM times the bf16 GEMM's time."""
    from ...analytic.ops import STAT

    ops.gemm(id, m, k, n, saves=saves, inputs=inputs, batch=batch)
    op = ops.ops[-1]
    op.out_bytes, op.fwd_s, op.bwd_s = STAT * batch * m * n, op.fwd_s * FP32_GEMM, op.bwd_s * FP32_GEMM
    return id


def gated_delta_net(ops, tp, spec, par, ln: str) -> str:
    """Qwen3NextGatedDeltaNet with transformers' torch chunked fallback (module docstring), one rank's heads."""
    from ... import costs
    from ...analytic.ops import ACT, STAT, ew

    g = spec.linear_attention
    s, b, h, t = par.seq_len, par.micro_batch_size, spec.hidden, par.tp
    if g.key_heads % t:
        raise LayoutError(f"--tp {t} does not divide the model's linear-attention key heads ({g.key_heads})")
    if ops.context > 1:
        raise LayoutError(f"--cp {ops.context}: the Gated DeltaNet layers' recurrence runs across the whole sequence; "
                         "context parallelism is not priced for them")
    n, nk, nv, dk, dv, c = s * b, g.key_heads // t, g.value_heads // t, g.key_head_dim, g.value_head_dim, g.chunk
    kd, vd, conv = nk * dk, nv * dv, (2 * nk * dk + nv * dv)
    chunks = -(-s // c)
    S, bh = chunks * c, b * nv  # the padded sequence; (sample, value head) pairs
    p = "linear_attn"

    def x(op: str, nbytes: int, inputs: list[str], saves: list[str] | None = None, **kw) -> str:
        return ew(ops, f"{p}:{op}", nbytes, inputs=inputs, saves=saves, **kw)

    src = tp.before_column(ops, f"{p}.in_proj_qkvz", costs.gemm_s(2.0 * n * h * (2 * kd + 2 * vd + 2 * nv), ops.hw))
    qkvz = ops.gemm(f"{p}.in_proj_qkvz:mm#0", n, h, 2 * kd + 2 * vd, saves=[ln], inputs=[src])
    ba = ops.gemm(f"{p}.in_proj_ba:mm#0", n, h, 2 * nv, saves=[ln], inputs=[src])
    # the heads' interleaved q, k, v, z, b, a made contiguous
    value, z = x("clone#0", ACT * n * vd, [qkvz]), x("clone#1", ACT * n * vd, [qkvz])
    beta_in, a = x("clone#2", ACT * n * nv, [ba]), x("clone#3", ACT * n * nv, [ba])
    query, key = x("clone#4", ACT * n * kd, [qkvz]), x("clone#5", ACT * n * kd, [qkvz])
    mixed = x("cat#0", ACT * n * conv, [query, key, value])
    conv_out = ACT * b * conv * (s + g.conv_kernel - 1)  # padded both sides, then cut to the causal part
    cv = x("convolution#0", conv_out, [mixed], [mixed], read=ACT * n * conv)
    qkv = x("silu#0", ACT * n * conv, [cv], [cv])
    beta = x("sigmoid#0", ACT * n * nv, [beta_in], ["self"])
    a_log = x("_to_copy#0", STAT * nv, [])
    neg = x("neg#0", STAT * nv, [x("exp#0", STAT * nv, [a_log], ["self"])])
    a32 = x("add#0", STAT * n * nv, [x("_to_copy#1", STAT * n * nv, [a], read=ACT * n * nv)])
    sp = x("softplus#0", STAT * n * nv, [a32], [a32])
    decay = x("mul#0", STAT * n * nv, [neg, sp], [sp, neg])
    clones = 6
    qr = kr = qkv
    if nv != nk:  # each key head repeated for its value heads
        qr, kr, clones = x("clone#6", ACT * n * nv * dk, [qkv]), x("clone#7", ACT * n * nv * dk, [qkv]), 8
    q32 = x("_to_copy#2", STAT * n * nv * dk, [qr], read=ACT * n * nv * dk)
    k32 = x("_to_copy#3", STAT * n * nv * dk, [kr], read=ACT * n * nv * dk)
    v32 = x("_to_copy#4", STAT * n * nv * dv, [qkv], read=ACT * n * nv * dv)
    b32 = x("_to_copy#5", STAT * n * nv, [beta], read=ACT * n * nv)
    normed = []
    for j, src32 in enumerate((q32, k32)):  # l2norm in fp32: x * rsqrt(sum(x^2) + eps)
        sq = x(f"mul#{1 + 2 * j}", STAT * n * nv * dk, [src32], [src32])
        tot = x(f"add#{1 + j}", STAT * n * nv, [x(f"sum#{j}", STAT * n * nv, [sq], read=STAT * n * nv * dk)])
        r = x(f"rsqrt#{j}", STAT * n * nv, [tot], ["self"])
        normed.append(x(f"mul#{2 + 2 * j}", STAT * n * nv * dk, [src32, r], [r, src32]))
    qs = x("mul#5", STAT * n * nv * dk, [normed[0]])  # times dk^-0.5
    qp = x("constant_pad_nd#0", STAT * bh * S * dk, [qs], read=STAT * n * nv * dk)
    kp = x("constant_pad_nd#1", STAT * bh * S * dk, [normed[1]], read=STAT * n * nv * dk)
    vp = x("constant_pad_nd#2", STAT * bh * S * dv, [v32], read=STAT * n * nv * dv)
    bp = x("constant_pad_nd#3", STAT * bh * S, [b32], read=STAT * n * nv)
    gp = x("constant_pad_nd#4", STAT * bh * S, [decay], read=STAT * n * nv)
    v_beta = x("mul#6", STAT * bh * S * dv, [vp, bp], [bp, vp])
    k_beta = x("mul#7", STAT * bh * S * dk, [kp, bp], [bp, kp])
    mask = x("triu#0", c * c, [x("ones#0", c * c, [])])
    cum = x("cumsum#0", STAT * bh * S, [gp])
    pair = STAT * bh * chunks * c * c  # one c x c matrix per chunk and head
    pd = x("exp#1", pair, [x("masked_fill#0", pair, [x("sub#0", pair, [cum], read=STAT * bh * S), mask], [mask])],
           ["self"])
    kk = _fp32_bmm(ops, f"{p}:bmm#0", c, dk, c, bh * chunks, [k_beta, kp], [kp, k_beta])
    ut = x("mul#8", pair, [kk, pd], [pd, kk])
    qk = _fp32_bmm(ops, f"{p}:bmm#1", c, dk, c, bh * chunks, [qp, kp], [kp, qp])
    intra = x("mul#9", pair, [qk, pd], [pd, qk])
    e2 = x("exp#2", STAT * bh * S, [cum], ["self"])
    dkb = x("mul#10", STAT * bh * S * dk, [k_beta, e2], [e2, k_beta])
    # unit lower-triangular solves against the c x c system, priced as GEMMs of that shape
    new_v = _fp32_bmm(ops, f"{p}:linalg_solve_triangular#0", c, c, dv, bh * chunks, [ut, v_beta], [])
    ops.ops[-1].saves = [new_v, ut]
    kcum = _fp32_bmm(ops, f"{p}:linalg_solve_triangular#1", c, c, dk, bh * chunks, [ut, dkb], [])
    ops.ops[-1].saves = [kcum, ut]
    state = x("zeros#0", STAT * bh * dk * dv, [])
    core = x("zeros_like#0", STAT * bh * S * dv, [new_v], read=0)
    qd = x("mul#11", STAT * bh * S * dk, [qp, x("exp#3", STAT * bh * S, [cum], ["self"])], [f"{p}:exp#3", qp])
    e4 = x("exp#4", STAT * bh * S, [x("sub#1", STAT * bh * S, [cum])], ["self"])
    kdec = x("mul#12", STAT * bh * S * dk, [kp, e4], [e4, kp])
    chunk_decay = x("exp#5", STAT * bh * chunks, [cum], ["self"])
    piece = STAT * bh * c * dv  # one chunk of the output
    for i in range(chunks):  # the scan over chunks; the first reads the zero state, which needs no gradient
        first = i == 0
        read_old = _fp32_bmm(ops, f"{p}:bmm#{2 + 4 * i}", c, dk, dv, bh, [kcum, state],
                             [state] if first else [state, kcum])
        v_new = x(f"sub#{2 + i}", piece, [new_v, read_old])
        inter = _fp32_bmm(ops, f"{p}:bmm#{3 + 4 * i}", c, dk, dv, bh, [qd, state], [state] if first else [state, qd])
        within = _fp32_bmm(ops, f"{p}:bmm#{4 + 4 * i}", c, c, dv, bh, [intra, v_new], [v_new, intra])
        o = x(f"add#{3 + 2 * i}", piece, [inter, within])
        core = ops.elementwise(f"{p}:copy_#{i}", STAT * bh * S * dv, 2 * piece, 2 * piece, inputs=[core, o],
                               inplace=True)  # written into its chunk of the output
        kept = x(f"mul#{13 + i}", STAT * bh * dk * dv, [state, chunk_decay],
                 [state] if first else [chunk_decay, state])
        upd = _fp32_bmm(ops, f"{p}:bmm#{5 + 4 * i}", dk, c, dv, bh, [kdec, v_new], [v_new, kdec])
        state = x(f"add#{4 + 2 * i}", STAT * bh * dk * dv, [kept, upd])
    if chunks > 1:  # the solves' column-major output: the chunks' reshape copies
        core = x(f"clone#{clones}", STAT * bh * S * dv, [core])
    out = x("_to_copy#6", ACT * n * vd, [core], read=STAT * n * vd)
    # Qwen3NextRMSNormGated over each value head: normalised in fp32, weighted in bf16, times silu(z) in fp32
    e, rows, q = n * vd, n * nv, f"{p}.norm"
    x32 = ew(ops, f"{q}:_to_copy#0", STAT * e, inputs=[out], read=ACT * e)
    ew(ops, f"{q}:pow#0", STAT * e, inputs=[x32], saves=[x32])
    ew(ops, f"{q}:mean#0", STAT * rows, read=STAT * e)
    ew(ops, f"{q}:add#0", STAT * rows)
    rstd = ew(ops, f"{q}:rsqrt#0", STAT * rows, saves=["self"])
    ew(ops, f"{q}:mul#0", STAT * e, inputs=[x32, rstd], saves=[rstd, x32])
    y = ew(ops, f"{q}:_to_copy#1", ACT * e, read=STAT * e)
    w = ew(ops, f"{q}:mul#1", ACT * e, inputs=[y], saves=[y])
    z32 = ew(ops, f"{q}:_to_copy#2", STAT * e, inputs=[z], read=ACT * e)
    sz = ew(ops, f"{q}:silu#0", STAT * e, inputs=[z32], saves=[z32])
    gated = ew(ops, f"{q}:mul#2", STAT * e, inputs=[w, sz], saves=[sz, w])
    o16 = ew(ops, f"{q}:_to_copy#3", ACT * e, inputs=[gated], read=STAT * e)
    ops.gemm(f"{p}.out_proj:mm#0", n, vd, h, saves=[o16], inputs=[o16])
    return tp.after_row(ops, f"{p}.out_proj")


def attention(ops, tp, spec, par, ln: str, kind: str) -> str:
    if kind == "linear":
        return gated_delta_net(ops, tp, spec, par, ln)
    return _gated_attention(ops, tp, spec, par, ln, kind)


def mlp(ops, tp, spec, par, ln: str, is_moe: bool) -> str:
    """Qwen3NextSparseMoeBlock: the shared expert first, the softmax router, the routed experts, then the shared
    expert's output times sigmoid(shared_expert_gate(x)) added (Qwen2-MoE's order); dense layers are the SwiGLU."""
    from ... import costs
    from ...analytic.mlp import _experts, _softmax_router, dense_mlp, swiglu
    from ...analytic.ops import ACT, ew

    if not is_moe:
        return dense_mlp(ops, tp, spec, par, ln)
    m = spec.moe
    n, h, t = par.seq_len * par.micro_batch_size, spec.hidden, par.tp
    src = tp.before_column(ops, "mlp.shared_expert.gate_proj",
                           costs.gemm_s(6.0 * n * m.top_k * h * m.expert_ffn / t, ops.hw))
    swiglu(ops, None, "mlp.shared_expert", n, h, m.shared_ffn // t, src, ln)
    shared = tp.after_row(ops, "mlp.shared_expert.down_proj")
    top, w, wb = _softmax_router(ops, spec, n, src, ln)
    _experts(ops, spec, par, n, src, top, w, wb)
    routed = tp.after_row(ops, "mlp.experts")
    gate = ops.gemm("mlp.shared_expert_gate:mm#0", n, h, 1, saves=[ln], inputs=[src])
    sig = ew(ops, "mlp:sigmoid#0", ACT * n, inputs=[gate], saves=["self"])
    gated = ew(ops, "mlp:mul#0", ACT * n * h, inputs=[sig, shared], saves=[shared, sig])
    return ew(ops, "mlp:add#0", ACT * n * h, inputs=[routed, gated])


GRAPH = {"attention": attention, "mlp": mlp, "norm": norm}
