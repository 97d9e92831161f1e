"""Attention op graphs of the Hugging Face decoder families, as lynx's profiler records them for the HF model:
multi-head and grouped-query attention (q/k/v projections, optional per-head q/k RMSNorm, rotary embedding, fused
attention, output projection) and DeepSeek's multi-head latent attention. Tensor parallelism splits heads (Megatron):
q/k/v are column parallel (kv heads must divide by TP), the output projection row parallel.

Rotary: cos/sin are buffers passed in by the model (not saved per layer); q and k after the rotation are saved by the
fused attention, with GQA's smaller K/V.
"""

from __future__ import annotations

from .. import costs
from ..models.spec import ModelSpec
from ..schema import ParallelConfig
from .ops import ACT, STAT, _OpList, _TP, ew, hf_rms_norm


def _rope(ops: _OpList, src: str, nbytes: int, first: int) -> str:
    """HF apply_rotary_pos_emb on one tensor: x*cos + rotate_half(x)*sin (rotate_half: neg of one half, cat)."""
    a = ew(ops, f"self_attn:mul#{first}", nbytes, inputs=[src])
    neg = ew(ops, f"self_attn:neg#{first // 2}", nbytes // 2, inputs=[src])
    cat = ew(ops, f"self_attn:cat#{first // 2}", nbytes, inputs=[neg, src])
    b = ew(ops, f"self_attn:mul#{first + 1}", nbytes, inputs=[cat])
    return ew(ops, f"self_attn:add#{first // 2}", nbytes, inputs=[a, b])


def partial_rope(ops: _OpList, q: str, k: str, n: int, heads: int, kv: int, d: int, fraction: float
                 ) -> tuple[str, str]:
    """HF's partial rotary (rotary_fraction < 1): each of q and k rotates its first `fraction` of the head dim, then
    both rotated parts are concatenated back with the untouched rest (ops in the order HF runs them)."""
    rot = int(d * fraction)
    rotated = [_rope(ops, x, ACT * n * width * rot, 2 * j) for j, (x, width) in enumerate(((q, heads), (k, kv)))]
    return (ew(ops, "self_attn:cat#2", ACT * n * heads * d, inputs=[rotated[0], q]),
            ew(ops, "self_attn:cat#3", ACT * n * kv * d, inputs=[rotated[1], k]))


def window_share(spec: ModelSpec, kind: str, s: int) -> float:
    """The share of a causal attention's (query, key) pairs a layer of this kind computes: 1 for full attention,
    less for a sliding window or chunks (ModelSpec.kv_pairs): its FLOPs and time scale by it."""
    if kind not in ("sliding", "chunked"):
        return 1.0
    return spec.kv_pairs_of(kind, s) / (s * (s + 1) // 2)


def _flash(ops: _OpList, q: str, k: str, v: str, b: int, s: int, heads: int, qk_dim: int, v_dim: int,
           share: float = 1.0) -> str:
    """Fused causal attention: keeps q, k, v, its output and the fp32 logsumexp. `share`: window_share."""
    # counted non-causal, as FlopCounterMode does; under context parallelism the local queries meet every chunk's keys
    flops = 2.0 * b * s * s * ops.context * heads * (qk_dim + v_dim) * share
    fwd = costs.attention_s(flops / 2, ops.hw, per_head_flops=flops / 2 / (b * heads))  # causal: half the tiles
    return ops.add("self_attn:_scaled_dot_product_flash_attention#0", inputs=[q, k, v], saves=[q, k, v, "self"],
                   fwd_s=fwd, bwd_s=2.5 * fwd, flops=flops, out_bytes=ACT * b * s * heads * v_dim,
                   aux_bytes=STAT * b * heads * s, tags=["core_attn"])


def gqa(ops: _OpList, tp: _TP, spec: ModelSpec, par: ParallelConfig, ln: str, kind: str = "full") -> str:
    """MHA/GQA; returns the id carrying the attention output (the output projection or its TP collective).
    `kind`: the layer's attention (full, sliding, chunked), which prices the core by its window."""
    s, b, h, t = par.seq_len, par.micro_batch_size, spec.hidden, par.tp
    n, d, heads, kv = s * b, spec.dim, spec.heads // t, spec.kv // t
    gemm = "addmm" if spec.qkv_bias else "mm"
    src = tp.before_column(ops, "self_attn.q_proj",
                           costs.gemm_s(2.0 * n * h * (heads + 2 * kv) * d, ops.hw))
    q = ops.gemm(f"self_attn.q_proj:{gemm}#0", n, h, heads * d, saves=[ln], inputs=[src])
    if spec.qk_norm:
        q = hf_rms_norm(ops, "self_attn.q_norm", q, n * heads * d, n * heads)
    k = ops.gemm(f"self_attn.k_proj:{gemm}#0", n, h, kv * d, saves=[ln], inputs=[src])
    if spec.qk_norm:
        k = hf_rms_norm(ops, "self_attn.k_norm", k, n * kv * d, n * kv)
    v = ops.gemm(f"self_attn.v_proj:{gemm}#0", n, h, kv * d, saves=[ln], inputs=[src])
    q = _rope(ops, q, ACT * n * heads * d, 0)
    k = _rope(ops, k, ACT * n * kv * d, 2)
    core = _flash(ops, q, k, v, b, s, heads, d, d, window_share(spec, kind, s * ops.context))
    ops.gemm(f"self_attn.o_proj:{'addmm' if spec.o_bias else 'mm'}#0", n, heads * d, h, saves=[core], inputs=[core])
    return tp.after_row(ops, "self_attn.o_proj")


def mla(ops: _OpList, tp: _TP, spec: ModelSpec, par: ParallelConfig, ln: str, kind: str = "full") -> str:
    """DeepSeek's multi-head latent attention (HF DeepseekV3Attention): q through a low-rank projection and RMSNorm,
    k/v from one joint low-rank latent (plus a single shared rope key), heads split into nope and rope parts. The
    down-projections and their norms are replicated under TP (as Megatron's MLA); the up-projections are column
    parallel. The core is one fused attention keeping q, k, v, output and logsumexp (the GPU kernels; a CPU trace
    decomposes it into math ops)."""
    m = spec.mla
    assert m is not None
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
    # interleaved rope on q's and k's rope parts: x*cos - y*sin, x*sin + y*cos, cat
    qr, kr = ACT * n * heads * rope, ACT * n * rope
    q_parts = [ew(ops, f"self_attn:mul#{i}", qr // 2, inputs=[q]) for i in range(2)]
    qs = ew(ops, "self_attn:sub#0", qr // 2, inputs=q_parts)
    q_parts = [ew(ops, f"self_attn:mul#{i}", qr // 2, inputs=[q]) for i in (2, 3)]
    qa_ = ew(ops, "self_attn:add#0", qr // 2, inputs=q_parts)
    q_pe = ew(ops, "self_attn:cat#0", qr, inputs=[qs, qa_])
    k_parts = [ew(ops, f"self_attn:mul#{i}", kr // 2, inputs=[kva]) for i in (4, 5)]
    ks = ew(ops, "self_attn:sub#1", kr // 2, inputs=k_parts)
    k_parts = [ew(ops, f"self_attn:mul#{i}", kr // 2, inputs=[kva]) for i in (6, 7)]
    ka = ew(ops, "self_attn:add#1", kr // 2, inputs=k_parts)
    k_pe = ew(ops, "self_attn:cat#1", kr, inputs=[ks, ka])
    q_full = ew(ops, "self_attn:cat#2", ACT * n * heads * qk, inputs=[q, q_pe])
    kvb = ops.gemm("self_attn.kv_b_proj:mm#0", n, m.kv_lora_rank, heads * (m.qk_nope_head_dim + m.v_head_dim),
                   saves=[kvn], inputs=[kvn])
    kb = ACT * n * heads * qk  # k = k_nope ++ k_pe per head, written into a new tensor
    k_full = ew(ops, "self_attn:new_empty#0", kb, inputs=[kvb], read=0)
    k_full = ew(ops, "self_attn:copy_#0", kb, inputs=[k_full, kvb], inplace=True)
    k_full = ew(ops, "self_attn:copy_#1", kb, inputs=[k_full, k_pe], inplace=True)
    core = _flash(ops, q_full, k_full, kvb, b, s, heads, qk, m.v_head_dim, window_share(spec, kind, s * ops.context))
    ops.gemm("self_attn.o_proj:mm#0", n, heads * m.v_head_dim, h, saves=[core], inputs=[core])
    return tp.after_row(ops, "self_attn.o_proj")
