"""Layers whose dropout submodule starts with a random op and draws a second mask right after it."""
import torch
from torch import nn


class TwoDrops(nn.Module):
    def forward(self, x):
        a = x * (torch.rand_like(x) > 0.5)  # the submodule's first op draws random numbers
        return a * (torch.rand_like(a) > 0.5)


class Layer(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.drops = TwoDrops()

    def forward(self, x):
        return x + self.drops(torch.tanh(self.fc(x)))


class Model(nn.Module):
    def __init__(self, n=2):
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.sum()


def lynx_model(batch_size: int = 2, seq_len: int = 8):
    return Model(), (torch.randn(batch_size, seq_len, 16),)
