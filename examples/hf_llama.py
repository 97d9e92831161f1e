"""A small Llama-style model (Hugging Face transformers, from a config: RMSNorm, rotary embeddings, SwiGLU MLP,
grouped-query attention; no weights are downloaded).

`attention`: 'flash' uses attn_implementation='sdpa' (PyTorch's fused kernel), 'math' the 'eager' implementation.
Profile it in the precision you train in: `lynx profile FILE --dtype bf16` (model.to(torch.bfloat16)) or
`--autocast bf16` (fp32 weights under torch.autocast); without either, the fp32 model this file builds.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def lynx_model(batch_size: int = 2, seq_len: int = 128, attention: str = "flash", layers: int = 4,
               hidden: int = 256, heads: int = 8, kv_heads: int = 2, vocab: int = 1024):
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=int(8 * hidden / 3) // 64 * 64,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=seq_len, use_cache=False,
                         attn_implementation="sdpa" if attention == "flash" else "eager")
    model = LlamaForCausalLM(config)
    tokens = torch.randint(0, vocab, (batch_size, seq_len))
    return model, (tokens,)
