"""The Hugging Face decoder families (Llama, Mistral, Qwen2/3, Mixtral, Qwen2/3-MoE, DeepSeek-V3) as analytic
profiles: layers, block names and op ids as lynx's profiler records them for the HF model of that family in bf16
(embed_tokens, layers.i, norm, lm_head), so a plan made from either applies to the same module tree. Attention and
MLP/MoE op graphs come from attention.py and mlp.py; this module assembles the layer and sizes parameters per rank.
The lm_head block is the output GEMM, as the profiler records HF's `lm_head`, followed by the loss: the stacks
(HF, torchtitan, Megatron's output_layer) compute the cross-entropy outside the head module, so it is an OUTSIDE op
(policy.py) that no plan names, while its fp32 softmax and its time still count on the last stage."""

from __future__ import annotations

from functools import lru_cache

from types import SimpleNamespace

from .. import costs
from ..io import LayoutError
from ..kernels import kernel_set
from ..policy import OUTSIDE
from ..models.families import class_prefix, family_module
from ..models.spec import ModelSpec
from ..schema import BLOCK_INPUT, Block, Hardware, Layer, ModelInfo, ParallelConfig, Profile
from .attention import gqa, mla
from .mlp import dense_mlp, moe
from .ops import ACT, STAT, _OpList, _TP, bytes_per_param, cross_entropy_s, ew, hf_rms_norm

def hooks(spec: ModelSpec) -> SimpleNamespace:
    """The op-graph pieces of the spec's family: its module's GRAPH hooks over the Llama block's defaults —
    `layer(ops, tp, spec, par, kind, g)` -> None (the whole layer), `attention(ops, tp, spec, par, ln, kind)`,
    `mlp(ops, tp, spec, par, ln, is_moe)`, `norm(ops, prefix, src, elems, rows)`, `embedding(ops, spec, par, x)`."""
    attention = lambda ops, tp, spec, par, ln, kind: (mla if spec.mla is not None else gqa)(  # noqa: E731
        ops, tp, spec, par, ln, kind=kind)
    mlp = lambda ops, tp, spec, par, ln, is_moe: (moe if is_moe else dense_mlp)(ops, tp, spec, par, ln)  # noqa: E731
    base = dict(layer=None, attention=attention, mlp=mlp, norm=hf_rms_norm, embedding=None)
    return SimpleNamespace(**(base | getattr(family_module(spec.family), "GRAPH", {})))


def layer_kind(spec: ModelSpec, i: int, seq_len: int) -> tuple[str, bool]:
    """What makes layer i's op graph: its attention (full, sliding, chunked, nope; a window or chunk that holds the
    whole sequence is full attention) and whether its MLP is MoE."""
    kind = spec.attention_kind(i)
    if (kind == "sliding" and spec.window >= seq_len) or (kind == "chunked" and spec.chunk >= seq_len):
        kind = "full"
    if i in spec.nope_layers:
        kind = "nope"  # full attention without rotary: its own op graph
    if i in spec.linear_layers:
        kind = "linear"  # a linear-attention token mixer (Gated DeltaNet): its family's op graph
    return kind, spec.is_moe_layer(i)


def layer_block(spec: ModelSpec, par: ParallelConfig, hw: Hardware, name: str, kind: tuple[str, bool] | bool,
                cp: int = 1) -> Block:
    """x + attn(norm(x)), then + mlp(norm(·)) (a dense MLP or the MoE block); a family's hooks may change the pieces
    or the whole layer. `kind`: layer_kind's (attention, is_moe), or is_moe alone for a full-attention layer.
    `par.seq_len` is the tokens of one rank: seq_len / cp under context parallelism (`cp`: attention's keys span cp
    times them)."""
    attn_kind, is_moe = ("full", kind) if isinstance(kind, bool) else kind
    n = par.seq_len * par.micro_batch_size
    n_loc = n // par.tp if par.sequence_parallel else n
    ops = _OpList(hw, context=cp)
    tp = _TP(par, hw, n, spec.hidden)
    g = hooks(spec)
    x = ACT * n_loc * spec.hidden
    if g.layer is not None:
        g.layer(ops, tp, spec, par, (attn_kind, is_moe), g)
        return Block(name=name, input_bytes=x, output_bytes=x, ops=ops.ops)
    ln1 = g.norm(ops, "input_layernorm", BLOCK_INPUT, n_loc * spec.hidden, n_loc)
    attn = g.attention(ops, tp, spec, par, ln1, attn_kind)
    add0 = ew(ops, ":add#0", x, inputs=[BLOCK_INPUT, attn], read=2 * x)
    ln2 = g.norm(ops, "post_attention_layernorm", add0, n_loc * spec.hidden, n_loc)
    out = g.mlp(ops, tp, spec, par, ln2, is_moe)
    ew(ops, ":add#1", x, inputs=[add0, out], read=2 * x)
    return Block(name=name, input_bytes=x, output_bytes=x, ops=ops.ops)


def _embedding(spec: ModelSpec, par: ParallelConfig, hw: Hardware) -> Block:
    n = par.seq_len * par.micro_batch_size
    ops = _OpList(hw)
    x = ACT * n * spec.hidden
    ops.elementwise(":embedding#0", x, 2 * x, 2 * x, saves=[BLOCK_INPUT])  # vocab-parallel lookup
    _TP(par, hw, n, spec.hidden).after_row(ops, "")
    g = hooks(spec)
    if g.embedding is not None:  # e.g. Gemma's scaling by sqrt(hidden)
        g.embedding(ops, spec, par, x)
    out = x // par.tp if par.sequence_parallel else x
    return Block(name=getattr(family_module(spec.family), "EMBEDDING", "Embedding"), input_bytes=8 * n,
                 output_bytes=out, ops=ops.ops)


def _final_norm(spec: ModelSpec, par: ParallelConfig, hw: Hardware, name: str) -> Block:
    n = par.seq_len * par.micro_batch_size
    n_loc = n // par.tp if par.sequence_parallel else n
    ops = _OpList(hw)
    hooks(spec).norm(ops, "", BLOCK_INPUT, n_loc * spec.hidden, n_loc)
    x = ACT * n_loc * spec.hidden
    return Block(name=name, input_bytes=x, output_bytes=x, ops=ops.ops)


def _lm_head(spec: ModelSpec, par: ParallelConfig, hw: Hardware) -> Block:
    n, h, v, t = par.seq_len * par.micro_batch_size, spec.hidden, spec.vocab, par.tp
    n_loc = n // t if par.sequence_parallel else n
    ops = _OpList(hw)
    src = _TP(par, hw, n, h).before_column(ops, "", costs.gemm_s(2.0 * n * h * v / t, hw))
    logits = ops.gemm(":mm#0", n, h, v // t, saves=[BLOCK_INPUT], inputs=[src])
    fwd, bwd = cross_entropy_s(n, v // t, hw, t)  # priced as GPT's (analytic/ops.py)
    # the loss runs after lm_head, in the training stack (outside the module a plan can act on)
    ops.add("loss:cross_entropy#0", inputs=[logits], fwd_s=fwd, bwd_s=bwd, out_bytes=STAT * n,
            aux_bytes=STAT * n * v // t, tags=[OUTSIDE])
    return Block(name="Linear", input_bytes=ACT * n_loc * h, output_bytes=0, ops=ops.ops)


def _mtp_block(spec: ModelSpec, par: ParallelConfig, hw: Hardware, name: str) -> Block:
    """A multi-token-prediction module (DeepSeek-V3, GLM-4.5), on the last stage after the decoder layers: the next
    tokens' embedding and the hidden states each normed, concatenated and projected back to h (eh_proj), a decoder
    layer like the last one, the shared head's norm, the head GEMM and its loss. The main hidden states pass on to
    the final norm unchanged (output_bytes)."""
    n, h, v, t = par.seq_len * par.micro_batch_size, spec.hidden, spec.vocab, par.tp
    n_loc = n // t if par.sequence_parallel else n
    ops = _OpList(hw)
    g = hooks(spec)
    x = ACT * n_loc * h
    emb = ops.elementwise("embed_tokens:embedding#0", x, 2 * x, 2 * x, inputs=[])
    en = g.norm(ops, "enorm", emb, n_loc * h, n_loc)
    hn = g.norm(ops, "hnorm", BLOCK_INPUT, n_loc * h, n_loc)
    cat = ew(ops, ":cat#0", 2 * x, inputs=[en, hn])
    tp = _TP(par, hw, n, h)
    ops.gemm("eh_proj:mm#0", n_loc, 2 * h, h, saves=[cat], inputs=[cat])  # replicated (as the down-projections)
    inner = layer_block(spec, par, hw, name, layer_kind(spec, spec.num_layers - 1, par.seq_len))
    first, rename = len(ops.ops), {BLOCK_INPUT: ops.last}
    for op in inner.ops:
        rename[op.id] = f"mtp_block.{op.id}"
    for op in inner.ops:
        ops.ops.append(op.model_copy(update={
            "id": rename[op.id], "module": f"mtp_block.{op.module}" if op.module else "mtp_block",
            "inputs": [rename.get(r, r) for r in op.inputs], "saves": [rename.get(r, r) for r in op.saves]}))
    ops.last = ops.ops[-1].id if len(ops.ops) > first else ops.last
    normed = g.norm(ops, "shared_head.norm", ops.last, n_loc * h, n_loc)
    src = tp.before_column(ops, "shared_head.head", costs.gemm_s(2.0 * n * h * v / t, hw))
    logits = ops.gemm("shared_head.head:mm#0", n, h, v // t, saves=[normed], inputs=[src])
    fwd, bwd = cross_entropy_s(n, v // t, hw, t)
    ops.add("loss:mtp_cross_entropy#0", inputs=[logits], fwd_s=fwd, bwd_s=bwd, out_bytes=STAT * n,
            aux_bytes=STAT * n * v // t, tags=[OUTSIDE])
    return Block(name=name, input_bytes=x, output_bytes=x, ops=ops.ops)


def rank_params(spec: ModelSpec, par: ParallelConfig, i: int | bool) -> tuple[int, int]:
    """(parameters on one TP x EP rank outside the routed experts, routed-expert parameters on it) of layer i (or,
    given a bool, of a full-attention layer that is MoE or not)."""
    h, t = spec.hidden, par.tp
    is_moe = i if isinstance(i, bool) else spec.is_moe_layer(i)
    norms = spec.layer_norms() * h
    split, replicated = spec.attention_split_params(None if isinstance(i, bool) else i)
    attn = split // t + replicated
    if not is_moe:
        return attn + spec.dense_mlp_params() // t + norms, 0
    m = spec.moe
    routed, other = spec.moe_params()
    shared = 3 * h * m.shared_ffn
    return attn + (other - shared) + shared // t + norms, routed // (t * par.ep)


def _check(spec: ModelSpec, par: ParallelConfig) -> None:
    t = par.tp
    sizes = [("heads", spec.heads), ("key/value heads", spec.kv), ("ffn hidden", spec.ffn_hidden),
             ("vocab", spec.vocab)]
    if spec.moe is not None:
        sizes.append(("expert ffn hidden", spec.moe.expert_ffn))
    for what, value in sizes:
        if value % t:
            raise LayoutError(f"--tp {t} does not divide the model's {what} ({value})")
    if par.sequence_parallel and par.seq_len % t:
        raise LayoutError(f"--tp {t} does not divide the sequence length {par.seq_len}")
    if par.ep > 1 and spec.moe is None:
        raise ValueError(f"--ep {par.ep}: the model has no experts (expert parallelism is for MoE models)")
    if spec.moe is not None and spec.moe.experts % par.ep:
        raise LayoutError(f"--ep {par.ep} does not divide the model's {spec.moe.experts} experts")


def _block_names(spec: ModelSpec, seq_len: int) -> dict[tuple[str, bool], str]:
    """Decoder block name per layer kind (layer_kind), as the profiler names them: the first kind met gets the class
    name, the next ones '_2', '_3', ..."""
    kinds = list(dict.fromkeys(layer_kind(spec, i, seq_len) for i in range(spec.num_layers)))
    return {k: f"{class_prefix(spec.family)}DecoderLayer" + ("" if j == 0 else f"_{j + 1}")
            for j, k in enumerate(kinds)}


@lru_cache(maxsize=32)
def _blocks(spec: ModelSpec, tp: int, mb: int, seq: int, sp: bool, ep: int, hw_json: str, cp: int = 1,
            kernels: str = "hf", fp8: bool = False) -> dict[str, Block]:
    """The blocks depend on these only (not on PP, DP or the micro-batch count): `lynx tune` builds them once per
    (TP, micro-batch, SP, EP, CP) and the solvers' per-block caches then hold across its layouts. Under context
    parallelism every block is of one rank's seq / cp tokens (parallel/cp.py)."""
    par = ParallelConfig(tp=tp, micro_batch_size=mb, seq_len=seq // cp, sequence_parallel=sp, dp=ep, ep=ep)
    hw = Hardware.model_validate_json(hw_json)
    cls = class_prefix(spec.family)
    names = _block_names(spec, seq)  # the whole sequence decides a window's kind
    emb = _embedding(spec, par, hw)
    blocks = {emb.name: emb}
    build = kernel_set(kernels).layer_block  # how the layer runs (lynx_planner/kernels)
    blocks |= {name: build(spec, par, hw, name, k, fp8, cp) for k, name in names.items()}
    if spec.mtp_layers:
        blocks[f"{cls}MTPLayer"] = _mtp_block(spec, par, hw, f"{cls}MTPLayer")
    blocks[f"{cls}RMSNorm"] = _final_norm(spec, par, hw, f"{cls}RMSNorm")
    blocks["Linear"] = _lm_head(spec, par, hw)
    return blocks


def decoder_profile(spec: ModelSpec, par: ParallelConfig, hw: Hardware, attention: str = "flash",
                    dropout: float = 0.0, kernels: str = "hf", fp8: bool = False) -> Profile:
    if attention != "flash":
        raise ValueError(f"--attention {attention}: the {spec.family} op graph has fused (sdpa) attention only")
    if dropout:
        raise ValueError(f"--dropout: the {spec.family} family trains without dropout (its configs' rate is 0)")
    _check(spec, par)
    if not (par.async_tp_allreduce and par.gradient_accumulation_fusion):
        raise ValueError(f"async_tp_allreduce / gradient_accumulation_fusion false (Megatron of 2021) are priced for "
                         f"the gpt family only, not {spec.family}")
    cls = class_prefix(spec.family)
    names = _block_names(spec, par.seq_len)
    blocks = dict(_blocks(spec, par.tp, par.micro_batch_size, par.seq_len, par.sequence_parallel, par.ep,
                          hw.model_dump_json(), par.cp, kernels, fp8))
    bpp = bytes_per_param(par)
    expert_bpp = bytes_per_param(par.model_copy(update={"dp": par.dp // par.ep}))

    def layer(block: str, name: str, dense: int, experts: int = 0) -> Layer:
        return Layer(block=block, name=name, params=dense + experts, expert_params=experts if par.ep > 1 else 0,
                     static_bytes=int(dense * bpp) + int(experts * expert_bpp))

    h, v, t = spec.hidden, spec.vocab, par.tp
    layers = [layer(next(iter(blocks)), "model.embed_tokens", v * h // t)]
    for i in range(spec.num_layers):
        layers.append(layer(names[layer_kind(spec, i, par.seq_len)], f"model.layers.{i}", *rank_params(spec, par, i)))
    if spec.mtp_layers:  # embedding and head shared with the main model (the head is on this stage)
        dense, experts = rank_params(spec, par, spec.num_layers - 1)
        mtp_extra = spec.mtp_params() - spec.layer_params(spec.num_layers - 1)  # norms and eh_proj, replicated
        for k in range(spec.mtp_layers):
            layers.append(layer(f"{cls}MTPLayer", f"model.layers.{spec.num_layers + k}", dense + mtp_extra, experts))
    layers.append(layer(f"{cls}RMSNorm", "model.norm", h))
    layers.append(layer("Linear", "lm_head", v * h // t if not spec.tie_embeddings or par.pp > 1 else 0))
    config: dict = {"family": spec.family, "num_layers": spec.num_layers, "hidden": h, "heads": spec.heads,
                    "kv_heads": spec.kv, "ffn_hidden": spec.ffn_hidden, "vocab": v}
    if spec.mtp_layers:
        config["mtp_layers"] = spec.mtp_layers
    if spec.tie_embeddings:  # left out when false: untied profiles keep their bytes
        config["tie_embeddings"] = True
    if spec.moe is not None:
        config |= {"experts": spec.moe.experts, "top_k": spec.moe.top_k, "expert_ffn": spec.moe.expert_ffn,
                   "active_params": spec.active_params(par.seq_len)}
    info = ModelInfo(name=spec.name, source=spec.source or "catalog", params=spec.params(par.seq_len), config=config,
                     architecture=spec.model_dump(mode="json", exclude_defaults=True))
    return Profile(model=info, parallel=par, hardware=hw, method="analytic", attention="flash", dropout=0.0,
                   blocks=blocks, layers=layers, dtype="bf16", kernels=kernels, fp8=fp8)
