"""The Megatron GPT family (ModelSpec family 'gpt'): the op graph of a Megatron-style layer with roofline times.

Op ids, order and saved tensors are those of a FakeTensorMode trace of `models/gpt_block.py` (a test checks it), with
Megatron's tensor-parallel collectives inserted: without sequence parallelism the column-parallel GEMMs get an
all-reduce of their input gradient in backward (overlapped with the weight-gradient GEMM, as Megatron does) and the
row-parallel GEMMs an all-reduce of their output in forward; with sequence parallelism these become all-gathers and
reduce-scatters, and LayerNorm, dropout and residual tensors are split along the sequence.

Bytes follow Korthikanti et al.: 2-byte activations, 1-byte dropout masks; LayerNorm statistics (fp32 mean and rstd)
and the fused attention's fp32 logsumexp are counted too, as PyTorch keeps them.
"""

from __future__ import annotations

from .. import costs
from ..io import LayoutError
from ..models.catalog import GPTConfig, as_spec
from ..models.spec import ModelSpec
from ..schema import BLOCK_INPUT, Block, Hardware, Layer, ModelInfo, ParallelConfig, Profile
from .ops import ACT, STAT, _OpList, _TP, bytes_per_param, cross_entropy_s, grad_accum_bytes

def gpt_layer_block(cfg: ModelSpec | GPTConfig, par: ParallelConfig, hw: Hardware, attention: str,
                    dropout: float) -> Block:
    cfg = as_spec(cfg)
    s, b, h, a, f, t = par.seq_len, par.micro_batch_size, cfg.hidden, cfg.heads, cfg.ffn_hidden, par.tp
    n = s * b  # tokens of a micro-batch
    n_loc = n // t if par.sequence_parallel else n  # tokens on this rank outside the TP regions
    ops = _OpList(hw, accum=grad_accum_bytes(par))
    tp = _TP(par, hw, n, h)

    ln1 = ops.layer_norm("ln1:native_layer_norm#0", n_loc, h)
    qkv_fwd = costs.gemm_s(2.0 * n * h * 3 * h / t, hw)
    tp.before_column(ops, "attn.qkv", qkv_fwd)
    qkv = ops.gemm("attn.qkv:addmm#0", n, h, 3 * h // t, saves=[ln1])

    heads = a // t
    if attention == "flash":
        flops = 4.0 * b * s * s * h / t  # q kᵀ and p v, counted non-causal as FlopCounterMode does
        fwd = costs.attention_s(flops / 2, hw, per_head_flops=flops / 2 / (b * heads))  # causal: half the tiles
        core = ops.add("attn.core:_scaled_dot_product_flash_attention#0", inputs=[qkv], saves=[qkv, "self"],
                       fwd_s=fwd, bwd_s=2.5 * fwd, flops=flops, out_bytes=ACT * n * h // t,
                       aux_bytes=STAT * b * heads * s, tags=["core_attn"])
        ctx = core
    else:
        probs_elems = b * heads * s * s
        ops.gemm("attn.core:baddbmm#0", s, h // a, s, saves=[qkv], inputs=[qkv], tags=["core_attn"],
                 batch=b * heads)  # q kᵀ per (batch, head)
        pb = ACT * probs_elems
        probs = ops.elementwise("attn.core:_softmax#0", pb, 2 * pb, 3 * pb, saves=["self"], tags=["core_attn"])
        if dropout > 0:
            probs = ops.dropout("attn.core.dropout:native_dropout#0", probs_elems, tags=["core_attn"])
        ops.gemm("attn.core:bmm#0", s, s, h // a, saves=[probs, qkv], inputs=[probs, qkv], tags=["core_attn"],
                 batch=b * heads)  # p v per (batch, head)
        x = ACT * n * h // t
        ctx = ops.elementwise("attn.core:clone#0", x, 2 * x, 2 * x)  # [b*n, s, d] -> [s, b, h] copy
    ops.gemm("attn.proj:addmm#0", n, h // t, h, saves=[ctx])
    tp.after_row(ops, "attn.proj")
    if dropout > 0:
        ops.dropout("attn_dropout:native_dropout#0", n_loc * h)
    x = ACT * n_loc * h
    add0 = ops.elementwise(":add#0", x, 3 * x, 0, inputs=[BLOCK_INPUT, ops.last])

    ln2 = ops.layer_norm("ln2:native_layer_norm#0", n_loc, h)
    tp.before_column(ops, "mlp.fc1", costs.gemm_s(2.0 * n * h * f / t, hw))
    fc1 = ops.gemm("mlp.fc1:addmm#0", n, h, f // t, saves=[ln2])
    y = ACT * n * f // t
    gelu = ops.elementwise("mlp.act:gelu#0", y, 2 * y, 3 * y, saves=[fc1])
    ops.gemm("mlp.fc2:addmm#0", n, f // t, h, saves=[gelu])
    tp.after_row(ops, "mlp.fc2")
    if dropout > 0:
        ops.dropout("mlp_dropout:native_dropout#0", n_loc * h)
    ops.elementwise(":add#1", x, 3 * x, 0, inputs=[add0, ops.last])
    return Block(name="gpt_layer", input_bytes=x, output_bytes=x, ops=ops.ops)


def embedding_block(cfg: ModelSpec | GPTConfig, par: ParallelConfig, hw: Hardware, dropout: float) -> Block:
    cfg = as_spec(cfg)
    s, b, h, t = par.seq_len, par.micro_batch_size, cfg.hidden, par.tp
    n = s * b
    n_loc = n // t if par.sequence_parallel else n
    ops = _OpList(hw, accum=grad_accum_bytes(par))
    x = ACT * n * h
    ops.elementwise("embed:embedding#0", x, 2 * x, 2 * x, saves=[BLOCK_INPUT])  # vocab-parallel lookup
    _TP(par, hw, n, h).after_row(ops, "embed")
    if dropout > 0:
        ops.dropout("embed_dropout:native_dropout#0", n_loc * h)
    return Block(name="embedding", input_bytes=8 * n, output_bytes=ACT * n_loc * h, ops=ops.ops)


def lm_head_block(cfg: ModelSpec | GPTConfig, par: ParallelConfig, hw: Hardware) -> Block:
    cfg = as_spec(cfg)
    s, b, h, v, t = par.seq_len, par.micro_batch_size, cfg.hidden, cfg.vocab, par.tp
    n = s * b
    n_loc = n // t if par.sequence_parallel else n
    ops = _OpList(hw, accum=grad_accum_bytes(par))
    ln = ops.layer_norm("final_norm:native_layer_norm#0", n_loc, h)
    logits_fwd = costs.gemm_s(2.0 * n * h * v / t, hw)
    _TP(par, hw, n, h).before_column(ops, "head", logits_fwd)
    logits = ops.gemm("head:mm#0", n, h, v // t, saves=[ln])
    # Vocab-parallel cross-entropy keeps its fp32 softmax (4 s b v / t bytes) for the backward.
    fwd, bwd = cross_entropy_s(n, v // t, hw, t)
    ops.add("loss:cross_entropy#0", inputs=[logits], fwd_s=fwd, bwd_s=bwd, out_bytes=STAT * n,
            aux_bytes=STAT * n * v // t)
    return Block(name="lm_head", input_bytes=ACT * n_loc * h, output_bytes=0, ops=ops.ops)


def layer_params(cfg: ModelSpec | GPTConfig, par: ParallelConfig) -> dict[str, int]:
    """Parameters on one tensor-parallel rank, per block type."""
    cfg = as_spec(cfg)
    h, f, t, v = cfg.hidden, cfg.ffn_hidden, par.tp, cfg.vocab
    layer = (3 * h * h + 3 * h + h * h + h * f + f + f * h) // t + h + h + 4 * h
    embed = v * h // t + par.seq_len * h
    head = 2 * h + (v * h // t if par.pp > 1 else 0)  # the output layer reuses the embedding when pp == 1
    return {"gpt_layer": layer, "embedding": embed, "lm_head": head}


def gpt_profile(cfg: ModelSpec | GPTConfig, par: ParallelConfig, hw: Hardware, attention: str = "flash",
                dropout: float = 0.0) -> Profile:
    cfg = as_spec(cfg)
    sizes = (("heads", cfg.heads), ("hidden", cfg.hidden), ("ffn hidden", cfg.ffn_hidden), ("vocab", cfg.vocab))
    for what, value in sizes:
        if value % par.tp:
            raise LayoutError(f"--tp {par.tp} does not divide the model's {what} ({value})")
    if par.sequence_parallel and par.seq_len % par.tp:
        raise LayoutError(f"--tp {par.tp} does not divide the sequence length {par.seq_len}")
    if par.cp > 1:
        raise LayoutError(f"--cp {par.cp}: context parallelism is priced for the Hugging Face families (Llama, Qwen, "
                         "Mistral, ...), not the gpt family's Megatron core attention")
    blocks = {
        "embedding": embedding_block(cfg, par, hw, dropout),
        "gpt_layer": gpt_layer_block(cfg, par, hw, attention, dropout),
        "lm_head": lm_head_block(cfg, par, hw),
    }
    params = layer_params(cfg, par)
    bpp = bytes_per_param(par)

    def layer(block: str, name: str) -> Layer:
        return Layer(block=block, name=name, params=params[block], static_bytes=int(params[block] * bpp))

    layers = [layer("embedding", "embedding")]
    layers += [layer("gpt_layer", f"layers.{i}") for i in range(cfg.num_layers)]
    layers.append(layer("lm_head", "lm_head"))
    info = ModelInfo(name=cfg.name, source="catalog", params=cfg.params(par.seq_len),
                     config={"num_layers": cfg.num_layers, "hidden": cfg.hidden, "heads": cfg.heads,
                             "ffn_hidden": cfg.ffn_hidden, "vocab": cfg.vocab})
    return Profile(model=info, parallel=par, hardware=hw, method="analytic", attention=attention, dropout=dropout,
                   blocks=blocks, layers=layers)
