"""The peer comparison's model (benchmarks/peers.py): a Hugging Face Llama with 8 layers, grouped-query attention
(8 query heads, 2 key/value heads) and SwiGLU, sized so that one CPU thread trains a step in a fraction of a second.
A lynx model file: `lynx profile benchmarks/peers_llama.py --method measure --compile ...`."""

import torch
import transformers as tf


def lynx_model(batch_size: int = 2, seq_len: int = 256, hidden: int = 256, layers: int = 8):
    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=1024, hidden_size=hidden, intermediate_size=704 * hidden // 256,
                            num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2,
                            max_position_embeddings=seq_len, use_cache=False, attn_implementation="sdpa",
                            bos_token_id=0, eos_token_id=1, pad_token_id=0)
    model = tf.LlamaForCausalLM(config)
    return model, (torch.randint(1, config.vocab_size, (batch_size, seq_len)),)
