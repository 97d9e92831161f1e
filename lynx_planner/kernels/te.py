"""Megatron-core with Transformer Engine kernels (get_gpt_layer_with_transformer_engine_spec): the decoder layer as
Megatron's TransformerLayer runs it, with its module paths as op ids.

  self_attention.linear_qkv   TE LayerNormLinear: RMSNorm fused into the QKV GEMM; saves the norm's input (the
                              layer input), its output (the GEMM's input) and the fp32 rstd
  self_attention.q_layernorm  (--qk-layernorm, Qwen3) TENorm: RMSNorm over each head's q, k; each saves its input
  self_attention.k_layernorm  (q: the reshape's copy of the split; k: TE's contiguous copy of its view of the QKV
                              output) and the fp32 rstd per head and token
  self_attention              fused rotary on q and k (saves nothing but the frequencies, a buffer); v made
                              contiguous for the fused attention (a view of the QKV output would hold all of it)
  self_attention.core_attention  fused attention: saves q, k, v, its output and the fp32 softmax statistics
  self_attention.linear_proj  row-parallel GEMM: saves its input (the attention output, already held)
  mlp.linear_fc1              LayerNormLinear: RMSNorm fused into the gate and up GEMM (one [h, 2f] weight)
  mlp                         fused SwiGLU (bias_swiglu_impl): saves its input, the fc1 output
  mlp.linear_fc2              row-parallel GEMM: saves its input, the SwiGLU output

Per layer that is (12 + 4 kv/a + 6 f/h) s·b·h/t bytes in bf16 with sequence parallelism, plus the statistics:
Korthikanti et al.'s 34 s·b·h/t of a GPT layer without dropout (2022, table 2, selective) for SwiGLU and GQA
(tests/test_kernels.py derives it by hand). With fp8 (TE's fp8 linear layers), each linear layer saves its input
quantised to one byte: the fused norms write it in fp8, linear_proj and linear_fc2 quantise their bf16 input into a
saved fp8 copy (the attention output stays held in bf16 for the fused attention's backward). GEMM times are priced at
the bf16 rate (fp8's faster GEMMs are not modelled).

With per-head q/k norms that adds (2 + 2 kv/a) s·b·a·d/t bytes (the norms' inputs) and their rstd rows.

Priced for the dense pre-norm RMSNorm/SwiGLU/rotary decoders with multi- or grouped-query attention and optional
per-head q/k norms (Llama, Mistral, Qwen2, Qwen3); MoE, MLA, post/sandwich norms, one q/k norm over all heads,
attention sinks and output gates raise a ValueError (not priced yet).
"""

from __future__ import annotations

from .. import costs
from ..analytic.ops import ACT, STAT, _OpList, _TP, ew
from ..models.spec import ModelSpec
from ..schema import BLOCK_INPUT, Block, Hardware, ParallelConfig

FP8 = 1  # bytes per fp8 element


def _unsupported(spec: ModelSpec, is_moe: bool) -> str | None:
    if spec.mla is not None:
        return "multi-head latent attention"
    if is_moe:
        return "mixture-of-experts layers"
    if spec.qk_norm and spec.qk_norm_scope != "head":
        return "q/k norms over all heads"
    if spec.norm_layout != "pre":
        return f"{spec.norm_layout} norms"
    if spec.attention_sinks or spec.attn_output_gate or spec.qk_l2_norm:
        return "attention sinks, output gates and L2 q/k norms"
    if (spec.norm, spec.mlp, spec.positions) != ("rmsnorm", "swiglu", "rotary"):
        return f"{spec.norm}, {spec.mlp}, {spec.positions} positions"
    return None


def _norm_linear_input(ops: _OpList, module: str, src: str, tokens: int, hidden: int, fp8: bool) -> str:
    """The RMSNorm fused into a LayerNormLinear: reads x, writes the normalised x (fp8 under fp8) and the fp32 rstd;
    its backward reads x, the output gradient and rstd and writes the input gradient."""
    x = ACT * tokens * hidden
    out = (FP8 if fp8 else ACT) * tokens * hidden
    return ops.elementwise(f"{module}:rmsnorm#0", out, x + out, 3 * x, inputs=[src], saves=[src],
                           aux_bytes=STAT * tokens)


def _quantize(ops: _OpList, module: str, src: str, elems: int) -> str:
    """TE's fp8 cast of a linear layer's bf16 input, saved for the weight gradient."""
    return ew(ops, f"{module}:cast_fp8#0", FP8 * elems, inputs=[src], read=ACT * elems)


def layer_block(spec: ModelSpec, par: ParallelConfig, hw: Hardware, name: str, kind: tuple[str, bool] | bool,
                fp8: bool = False, cp: int = 1) -> Block:
    """`kind`: analytic.decoder.layer_kind's (attention, is_moe), or is_moe alone; `cp`: context-parallel ranks."""
    attn_kind, is_moe = ("full", kind) if isinstance(kind, bool) else kind
    if attn_kind != "full":
        raise ValueError(f"--kernels {__name__.rsplit('.', 1)[-1]}: {attn_kind} attention layers are priced with the "
                         "hf kernels only")
    why = _unsupported(spec, is_moe)
    if why:
        raise ValueError(f"--kernels te: {why} are not priced with Transformer Engine kernels yet ({spec.family})")
    s, b, h, t = par.seq_len, par.micro_batch_size, spec.hidden, par.tp
    n = s * b
    n_loc = n // t if par.sequence_parallel else n
    heads, kv, d, f = spec.heads // t, spec.kv // t, spec.dim, spec.ffn_hidden // t
    ops = _OpList(hw, context=cp)
    tp = _TP(par, hw, n, h)

    # attention
    ln1 = _norm_linear_input(ops, "self_attention.linear_qkv", BLOCK_INPUT, n_loc, h, fp8)
    src = tp.before_column(ops, "self_attention.linear_qkv", costs.gemm_s(2.0 * n * h * (heads + 2 * kv) * d, hw))
    qkv = ops.gemm("self_attention.linear_qkv:gemm#0", n, h, (heads + 2 * kv) * d, saves=[ln1], inputs=[src])
    q = k = qkv
    if spec.qk_norm:  # TENorm on each head: saves its (contiguous) input and the fp32 rstd
        q = ew(ops, "self_attention:reshape#0", ACT * n * heads * d, inputs=[qkv])
        q = ops.elementwise("self_attention.q_layernorm:rmsnorm#0", ACT * n * heads * d, 2 * ACT * n * heads * d,
                            3 * ACT * n * heads * d, inputs=[q], saves=[q], aux_bytes=STAT * n * heads)
        k = ew(ops, "self_attention.k_layernorm:contiguous#0", ACT * n * kv * d, inputs=[qkv])
        k = ops.elementwise("self_attention.k_layernorm:rmsnorm#0", ACT * n * kv * d, 2 * ACT * n * kv * d,
                            3 * ACT * n * kv * d, inputs=[k], saves=[k], aux_bytes=STAT * n * kv)
    q = ew(ops, "self_attention:fused_rope#0", ACT * n * heads * d, inputs=[q])
    k = ew(ops, "self_attention:fused_rope#1", ACT * n * kv * d, inputs=[k])
    v = ew(ops, "self_attention:contiguous#0", ACT * n * kv * d, inputs=[qkv])
    flops = 2.0 * b * s * s * ops.context * heads * 2 * d  # non-causal, as FlopCounterMode counts; CP: all keys
    fwd = costs.attention_s(flops / 2, hw, per_head_flops=flops / 2 / (b * heads))  # causal: half the tiles
    core = ops.add("self_attention.core_attention:fused_attn#0", inputs=[q, k, v], saves=[q, k, v, "self"],
                   fwd_s=fwd, bwd_s=2.5 * fwd, flops=flops, out_bytes=ACT * n * heads * d,
                   aux_bytes=STAT * b * heads * s, tags=["core_attn"])
    proj_in = _quantize(ops, "self_attention.linear_proj", core, n * heads * d) if fp8 else core
    ops.gemm("self_attention.linear_proj:gemm#0", n, heads * d, h, saves=[proj_in], inputs=[proj_in])
    attn = tp.after_row(ops, "self_attention.linear_proj")
    x = ACT * n_loc * h
    add0 = ew(ops, ":add#0", x, inputs=[BLOCK_INPUT, attn], read=2 * x)

    # MLP
    ln2 = _norm_linear_input(ops, "mlp.linear_fc1", add0, n_loc, h, fp8)
    src = tp.before_column(ops, "mlp.linear_fc1", costs.gemm_s(4.0 * n * h * f, hw))
    fc1 = ops.gemm("mlp.linear_fc1:gemm#0", n, h, 2 * f, saves=[ln2], inputs=[src])
    act = ops.elementwise("mlp:swiglu#0", ACT * n * f, 3 * ACT * n * f, 5 * ACT * n * f, inputs=[fc1], saves=[fc1])
    fc2_in = _quantize(ops, "mlp.linear_fc2", act, n * f) if fp8 else act
    ops.gemm("mlp.linear_fc2:gemm#0", n, f, h, saves=[fc2_in], inputs=[fc2_in])
    out = tp.after_row(ops, "mlp.linear_fc2")
    ew(ops, ":add#1", x, inputs=[add0, out], read=2 * x)
    return Block(name=name, input_bytes=x, output_bytes=x, ops=ops.ops)
