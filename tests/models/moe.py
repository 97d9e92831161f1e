"""Tiny mixture-of-experts decoders whose routing decides which expert ops run: a plain-PyTorch top-2 MoE that skips
experts receiving no tokens (as most MoE code does), and Hugging Face Mixtral / Qwen2-MoE from tiny configs.
`route_to_first(model)` makes every token pick experts 0 and 1 (the others empty, those two overloaded)."""

import torch
from torch import nn

HIDDEN, EXPERTS, VOCAB, LAYERS = 32, 4, 64, 2


class Top2MoE(nn.Module):
    def __init__(self, dim: int = HIDDEN, experts: int = EXPERTS):
        super().__init__()
        self.router = nn.Linear(dim, experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
                                     for _ in range(experts))

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = self.router(flat).softmax(-1).topk(2, dim=-1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)
            if token.numel() == 0:  # no tokens: the expert's ops do not run
                continue
            out.index_add_(0, token, expert(flat[token]) * weights[token, slot, None])
        return out.view_as(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.attn = nn.MultiheadAttention(HIDDEN, 2, batch_first=True)
        self.moe = Top2MoE()

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.moe(self.ln2(x))


class PlainMoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _hf(name: str) -> nn.Module:
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
                  num_attention_heads=2, num_key_value_heads=2, use_cache=False, attn_implementation="sdpa",
                  bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if name == "mixtral":
        return tf.MixtralForCausalLM(tf.MixtralConfig(num_local_experts=EXPERTS, num_experts_per_tok=2, **common))
    return tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(num_experts=EXPERTS, num_experts_per_tok=2,
                                                    moe_intermediate_size=2 * HIDDEN,
                                                    shared_expert_intermediate_size=2 * HIDDEN, **common))


def route_to_first(model: nn.Module) -> None:
    """Every router's logits favour experts 0 and 1: the other experts get no tokens."""
    with torch.no_grad():
        for name, m in model.named_modules():
            if name.endswith(("router", "gate")) and getattr(m, "weight", None) is not None and \
                    m.weight.shape[0] == EXPERTS:
                m.weight.zero_()
                if getattr(m, "bias", None) is not None:
                    m.bias.copy_(torch.tensor([2.0, 1.0] + [0.0] * (EXPERTS - 2)))
                else:  # HF routers have no bias: zero logits tie, and top-k takes the first experts
                    pass


def lynx_model(name: str = "plain", batch_size: int = 2, seq_len: int = 16):
    torch.manual_seed(0)
    model = PlainMoE() if name == "plain" else _hf(name)
    return model, (torch.randint(1, VOCAB, (batch_size, seq_len)),)
