"""The Hugging Face decoder families (Llama, Mistral, Qwen2/3, Mixtral, Qwen2/3-MoE, DeepSeek-V3) as analytic
profiles: layers, block names and op ids as lynx's profiler records them for the HF model of that family in bf16
(embed_tokens, layers.i, norm, lm_head), so a plan made from either applies to the same module tree. Attention and
MLP/MoE op graphs come from attention.py and mlp.py; this module assembles the layer and sizes parameters per rank.
The lm_head block is the output GEMM, as the profiler records HF's `lm_head`, followed by the loss: the stacks
(HF, torchtitan, Megatron's output_layer) compute the cross-entropy outside the head module, so it is an OUTSIDE op
(policy.py) that no plan names, while its fp32 softmax and its time still count on the last stage."""

from __future__ import annotations

from functools import lru_cache

from .. import costs
from ..policy import OUTSIDE
from ..models.spec import ModelSpec
from ..schema import BLOCK_INPUT, Block, Hardware, Layer, ModelInfo, ParallelConfig, Profile
from .attention import gqa, mla
from .mlp import dense_mlp, moe
from .ops import ACT, STAT, _OpList, _TP, bytes_per_param, cross_entropy_s, ew, hf_rms_norm

CLASS_PREFIX = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "mixtral": "Mixtral",
                "qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe", "deepseek_v3": "DeepseekV3"}


def layer_block(spec: ModelSpec, par: ParallelConfig, hw: Hardware, name: str, is_moe: bool) -> Block:
    """x + attn(norm(x)), then + mlp(norm(·)) (a dense SwiGLU or the MoE block)."""
    n = par.seq_len * par.micro_batch_size
    n_loc = n // par.tp if par.sequence_parallel else n
    ops = _OpList(hw)
    tp = _TP(par, hw, n, spec.hidden)
    ln1 = hf_rms_norm(ops, "input_layernorm", BLOCK_INPUT, n_loc * spec.hidden, n_loc)
    attn = (mla if spec.mla is not None else gqa)(ops, tp, spec, par, ln1)
    x = ACT * n_loc * spec.hidden
    add0 = ew(ops, ":add#0", x, inputs=[BLOCK_INPUT, attn], read=2 * x)
    ln2 = hf_rms_norm(ops, "post_attention_layernorm", add0, n_loc * spec.hidden, n_loc)
    out = (moe if is_moe else dense_mlp)(ops, tp, spec, par, ln2)
    ew(ops, ":add#1", x, inputs=[add0, out], read=2 * x)
    return Block(name=name, input_bytes=x, output_bytes=x, ops=ops.ops)


def _embedding(spec: ModelSpec, par: ParallelConfig, hw: Hardware) -> Block:
    n = par.seq_len * par.micro_batch_size
    ops = _OpList(hw)
    x = ACT * n * spec.hidden
    ops.elementwise(":embedding#0", x, 2 * x, 2 * x, saves=[BLOCK_INPUT])  # vocab-parallel lookup
    _TP(par, hw, n, spec.hidden).after_row(ops, "")
    out = x // par.tp if par.sequence_parallel else x
    return Block(name="Embedding", input_bytes=8 * n, output_bytes=out, ops=ops.ops)


def _final_norm(spec: ModelSpec, par: ParallelConfig, hw: Hardware, name: str) -> Block:
    n = par.seq_len * par.micro_batch_size
    n_loc = n // par.tp if par.sequence_parallel else n
    ops = _OpList(hw)
    hf_rms_norm(ops, "", BLOCK_INPUT, n_loc * spec.hidden, n_loc)
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


def rank_params(spec: ModelSpec, par: ParallelConfig, is_moe: bool) -> tuple[int, int]:
    """(parameters on one TP x EP rank outside the routed experts, routed-expert parameters on it) of one layer."""
    h, t = spec.hidden, par.tp
    norms = 2 * h
    if spec.mla is not None:
        m = spec.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        replicated = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
        split = m.kv_lora_rank * spec.heads * (m.qk_nope_head_dim + m.v_head_dim) + spec.heads * m.v_head_dim * h
        if m.q_lora_rank:
            replicated += h * m.q_lora_rank + m.q_lora_rank
            split += m.q_lora_rank * spec.heads * qk
        else:
            split += h * spec.heads * qk
        attn = replicated + split // t
    else:
        attn = (spec.attention_params() - (2 * spec.dim if spec.qk_norm else 0)) // t \
            + (2 * spec.dim if spec.qk_norm else 0)
    if not is_moe:
        return attn + spec.dense_mlp_params() // t + norms, 0
    m = spec.moe
    other = m.experts * h + 3 * h * m.shared_ffn // t + (h if m.shared_gate else 0)
    return attn + other + norms, m.experts * 3 * h * m.expert_ffn // (t * par.ep)


def _check(spec: ModelSpec, par: ParallelConfig) -> None:
    t = par.tp
    sizes = [("heads", spec.heads), ("key/value heads", spec.kv), ("ffn hidden", spec.ffn_hidden),
             ("vocab", spec.vocab)]
    if spec.moe is not None:
        sizes.append(("expert ffn hidden", spec.moe.expert_ffn))
    for what, value in sizes:
        if value % t:
            raise ValueError(f"--tp {t} does not divide the model's {what} ({value})")
    if par.sequence_parallel and par.seq_len % t:
        raise ValueError(f"--tp {t} does not divide the sequence length {par.seq_len}")
    if par.ep > 1 and spec.moe is None:
        raise ValueError(f"--ep {par.ep}: the model has no experts (expert parallelism is for MoE models)")
    if spec.moe is not None and spec.moe.experts % par.ep:
        raise ValueError(f"--ep {par.ep} does not divide the model's {spec.moe.experts} experts")


def _block_names(spec: ModelSpec) -> dict[bool, str]:
    """Decoder block name per layer kind (MoE or not), as the profiler names them: the first kind met gets the class
    name, the next one '_2'."""
    kinds = sorted({spec.is_moe_layer(i) for i in range(spec.num_layers)}, key=lambda k: spec.is_moe_layer(0) != k)
    return {k: f"{CLASS_PREFIX[spec.family]}DecoderLayer" + ("" if j == 0 else f"_{j + 1}")
            for j, k in enumerate(kinds)}


@lru_cache(maxsize=32)
def _blocks(spec: ModelSpec, tp: int, mb: int, seq: int, sp: bool, ep: int, hw_json: str) -> dict[str, Block]:
    """The blocks depend on these only (not on PP, DP or the micro-batch count): `lynx tune` builds them once per
    (TP, micro-batch, SP, EP) and the solvers' per-block caches then hold across its layouts."""
    par = ParallelConfig(tp=tp, micro_batch_size=mb, seq_len=seq, sequence_parallel=sp, dp=ep, ep=ep)
    hw = Hardware.model_validate_json(hw_json)
    cls = CLASS_PREFIX[spec.family]
    names = _block_names(spec)
    blocks = {"Embedding": _embedding(spec, par, hw)}
    blocks |= {name: layer_block(spec, par, hw, name, k) for k, name in names.items()}
    blocks[f"{cls}RMSNorm"] = _final_norm(spec, par, hw, f"{cls}RMSNorm")
    blocks["Linear"] = _lm_head(spec, par, hw)
    return blocks


def decoder_profile(spec: ModelSpec, par: ParallelConfig, hw: Hardware, attention: str = "flash",
                    dropout: float = 0.0) -> Profile:
    if attention != "flash":
        raise ValueError(f"--attention {attention}: the {spec.family} op graph has fused (sdpa) attention only")
    if dropout:
        raise ValueError(f"--dropout: the {spec.family} family trains without dropout (its configs' rate is 0)")
    _check(spec, par)
    if not (par.async_tp_allreduce and par.gradient_accumulation_fusion):
        raise ValueError(f"async_tp_allreduce / gradient_accumulation_fusion false (Megatron of 2021) are priced for "
                         f"the gpt family only, not {spec.family}")
    cls = CLASS_PREFIX[spec.family]
    names = _block_names(spec)
    blocks = dict(_blocks(spec, par.tp, par.micro_batch_size, par.seq_len, par.sequence_parallel, par.ep,
                          hw.model_dump_json()))
    bpp = bytes_per_param(par)
    expert_bpp = bytes_per_param(par.model_copy(update={"dp": par.dp // par.ep}))

    def layer(block: str, name: str, dense: int, experts: int = 0) -> Layer:
        return Layer(block=block, name=name, params=dense + experts, expert_params=experts if par.ep > 1 else 0,
                     static_bytes=int(dense * bpp) + int(experts * expert_bpp))

    h, v, t = spec.hidden, spec.vocab, par.tp
    layers = [layer("Embedding", "model.embed_tokens", v * h // t)]
    for i in range(spec.num_layers):
        k = spec.is_moe_layer(i)
        layers.append(layer(names[k], f"model.layers.{i}", *rank_params(spec, par, k)))
    layers.append(layer(f"{cls}RMSNorm", "model.norm", h))
    layers.append(layer("Linear", "lm_head", v * h // t if not spec.tie_embeddings or par.pp > 1 else 0))
    config: dict = {"family": spec.family, "num_layers": spec.num_layers, "hidden": h, "heads": spec.heads,
                    "kv_heads": spec.kv, "ffn_hidden": spec.ffn_hidden, "vocab": v}
    if spec.tie_embeddings:  # left out when false: untied profiles keep their bytes
        config["tie_embeddings"] = True
    if spec.moe is not None:
        config |= {"experts": spec.moe.experts, "top_k": spec.moe.top_k, "expert_ffn": spec.moe.expert_ffn,
                   "active_params": spec.active_params(par.seq_len)}
    info = ModelInfo(name=spec.name, source=spec.source or "catalog", params=spec.params(par.seq_len), config=config)
    return Profile(model=info, parallel=par, hardware=hw, method="analytic", attention="flash", dropout=0.0,
                   blocks=blocks, layers=layers, dtype="bf16")
