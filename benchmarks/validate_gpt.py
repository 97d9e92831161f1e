"""The model file of benchmarks/validate_plans.py: a GPT whose activations dominate its memory (hidden 512, 6 layers,
sequence 256, 2 sequences per micro-batch, small vocabulary), batch-first tokens in, logits out.

`lynx_model(batch_size, seq_len)` builds it for the profiler and `lynx validate`; `stage_module(layer_names)` gives
one pipeline stage under the model's module paths ('embedding', 'layers.<i>', 'lm_head').
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from lynx_planner.models.gpt_block import GPTBlock

HIDDEN, HEADS, LAYERS, VOCAB, DROPOUT = 512, 8, 6, 512, 0.1


class Embedding(nn.Module):
    def __init__(self, seq_len: int):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.position = nn.Parameter(torch.randn(seq_len, 1, HIDDEN) * 0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [batch, seq] -> [seq, batch, hidden]
        return self.embed(tokens.t()) + self.position


class LMHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.final_norm = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [seq, batch, hidden] -> [batch, seq, vocab]
        return self.head(self.final_norm(x)).transpose(0, 1)


class GPT(nn.Module):
    def __init__(self, seq_len: int):
        super().__init__()
        self.embedding: nn.Module | None = Embedding(seq_len)
        self.layers = nn.ModuleList(GPTBlock(HIDDEN, HEADS, seq_len, dropout=DROPOUT) for _ in range(LAYERS))
        self.lm_head: nn.Module | None = LMHead()
        self.active = list(range(LAYERS))  # the layers this (stage) module runs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        for i in self.active:
            x = self.layers[i](x)
        return self.lm_head(x) if self.lm_head is not None else x

    def stage_module(self, layer_names: list[str]) -> GPT:
        """A copy running only these layers, under the same module paths (it still holds the others' weights)."""
        stage = copy.deepcopy(self)
        stage.embedding = stage.embedding if "embedding" in layer_names else None
        stage.lm_head = stage.lm_head if "lm_head" in layer_names else None
        stage.active = [i for i in range(LAYERS) if f"layers.{i}" in layer_names]
        return stage


def lynx_model(batch_size: int = 2, seq_len: int = 256) -> tuple[nn.Module, tuple]:
    return GPT(seq_len), (torch.randint(0, VOCAB, (batch_size, seq_len)),)
