"""The MoE zoo as one lynx model file: `lynx_model(name=...)` builds a tiny Hugging Face mixture-of-experts model from
its config (no weights downloaded): hidden 128, 3 layers, 4 heads, 8 experts (top 2), vocabulary 128. `experts`: Hugging Face's experts implementation; 'eager' (the default here) runs a loop over the
experts hit, so a block has ops per expert (the case that made HEU's candidate search explode); 'grouped_mm' one
grouped GEMM.

    lynx profile tests/moe_models.py --set name=mixtral ...
"""

from __future__ import annotations

import torch
from torch import nn

HIDDEN, LAYERS, HEADS, EXPERTS, VOCAB = 128, 3, 4, 8, 128
NAMES = ("mixtral", "qwen2_moe", "qwen3_moe")


def _hf(name: str, seq_len: int, experts: str) -> nn.Module:
    import transformers as tf

    common = {"vocab_size": VOCAB, "use_cache": False, "attn_implementation": "sdpa", "bos_token_id": 0,
              "eos_token_id": 0, "pad_token_id": 0, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
              "num_attention_heads": HEADS, "num_key_value_heads": 2, "max_position_embeddings": seq_len,
              "experts_implementation": experts}
    if name == "mixtral":
        return tf.MixtralForCausalLM(tf.MixtralConfig(intermediate_size=2 * HIDDEN, num_local_experts=EXPERTS,
                                                      num_experts_per_tok=2, **common))
    if name == "qwen2_moe":
        return tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(intermediate_size=2 * HIDDEN, moe_intermediate_size=HIDDEN,
                                                        shared_expert_intermediate_size=2 * HIDDEN,
                                                        num_experts=EXPERTS, num_experts_per_tok=2, **common))
    if name == "qwen3_moe":
        return tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(intermediate_size=2 * HIDDEN, moe_intermediate_size=HIDDEN,
                                                        num_experts=EXPERTS, num_experts_per_tok=2,
                                                        head_dim=HIDDEN // HEADS, **common))
    raise ValueError(f"unknown model {name!r} (expected one of {', '.join(NAMES)})")


def lynx_model(name: str = "mixtral", batch_size: int = 2, seq_len: int = 16, experts: str = "eager"):
    return _hf(name, seq_len, experts), (torch.randint(1, VOCAB, (batch_size, seq_len)),)


def synthetic_moe_block(experts: int, hidden: int = 4096, tokens: int = 4096, top_k: int = 2,
                        flops_per_s: float = 2e14, name: str = "moe_layer"):
    """An MoE transformer layer built directly as ops (bf16): attention, a router, then `experts` identical experts
    (numbered modules `mlp.experts.N`, as Mixtral-style code loops over them), each gathering its tokens, two GEMMs
    with an activation between, and adding its weighted output into a running sum."""
    from lynx_planner.schema import BLOCK_INPUT, Block, Op

    act = tokens * hidden * 2
    ops: list[Op] = []

    def op(id_, inputs, saves=(), out=act, flops=0.0, aux=0, tags=(), mem_s=None, **kw):
        fwd = flops / flops_per_s if flops else (mem_s if mem_s is not None else 3 * out / 1.5e12)
        ops.append(Op(id=id_, fwd_s=fwd, bwd_s=2 * fwd, flops=flops, out_bytes=out, aux_bytes=aux,
                      inputs=list(inputs), saves=list(saves), tags=list(tags), module=id_.split(":")[0], **kw))
        return id_

    ln1 = op("input_layernorm:native_layer_norm#0", [BLOCK_INPUT], [BLOCK_INPUT], aux=tokens * 8)
    qkv = op("self_attn.qkv:mm#0", [ln1], [ln1], out=3 * act, flops=2 * tokens * hidden * 3 * hidden)
    att = op("self_attn:flash_attention#0", [qkv], [qkv], flops=4 * tokens * tokens * hidden, aux=tokens * 64,
             tags=["core_attn"])
    proj = op("self_attn.o_proj:mm#0", [att], [att], flops=2 * tokens * hidden * hidden)
    res = op(":add#0", [BLOCK_INPUT, proj])
    ln2 = op("post_attention_layernorm:native_layer_norm#0", [res], [res], aux=tokens * 8)
    logits = op("mlp.gate:mm#0", [ln2], [ln2], out=tokens * experts * 4, flops=2 * tokens * hidden * experts)
    probs = op("mlp.gate:_softmax#0", [logits], out=tokens * experts * 4)
    route = op("mlp.gate:topk#0", [probs], [probs], out=tokens * top_k * 12)
    total = op("mlp.experts:zeros_like#0", [ln2])
    mine = tokens * top_k // experts
    ffn = 4 * hidden
    for e in range(experts):
        m = f"mlp.experts.{e}"
        x = op(f"{m}:index#0", [ln2, route], [route], out=mine * hidden * 2)
        h = op(f"{m}.w1:mm#0", [x], [x], out=mine * ffn * 2, flops=2 * mine * hidden * ffn)
        a = op(f"{m}.act:gelu#0", [h], [h], out=mine * ffn * 2)
        y = op(f"{m}.w2:mm#0", [a], [a], out=mine * hidden * 2, flops=2 * mine * ffn * hidden)
        w = op(f"{m}:mul#0", [y, route], [y, route], out=mine * hidden * 2)
        total = op(f"{m}:index_add_#0", [total, w])
    op(":add#1", [res, total])
    return Block(name=name, input_bytes=act, output_bytes=act, ops=ops)


def synthetic_moe_profile(experts: int, pp: int = 2, num_microbatches: int = 8):
    """gpt-1.3b's analytic profile (TP 1) with its transformer layers replaced by `synthetic_moe_block(experts)`."""
    from lynx_planner.analytic import gpt_profile
    from lynx_planner.models.catalog import MODELS
    from lynx_planner.models.hardware import HARDWARE
    from lynx_planner.schema import ParallelConfig

    par = ParallelConfig(tp=1, pp=pp, num_microbatches=num_microbatches)
    prof = gpt_profile(MODELS["gpt-1.3b"], par, HARDWARE["a100-80g-nvlink"], "flash", 0.0)
    return prof.model_copy(update={"blocks": {**prof.blocks, "gpt_layer": synthetic_moe_block(experts,
                                                                                            name="gpt_layer")}})
