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
