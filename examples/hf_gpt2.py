"""A small GPT-2 (Hugging Face transformers, built from a config: no weights are downloaded).

`attention`: 'flash' uses attn_implementation='sdpa' (PyTorch's fused kernel), 'math' the 'eager' implementation.
Profile it in the precision you train in: `lynx profile FILE --dtype bf16` (model.to(torch.bfloat16)) or
`--autocast bf16` (fp32 weights under torch.autocast); without either, the fp32 model this file builds.
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def lynx_model(batch_size: int = 2, seq_len: int = 128, attention: str = "flash", layers: int = 4,
               hidden: int = 256, heads: int = 4, vocab: int = 1024):
    config = GPT2Config(vocab_size=vocab, n_positions=seq_len, n_embd=hidden, n_layer=layers, n_head=heads,
                        bos_token_id=0, eos_token_id=0, use_cache=False,
                        attn_implementation="sdpa" if attention == "flash" else "eager")
    model = GPT2LMHeadModel(config)
    tokens = torch.randint(0, vocab, (batch_size, seq_len))
    return model, (tokens,)
