"""The model zoo as one lynx model file: `lynx_model(name=...)` builds a tiny configuration of a model people train.

Hugging Face models come from configs (no weights are downloaded): hidden 64, 2 layers, 4 heads, vocabulary 128,
sdpa attention where the model has it, the configs' own dropout. Plus `nn.TransformerEncoder` (which deep-copies its
layer) and a pipeline-style model whose blocks sit in an `nn.ModuleDict`.
"""

from __future__ import annotations

import torch
from torch import nn

from lynx_planner.models.gpt_block import GPTBlock

HIDDEN, LAYERS, HEADS, VOCAB = 64, 2, 4, 128
HF = ("llama", "mistral", "gpt2", "gpt_neox", "opt", "phi", "bert", "albert")
NAMES = (*HF, "transformer_encoder", "moduledict_pipeline", "shared_layers")


def _hf(name: str, seq_len: int) -> nn.Module:
    import transformers as tf

    common = {"vocab_size": VOCAB, "use_cache": False, "attn_implementation": "sdpa", "bos_token_id": 0,
              "eos_token_id": 0, "pad_token_id": 0}
    llama_like = {"hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_hidden_layers": LAYERS,
                  "num_attention_heads": HEADS, "max_position_embeddings": seq_len, **common}
    if name == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(num_key_value_heads=2, **llama_like))
    if name == "mistral":
        return tf.MistralForCausalLM(tf.MistralConfig(num_key_value_heads=2, sliding_window=None, **llama_like))
    if name == "gpt_neox":
        return tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(rotary_pct=0.5, **llama_like))
    if name == "phi":
        return tf.PhiForCausalLM(tf.PhiConfig(partial_rotary_factor=0.5, **llama_like))
    if name == "bert":
        return tf.BertForMaskedLM(tf.BertConfig(**llama_like))
    if name == "albert":  # one layer group run num_hidden_layers times: a layer per use
        return tf.AlbertForMaskedLM(tf.AlbertConfig(embedding_size=32, **llama_like))
    if name == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=seq_len,
                                                **common))
    if name == "opt":
        return tf.OPTForCausalLM(tf.OPTConfig(hidden_size=HIDDEN, ffn_dim=2 * HIDDEN, num_hidden_layers=LAYERS,
                                              num_attention_heads=HEADS, max_position_embeddings=seq_len,
                                              word_embed_proj_dim=HIDDEN, **common))
    raise ValueError(f"unknown model {name!r}")


class EncoderLM(nn.Module):
    """Token embedding, nn.TransformerEncoder (batch first, dropout 0.1), output projection."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        layer = nn.TransformerEncoderLayer(HIDDEN, HEADS, 2 * HIDDEN, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


class PipelineLM(nn.Module):
    """Blocks in an nn.ModuleDict keyed by layer index (how pipeline stage modules keep their layers' paths)."""

    def __init__(self, seq_len: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleDict({str(i): GPTBlock(HIDDEN, HEADS, seq_len, dropout=0.1) for i in range(LAYERS)})
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [batch, seq] -> [seq, batch, vocab]
        x = self.embedding(tokens.t())
        for layer in self.layers.values():
            x = layer(x)
        return self.lm_head(x)


def lynx_model(name: str = "llama", batch_size: int = 2, seq_len: int = 16):
    if name == "transformer_encoder":
        model = EncoderLM()
    elif name == "moduledict_pipeline":
        model = PipelineLM(seq_len)
    elif name == "shared_layers":  # layer list [A, B, A]
        from models.shared_layers import SharedDecoder

        model = SharedDecoder(vocab=VOCAB, dim=HIDDEN, heads=HEADS)
    else:
        model = _hf(name, seq_len)
    return model, (torch.randint(1, VOCAB, (batch_size, seq_len)),)
