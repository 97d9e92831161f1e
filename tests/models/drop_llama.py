"""A tiny Llama-style decoder with residual dropout (own_llama's RMSNorm, rotary GQA attention and SwiGLU; dropout
after attention and after the MLP), small enough for inductor to compile quickly on a CPU: the compiled-plan tests'
model (random ops inside planned layers)."""

import torch
from torch import nn

from own_llama import Attention, RMSNorm, SwiGLU, rotary_tables


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int, dropout: float):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(dim), Attention(dim, heads, kv_heads)
        self.mlp_norm, self.mlp = RMSNorm(dim), SwiGLU(dim, hidden)
        self.attn_drop, self.mlp_drop = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, x, tables):
        x = x + self.attn_drop(self.attn(self.attn_norm(x), tables))
        return x + self.mlp_drop(self.mlp(self.mlp_norm(x)))


class Decoder(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, kv_heads: int, hidden: int, seq: int,
                 dropout: float):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.register_buffer("tables", rotary_tables(seq, dim // heads), persistent=False)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, hidden, dropout) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.tables)
        return self.head(self.norm(x))


def lynx_model(batch_size: int = 2, seq_len: int = 16, dim: int = 32, layers: int = 2, dropout: float = 0.1):
    torch.manual_seed(0)
    model = Decoder(vocab=64, dim=dim, layers=layers, heads=4, kv_heads=2, hidden=64, seq=seq_len, dropout=dropout)
    return model, (torch.randint(0, 64, (batch_size, seq_len)),)
