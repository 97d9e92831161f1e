"""An independent decoder, written without transformers: RMSNorm, rotary tables built in fp32 (a buffer made with
.float()), grouped-query attention (4 query heads over 2 key/value heads), SwiGLU MLP, untied output projection."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight


def rotary_tables(seq: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(seq).float(), inv)
    return torch.stack((angles.cos(), angles.sin())).float()  # [2, seq, head_dim / 2], fp32 whatever the model


def rotate(x: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    cos, sin = tables[0].to(x.dtype), tables[1].to(x.dtype)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x, tables):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = rotate(q, tables[:, :s]), rotate(k, tables[:, :s])
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(self.head_dim))
        return self.out(y.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate, self.up, self.down = (nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False),
                                         nn.Linear(hidden, dim, bias=False))

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(dim), Attention(dim, heads, kv_heads)
        self.mlp_norm, self.mlp = RMSNorm(dim), SwiGLU(dim, hidden)

    def forward(self, x, tables):
        x = x + self.attn(self.attn_norm(x), tables)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, kv_heads: int, hidden: int, seq: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.register_buffer("tables", rotary_tables(seq, dim // heads), persistent=False)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.tables)
        return self.head(self.norm(x))


def lynx_model(batch_size: int = 2, seq_len: int = 64, dim: int = 128, layers: int = 3):
    model = Decoder(vocab=256, dim=dim, layers=layers, heads=4, kv_heads=2, hidden=352, seq=seq_len)
    return model, (torch.randint(0, 256, (batch_size, seq_len)),)
