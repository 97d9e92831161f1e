"""A small GPT of reference blocks, for `lynx profile examples/gpt_model.py` (runs on CPU in seconds)."""

import torch

from lynx_planner.models.gpt_block import GPT


def lynx_model(batch_size: int = 2, seq_len: int = 64, attention: str = "flash", layers: int = 4,
               hidden: int = 128, heads: int = 4, vocab: int = 512, dropout: float = 0.0):
    model = GPT(vocab=vocab, hidden=hidden, heads=heads, layers=layers, seq_len=seq_len, attention=attention,
                dropout=dropout)
    tokens = torch.randint(0, vocab, (batch_size, seq_len))
    return model, (tokens,)
