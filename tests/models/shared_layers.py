"""A decoder whose layer list holds one block object at two places, [A, B, A] (ALBERT-style weight sharing), and
an optional MLP shared by every block (`shared_mlp=True`: one nn.Module, tied weights)."""

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp: MLP | None = None):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = mlp if mlp is not None else MLP(dim)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.drop(self.attn(h, h, h, need_weights=False)[0])
        return x + self.drop(self.mlp(self.ln2(x)))


class SharedDecoder(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 2, shared_mlp: bool = False):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        mlp = MLP(dim) if shared_mlp else None
        a, b = Block(dim, heads, mlp), Block(dim, heads, mlp)
        self.layers = nn.ModuleList([a, b, a]) if not shared_mlp else nn.ModuleList([a, b])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def lynx_model(batch_size: int = 2, seq_len: int = 16, shared_mlp: bool = False):
    torch.manual_seed(0)
    return SharedDecoder(shared_mlp=shared_mlp), torch.randint(0, 64, (batch_size, seq_len))
