"""The reference torch GPT layer: a Megatron-style transformer layer on one rank, in [seq, batch, hidden] layout.

It is the ground truth the analytic cost model is checked against (a FakeTensorMode trace must give the same ops,
shapes and saved bytes) and the model the runtime tests train. Megatron's choices are kept where they change what
autograd saves: per-head interleaved QKV so q, k and v stay views of the QKV output, a bool dropout mask
(`native_dropout`), and, for math attention, scale-and-mask fused into one `baddbmm` as Megatron's fused softmax does.
`tp` shards the GEMMs Megatron-style (column then row parallel); the all-reduces are left to the caller, as the
planner inserts them as collective ops.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class Dropout(nn.Module):
    """Dropout that keeps a 1-byte mask (CUDA's fused dropout does; CPU's `F.dropout` keeps a full-width one)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        return torch.native_dropout(x, self.p, True)[0]


class CoreAttention(nn.Module):
    """softmax(q kᵀ / √d + causal mask) v, in Megatron's math form or as one fused (flash) kernel."""

    def __init__(self, heads: int, head_dim: int, seq_len: int, attention: str, dropout: float):
        super().__init__()
        self.heads, self.head_dim, self.attention = heads, head_dim, attention
        self.dropout = Dropout(dropout)
        if attention == "math":
            mask = torch.full((seq_len, seq_len), float("-inf")).triu(1).unsqueeze(0)
            self.register_buffer("causal_bias", mask, persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s, b, heads, d = q.shape
        if self.attention == "flash":
            # [s, b, n, d] -> [b, n, s, d] views; the fused kernel keeps q, k, v, its output and logsumexp.
            q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))
            out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return out.permute(2, 0, 1, 3).reshape(s, b, heads * d)
        q, k, v = (t.reshape(s, b * heads, d).transpose(0, 1) for t in (q, k, v))  # views of the QKV output
        scores = torch.baddbmm(self.causal_bias.to(q.dtype), q, k.transpose(1, 2), alpha=1.0 / math.sqrt(d))
        probs = self.dropout(torch.softmax(scores, dim=-1))
        ctx = torch.bmm(probs, v)  # [b*n, s, d]
        return ctx.view(b, heads, s, d).permute(2, 0, 1, 3).reshape(s, b, heads * d)


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, seq_len: int, tp: int, attention: str, dropout: float):
        super().__init__()
        self.local_heads, self.head_dim = heads // tp, hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden // tp)  # column parallel
        self.core = CoreAttention(self.local_heads, self.head_dim, seq_len, attention, dropout)
        self.proj = nn.Linear(hidden // tp, hidden)  # row parallel (its all-reduce follows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, b, _ = x.shape
        qkv = self.qkv(x).view(s, b, self.local_heads, 3 * self.head_dim)
        q, k, v = qkv.split(self.head_dim, dim=-1)
        return self.proj(self.core(q, k, v))


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn_hidden: int, tp: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn_hidden // tp)  # column parallel
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(ffn_hidden // tp, hidden)  # row parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class GPTBlock(nn.Module):
    """x + dropout(attn(ln1(x))), then + dropout(mlp(ln2(·))). Input and output are [seq, batch, hidden]."""

    def __init__(
        self,
        hidden: int = 256,
        heads: int = 4,
        seq_len: int = 128,
        ffn_hidden: int | None = None,
        tp: int = 1,
        attention: str = "flash",
        dropout: float = 0.0,
    ):
        super().__init__()
        if attention not in ("flash", "math"):
            raise ValueError(f"attention must be 'flash' or 'math', not {attention!r}")
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads, seq_len, tp, attention, dropout)
        self.attn_dropout = Dropout(dropout)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden, ffn_hidden or 4 * hidden, tp)
        self.mlp_dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn_dropout(self.attn(self.ln1(x)))
        return x + self.mlp_dropout(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    """A small GPT of reference blocks: embedding, `layers`, final norm and head (for examples and tests)."""

    def __init__(self, vocab: int = 512, hidden: int = 128, heads: int = 4, layers: int = 4, seq_len: int = 64,
                 attention: str = "flash", dropout: float = 0.0):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(
            GPTBlock(hidden, heads, seq_len, attention=attention, dropout=dropout) for _ in range(layers)
        )
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # tokens [batch, seq] -> logits [seq, batch, vocab]
        x = self.embed(tokens.t())
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))
