"""Four identical blocks; the upper two see half the sequence (a strided slice between them): two block types."""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class Model(nn.Module):
    def __init__(self, dim=32, n=4):
        super().__init__()
        self.layers = nn.ModuleList(Block(dim) for _ in range(n))
        self.head = nn.Linear(dim, 8)

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            if i == 2:
                x = x[:, ::2].contiguous()  # the upper half of the stack sees half the sequence
            x = layer(x)
        return self.head(x).sum()


def lynx_model(batch_size: int = 2, seq_len: int = 16):
    return Model(), (torch.randn(batch_size, seq_len, 32),)
