"""The model catalog: named ModelSpecs, each with its source. GPTs are Megatron-style (learned positions, GeLU MLP of
4h, vocabulary 51200); the current open models are read from the fields of their published Hugging Face config.json
(HF_CONFIGS, through hf_config.spec_from_hf, so the catalog and a user's config.json take the same path)."""

from __future__ import annotations

from dataclasses import dataclass

from .spec import ModelSpec


@dataclass(frozen=True)
class GPTConfig:
    """A Megatron GPT by its sizes (kept for callers that build one directly); `spec()` is its ModelSpec."""

    name: str
    num_layers: int
    hidden: int
    heads: int
    vocab: int = 51200
    ffn_hidden: int = 0  # 0: 4 * hidden

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    def params(self, seq_len: int = 2048) -> int:
        return self.spec().params(seq_len)

    def spec(self) -> ModelSpec:
        return ModelSpec(name=self.name, source="Megatron-LM GPT (Narayanan et al. 2021, Korthikanti et al. 2022)",
                         family="gpt", num_layers=self.num_layers, hidden=self.hidden, heads=self.heads,
                         ffn_hidden=self.ffn, vocab=self.vocab, norm="layernorm", mlp="gelu", positions="learned",
                         tie_embeddings=True)


def as_spec(model: ModelSpec | GPTConfig) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else model.spec()


_GPTS = [
    GPTConfig("gpt-1.3b", 24, 2048, 16),
    GPTConfig("gpt-2.7b", 32, 2560, 32),
    GPTConfig("gpt-6.7b", 32, 4096, 32),
    GPTConfig("gpt-13b", 40, 5120, 40),
    GPTConfig("gpt-20b", 44, 6144, 64),
    GPTConfig("gpt-22b", 48, 6144, 64),
    GPTConfig("gpt-175b", 96, 12288, 96),
]

_LLAMA3 = {"model_type": "llama", "vocab_size": 128256, "tie_word_embeddings": False, "hidden_act": "silu",
           "rope_theta": 500000.0, "rms_norm_eps": 1e-5}
# name -> (source, the config.json fields that size the model)
HF_CONFIGS: dict[str, tuple[str, dict]] = {
    "llama3-8b": ("meta-llama/Meta-Llama-3-8B config.json", {
        **_LLAMA3, "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336}),
    "llama3-70b": ("meta-llama/Meta-Llama-3-70B config.json", {
        **_LLAMA3, "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "intermediate_size": 28672}),
    "llama3-405b": ("meta-llama/Llama-3.1-405B config.json", {
        **_LLAMA3, "hidden_size": 16384, "num_hidden_layers": 126, "num_attention_heads": 128,
        "num_key_value_heads": 8, "intermediate_size": 53248}),
    "qwen2.5-72b": ("Qwen/Qwen2.5-72B config.json", {
        "model_type": "qwen2", "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "intermediate_size": 29568, "vocab_size": 152064, "tie_word_embeddings": False,
        "hidden_act": "silu", "rope_theta": 1000000.0, "rms_norm_eps": 1e-6}),
    "qwen3-32b": ("Qwen/Qwen3-32B config.json", {
        "model_type": "qwen3", "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 25600, "vocab_size": 151936,
        "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu", "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6}),
    "mixtral-8x7b": ("mistralai/Mixtral-8x7B-v0.1 config.json", {
        "model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000, "num_local_experts": 8,
        "num_experts_per_tok": 2, "tie_word_embeddings": False, "hidden_act": "silu", "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-5}),
    "mixtral-8x22b": ("mistralai/Mixtral-8x22B-v0.1 config.json", {
        "model_type": "mixtral", "hidden_size": 6144, "num_hidden_layers": 56, "num_attention_heads": 48,
        "num_key_value_heads": 8, "intermediate_size": 16384, "vocab_size": 32768, "num_local_experts": 8,
        "num_experts_per_tok": 2, "tie_word_embeddings": False, "hidden_act": "silu", "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-5}),
    "qwen3-235b-a22b": ("Qwen/Qwen3-235B-A22B config.json", {
        "model_type": "qwen3_moe", "hidden_size": 4096, "num_hidden_layers": 94, "num_attention_heads": 64,
        "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 12288, "moe_intermediate_size": 1536,
        "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "vocab_size": 151936, "tie_word_embeddings": False, "hidden_act": "silu",
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6}),
    "deepseek-v3": ("deepseek-ai/DeepSeek-V3 config.json (61 layers; the multi-token-prediction module is not "
                    "counted, as transformers does not build it)", {
        "model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
        "num_key_value_heads": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
        "v_head_dim": 128, "n_group": 8, "topk_group": 4, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
        "rms_norm_eps": 1e-6, "rope_theta": 10000, "vocab_size": 129280,
        "tie_word_embeddings": False, "hidden_act": "silu"}),
    "gpt-oss-120b": ("openai/gpt-oss-120b config.json (the mxfp4 quantization_config of the checkpoint left out: "
                     "trained in bf16)", {
        "model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 128,
        "num_experts_per_tok": 4, "sliding_window": 128, "attention_bias": True, "swiglu_limit": 7.0,
        "layer_types": ["sliding_attention", "full_attention"] * 18, "vocab_size": 201088,
        "tie_word_embeddings": False, "hidden_act": "silu"}),
    "gemma3-27b": ("google/gemma-3-27b-pt config.json (text_config: the language model)", {
        "model_type": "gemma3_text", "hidden_size": 5376, "num_hidden_layers": 62, "num_attention_heads": 32,
        "num_key_value_heads": 16, "head_dim": 128, "intermediate_size": 21504, "query_pre_attn_scalar": 168,
        "sliding_window": 1024, "vocab_size": 262208}),
    "llama4-scout": ("meta-llama/Llama-4-Scout-17B-16E config.json (text_config: the language model)", {
        "model_type": "llama4_text", "hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
        "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
        "no_rope_layers": [1, 1, 1, 0] * 12, "attention_chunk_size": 8192, "use_qk_norm": True,
        "vocab_size": 202048, "tie_word_embeddings": False, "hidden_act": "silu"}),
    "kimi-k2": ("moonshotai/Kimi-K2-Instruct config.json (model_type kimi_k2, a DeepSeek-V3 shape; the fp8 "
                "quantization_config of the checkpoint left out: trained in bf16)", {
        "model_type": "kimi_k2", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 64,
        "num_key_value_heads": 64, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
        "v_head_dim": 128, "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "vocab_size": 163840,
        "tie_word_embeddings": False, "hidden_act": "silu"}),
}


def _catalog() -> dict[str, ModelSpec]:
    from .hf_config import spec_from_hf

    specs = {g.name: g.spec() for g in _GPTS}
    for name, (source, cfg) in HF_CONFIGS.items():
        specs[name] = spec_from_hf(cfg, name, f"catalog {name}", source=source)
    return specs


MODELS: dict[str, ModelSpec | GPTConfig] = _catalog()
