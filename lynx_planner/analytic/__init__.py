"""Analytic profiles: a ModelSpec in one parallel setup on one kind of hardware → Profile, without running the model.

One module per family builds its op graph from shared pieces (ops.py: the op-list builder; attention.py: MHA/GQA/MLA;
mlp.py: dense MLPs and the MoE block): gpt.py for the Megatron GPT, decoder.py for the Hugging Face decoder families
(op ids as lynx's profiler records them for the HF model, so plans made from either apply to the same module tree).
"""

from __future__ import annotations

from ..models.catalog import GPTConfig, as_spec
from ..models.spec import ModelSpec
from ..schema import Hardware, ParallelConfig, Profile
from .gpt import embedding_block, gpt_layer_block, gpt_profile, layer_params, lm_head_block
from .ops import ACT, MASK, STAT, _OpList, _TP, bytes_per_param

__all__ = ["profile", "gpt_profile", "layer_params", "bytes_per_param", "gpt_layer_block", "embedding_block",
           "lm_head_block", "ACT", "MASK", "STAT", "_OpList", "_TP"]


def profile(model: ModelSpec | GPTConfig, par: ParallelConfig, hw: Hardware, attention: str = "flash",
            dropout: float = 0.0, kernels: str = "hf", fp8: bool = False) -> Profile:
    """`kernels`: how a decoder layer runs (lynx_planner/kernels: hf, te), `fp8`: TE's fp8 linear layers."""
    spec = as_spec(model)
    if spec.family == "gpt":
        if kernels != "hf" or fp8:
            raise ValueError("--kernels/--fp8: the gpt family is Megatron's own GPT graph (gpt_block.py); kernels "
                             "are chosen for the Hugging Face decoder families")
        return gpt_profile(spec, par, hw, attention, dropout)
    from .decoder import decoder_profile

    return decoder_profile(spec, par, hw, attention, dropout, kernels, fp8)
