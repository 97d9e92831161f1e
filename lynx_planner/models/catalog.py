"""The GPT model catalog: Megatron-style GPTs (learned positions, GeLU MLP of 4h, vocabulary 51200)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPTConfig:
    name: str
    num_layers: int
    hidden: int
    heads: int
    vocab: int = 51200
    ffn_hidden: int = 0  # 0: 4 * hidden

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    def params(self, seq_len: int = 2048) -> int:
        h, f = self.hidden, self.ffn
        layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h
        return self.num_layers * layer + self.vocab * h + seq_len * h + 2 * h


MODELS: dict[str, GPTConfig] = {
    m.name: m
    for m in [
        GPTConfig("gpt-1.3b", 24, 2048, 16),
        GPTConfig("gpt-2.7b", 32, 2560, 32),
        GPTConfig("gpt-6.7b", 32, 4096, 32),
        GPTConfig("gpt-13b", 40, 5120, 40),
        GPTConfig("gpt-20b", 44, 6144, 64),
        GPTConfig("gpt-22b", 48, 6144, 64),
        GPTConfig("gpt-175b", 96, 12288, 96),
    ]
}
