"""torchtitan 0.3's Llama 3 block, eager (torchtitan/models/llama3: Llama3TransformerBlock with a fused wqkv, its
RMSNorm, complex rotary and SwiGLU FeedForward), as lynx's profiler records it in bf16: op ids are torchtitan's module
paths (attention_norm, attention.qkv_linear.wqkv, attention.rope, attention.inner_attention, attention.wo, ffn_norm,
feed_forward.w1/w2/w3), so a plan from this profile applies to torchtitan's model as it is.

What it saves differs from Hugging Face's block: its RMSNorm multiplies by the weight in fp32 (keeping the fp32
normalised input as well as the fp32 input copy and rstd) and casts to bf16 after; q, k and v are contiguous copies of
the fused projection's output; rotary runs in fp32 (complex multiply) and saves nothing (the frequencies are a
buffer). tests/test_kernels.py compares it with the profile of torchtitan's own module (examples/torchtitan_llama3.py).
Compiled blocks (inductor fuses the norm and rotary) are not priced: this is the eager block. Llama only (torchtitan's
llama3 module): other families raise a ValueError, as do fp8 and MoE layers.
"""

from __future__ import annotations

from .. import costs
from ..analytic.ops import ACT, STAT, _OpList, _TP, ew
from ..models.spec import ModelSpec
from ..schema import BLOCK_INPUT, Block, Hardware, ParallelConfig


def rms_norm(ops: _OpList, prefix: str, src: str, elems: int, rows: int) -> str:
    """torchtitan's RMSNorm in bf16: x.float(), pow, mean, add eps, rsqrt, mul, times the weight (in fp32), to bf16."""
    x32 = ew(ops, f"{prefix}:_to_copy#0", STAT * elems, inputs=[src], read=ACT * elems)
    ew(ops, f"{prefix}:pow#0", STAT * elems, saves=[x32])
    ew(ops, f"{prefix}:mean#0", STAT * rows, read=STAT * elems)
    ew(ops, f"{prefix}:add_#0", STAT * rows, inplace=True)
    rstd = ew(ops, f"{prefix}:rsqrt#0", STAT * rows, saves=["self"])
    normed = ew(ops, f"{prefix}:mul#0", STAT * elems, inputs=[x32, rstd], saves=[rstd, x32])
    ew(ops, f"{prefix}:mul#1", STAT * elems, saves=[normed])
    return ew(ops, f"{prefix}:_to_copy#1", ACT * elems, read=STAT * elems)


def layer_block(spec: ModelSpec, par: ParallelConfig, hw: Hardware, name: str, kind: tuple[str, bool] | bool,
                fp8: bool = False, cp: int = 1) -> Block:
    """`kind`: analytic.decoder.layer_kind's (attention, is_moe), or is_moe alone; `cp`: context-parallel ranks."""
    attn_kind, is_moe = ("full", kind) if isinstance(kind, bool) else kind
    if attn_kind != "full":
        raise ValueError(f"--kernels {__name__.rsplit('.', 1)[-1]}: {attn_kind} attention layers are priced with the "
                         "hf kernels only")
    if fp8:
        raise ValueError("--fp8: priced for --kernels te only (torchtitan's fp8 goes through torchao's converters)")
    if spec.family != "llama" or is_moe or spec.qkv_bias or spec.qk_norm:
        raise ValueError(f"--kernels torchtitan: priced for torchtitan's Llama 3 block (family llama), not "
                         f"{spec.family}{' MoE layers' if is_moe else ''}")
    s, b, h, t = par.seq_len, par.micro_batch_size, spec.hidden, par.tp
    n = s * b
    n_loc = n // t if par.sequence_parallel else n
    heads, kv, d, f = spec.heads // t, spec.kv // t, spec.dim, spec.ffn_hidden // t
    ops = _OpList(hw, context=cp)
    tp = _TP(par, hw, n, h)

    ln1 = rms_norm(ops, "attention_norm", BLOCK_INPUT, n_loc * h, n_loc)
    src = tp.before_column(ops, "attention.qkv_linear.wqkv", costs.gemm_s(2.0 * n * h * (heads + 2 * kv) * d, hw))
    qkv = ops.gemm("attention.qkv_linear.wqkv:mm#0", n, h, (heads + 2 * kv) * d, saves=[ln1], inputs=[src])
    q, k, v = (ew(ops, f"attention.qkv_linear:clone#{i}", ACT * n * w * d, inputs=[qkv])
               for i, w in enumerate((heads, kv, kv)))
    q32 = ew(ops, "attention.rope:_to_copy#0", STAT * n * heads * d, inputs=[q], read=ACT * n * heads * d)
    k32 = ew(ops, "attention.rope:_to_copy#1", STAT * n * kv * d, inputs=[k], read=ACT * n * kv * d)
    qr = ew(ops, "attention.rope:mul#0", STAT * n * heads * d, inputs=[q32])
    kr = ew(ops, "attention.rope:mul#1", STAT * n * kv * d, inputs=[k32])
    q = ew(ops, "attention.rope:_to_copy#2", ACT * n * heads * d, inputs=[qr], read=STAT * n * heads * d)
    k = ew(ops, "attention.rope:_to_copy#3", ACT * n * kv * d, inputs=[kr], read=STAT * n * kv * d)
    flops = 2.0 * b * s * s * ops.context * heads * 2 * d  # non-causal, as FlopCounterMode counts; CP: all keys
    fwd = costs.attention_s(flops / 2, hw, per_head_flops=flops / 2 / (b * heads))  # causal: half the tiles
    core = ops.add("attention.inner_attention:_scaled_dot_product_flash_attention#0", inputs=[q, k, v],
                   saves=[q, k, v, "self"], fwd_s=fwd, bwd_s=2.5 * fwd, flops=flops, out_bytes=ACT * n * heads * d,
                   aux_bytes=STAT * b * heads * s, tags=["core_attn"])
    ops.gemm("attention.wo:mm#0", n, heads * d, h, saves=[core], inputs=[core])
    attn = tp.after_row(ops, "attention.wo")
    x = ACT * n_loc * h
    add0 = ew(ops, ":add#0", x, inputs=[BLOCK_INPUT, attn], read=2 * x)

    ln2 = rms_norm(ops, "ffn_norm", add0, n_loc * h, n_loc)
    src = tp.before_column(ops, "feed_forward.w1", costs.gemm_s(4.0 * n * h * f, hw))
    gate = ops.gemm("feed_forward.w1:mm#0", n, h, f, saves=[ln2], inputs=[src])
    act = ew(ops, "feed_forward:silu#0", ACT * n * f, saves=[gate])
    up = ops.gemm("feed_forward.w3:mm#0", n, h, f, saves=[ln2], inputs=[src])
    prod = ew(ops, "feed_forward:mul#0", ACT * n * f, inputs=[act, up], saves=[up, act])
    ops.gemm("feed_forward.w2:mm#0", n, f, h, saves=[prod], inputs=[prod])
    out = tp.after_row(ops, "feed_forward.w2")
    ew(ops, ":add#1", x, inputs=[add0, out], read=2 * x)
    return Block(name=name, input_bytes=x, output_bytes=x, ops=ops.ops)
