"""Tiny Hugging Face configs of the decoder families lynx describes analytically, as one lynx model file:
`lynx_model(family=...)` builds the HF model (bf16 is applied by the profiler's --dtype). CONFIGS are config.json
dicts: the analytic side reads the same dict through models.hf_config."""

from __future__ import annotations

import torch

_COMMON = {"vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "hidden_act": "silu", "tie_word_embeddings": False}
_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
CONFIGS: dict[str, dict] = {
    "llama": {"model_type": "llama", **_COMMON},
    "mistral": {"model_type": "mistral", **_COMMON},
    "qwen2": {"model_type": "qwen2", **_COMMON},
    "qwen3": {"model_type": "qwen3", "head_dim": 16, **_COMMON},
    "mixtral": {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2, **_COMMON},
    "qwen2_moe": {"model_type": "qwen2_moe", **_MOE, "shared_expert_intermediate_size": 64,
                  "norm_topk_prob": False, **_COMMON},
    "qwen3_moe": {"model_type": "qwen3_moe", "head_dim": 16, **_MOE, "norm_topk_prob": True, **_COMMON},
    "deepseek_v3": {"model_type": "deepseek_v3", **{**_COMMON, "num_key_value_heads": 4}, "n_routed_experts": 4,
                    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
                    "first_k_dense_replace": 0, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8,
                    "qk_nope_head_dim": 16, "v_head_dim": 16, "n_group": 1, "topk_group": 1,
                    "norm_topk_prob": True},
}
_IDS = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}  # within the tiny vocabulary
CONFIGS["phi3"] = {"model_type": "phi3", **_COMMON, **_IDS}
CONFIGS["olmo2"] = {"model_type": "olmo2", **_COMMON, **_IDS}
# a window longer than the test's 16 tokens: the CPU's sdpa would take a mask (and expand k/v) where the GPU's flash
# kernel takes the window; sliding layers are priced by the window in tests/test_families.py
CONFIGS["gemma3_text"] = {"model_type": "gemma3_text", **_COMMON, **_IDS, "head_dim": 16, "sliding_window": 32,
                          "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 16,
                          "layer_types": ["sliding_attention", "full_attention"]}
CONFIGS["glm4_moe"] = {"model_type": "glm4_moe", **_COMMON, **_IDS, "num_hidden_layers": 3, "head_dim": 16,
                       "n_routed_experts": 4, "n_shared_experts": 1, "moe_intermediate_size": 32,
                       "first_k_dense_replace": 1, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
                       "partial_rotary_factor": 0.5, "attention_bias": True}
CONFIGS["deepseek_v2"] = {"model_type": "deepseek_v2", **{**_COMMON, "num_key_value_heads": 4}, **_IDS,
                          "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                          "n_shared_experts": 1, "first_k_dense_replace": 1, "num_hidden_layers": 3,
                          "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
                          "v_head_dim": 16, "n_group": 1, "topk_group": 1, "topk_method": "greedy"}
# gpt-oss: transformers has no sdpa core for it (eager, compared but for the core); window > 16 tokens, see Gemma 3
CONFIGS["gpt_oss"] = {"model_type": "gpt_oss", **_COMMON, **_IDS, "head_dim": 16, "num_local_experts": 4,
                      "num_experts_per_tok": 2, "intermediate_size": 32, "sliding_window": 32,
                      "layer_types": ["sliding_attention", "full_attention"]}
# Llama 4: dense and MoE layers alternating, a NoPE layer (the 4th); its MoE layers are compared for params only
CONFIGS["llama4_text"] = {"model_type": "llama4_text", **_COMMON, **_IDS, "num_hidden_layers": 4, "head_dim": 16,
                          "intermediate_size": 32, "intermediate_size_mlp": 128, "num_local_experts": 4,
                          "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "attention_chunk_size": 32}
# Qwen3-Next: two Gated DeltaNet layers and a gated softmax-attention one (full_attention_interval), MoE with a gated shared expert; on the CPU
# transformers runs the delta rule with its torch fallback (chunks of 64, the sequence padded to them)
CONFIGS["qwen3_next"] = {"model_type": "qwen3_next", **_COMMON, **_IDS, "head_dim": 16, **_MOE,
                         "shared_expert_intermediate_size": 64, "linear_num_key_heads": 2,
                         "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 8,
                         "num_hidden_layers": 3, "full_attention_interval": 3}
# DeepSeek-V3's first layers are dense (first_k_dense_replace): two layer kinds, named as the profiler names them
CONFIGS["deepseek_v3_dense_first"] = {**CONFIGS["deepseek_v3"], "first_k_dense_replace": 1, "num_hidden_layers": 3}


EAGER = ("gpt_oss",)  # families transformers runs with an eager attention core only


def lynx_model(family: str = "llama", batch_size: int = 2, seq_len: int = 16):
    import transformers

    cfg = dict(CONFIGS[family])
    eager = cfg["model_type"] in EAGER
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg, max_position_embeddings=seq_len,
                                               use_cache=False, attn_implementation="eager" if eager else "sdpa")
    model = transformers.AutoModelForCausalLM.from_config(config)
    return model, (torch.randint(0, cfg["vocab_size"], (batch_size, seq_len)),)
