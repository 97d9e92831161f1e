"""The profile header says what the model runs: dropout that runs functionally (F.dropout, sdpa's dropout_p) is
counted, and a model without attention (an MLP stack, a state-space model) is not 'math attention'."""

from __future__ import annotations

import textwrap

from conftest import lynx

from lynx_planner.io import load_model
from lynx_planner.schema import Profile

FUNCTIONAL_DROPOUT = """
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = nn.Linear(32, 96), nn.Linear(32, 32)
            self.attention_dropout = 0.1  # as Hugging Face attention classes keep it: no nn.Dropout module

        def forward(self, x):
            q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 2, 16).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attention_dropout if self.training else 0.0)
            return x + self.out(y.transpose(1, 2).reshape_as(x))

    def lynx_model(batch_size=2, seq_len=16):
        return nn.Sequential(Block(), Block()), (torch.randn(batch_size, seq_len, 32),)
"""
NO_ATTENTION = """
    import torch
    from torch import nn

    def lynx_model(batch_size=2, seq_len=16):
        layers = [nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)) for _ in range(2)]
        return nn.Sequential(*layers), (torch.randn(batch_size, seq_len, 32),)
"""


def _profile(tmp_path, text: str) -> Profile:
    path = tmp_path / "m.py"
    path.write_text(textwrap.dedent(text))
    r = lynx("profile", path, "-o", tmp_path / "p.json")
    assert r.exit_code == 0, r.output
    return load_model(tmp_path / "p.json", Profile), r.output


def test_functional_attention_dropout_is_counted(tmp_path):
    p, out = _profile(tmp_path, FUNCTIONAL_DROPOUT)
    assert p.dropout == 0.1 and "dropout 0.1" in out


def test_a_model_without_attention_says_so(tmp_path):
    p, out = _profile(tmp_path, NO_ATTENTION)
    assert p.attention == "none" and "no attention" in out


def test_a_saved_second_output_counts_as_saved():
    """A block returning (hidden, attention probabilities) as Bloom's does: the probabilities are saved by the
    softmax and stay alive; only the first output is the next layer's input, excluded from the saved bytes."""
    import torch

    from lynx_planner.profiler.memory import saved_bytes_after_forward
    from lynx_planner.profiler.tracing import trace

    class Block(torch.nn.Module):
        def forward(self, x):
            probs = (x @ x.transpose(-1, -2)).softmax(-1)
            return probs @ x, probs

    x = torch.randn(2, 8, 4)
    real = saved_bytes_after_forward(Block(), (x,))
    assert real == trace(Block(), (x,)).saved_bytes and real >= 2 * 8 * 8 * 4
