"""A small GPT-2 (Hugging Face transformers, built from a config: no weights are downloaded).

`attention`: 'flash' uses attn_implementation='sdpa' (PyTorch's fused kernel), 'math' the 'eager' implementation.
Profile it in the precision you train in: `lynx profile FILE --dtype bf16` (model.to(torch.bfloat16)) or
`--autocast bf16` (fp32 weights under torch.autocast); without either, the fp32 model this file builds.

`lynx validate` runs a pipeline stage as `model.stage_module(layer_names)` (below): GPT-2's first layers do not chain
(the position embedding is added beside the token embedding), so the stage says how its layers are called.
"""

import types

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel


def lynx_model(batch_size: int = 2, seq_len: int = 128, attention: str = "flash", layers: int = 4,
               hidden: int = 256, heads: int = 4, vocab: int = 1024):
    config = GPT2Config(vocab_size=vocab, n_positions=seq_len, n_embd=hidden, n_layer=layers, n_head=heads,
                        bos_token_id=0, eos_token_id=0, use_cache=False,
                        attn_implementation="sdpa" if attention == "flash" else "eager")
    model = GPT2LMHeadModel(config)
    model.stage_module = types.MethodType(GPT2Stage, model)
    tokens = torch.randint(0, vocab, (batch_size, seq_len))
    return model, (tokens,)


class GPT2Stage(nn.Module):
    """The layers `layer_names` of a GPT2LMHeadModel as one pipeline stage (the model's module paths are kept under
    `model.`, so a plan's layer names resolve in it)."""

    def __init__(self, model: GPT2LMHeadModel, layer_names: list[str]):
        super().__init__()
        self.model, self.names = model, layer_names

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.model.transformer
        for name in self.names:
            if name == "transformer.wte":
                x = t.wte(x) + t.wpe(torch.arange(x.shape[1], device=x.device))
            elif name != "transformer.wpe":  # added with wte
                x = self.model.get_submodule(name)(x)
        return x
