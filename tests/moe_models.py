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
