"""Hugging Face eager kernels: the decoder layer as transformers runs it (analytic/decoder.py's op graph, attention.py
and mlp.py): fp32 RMSNorm copies, unfused SwiGLU and rotary ops, SDPA attention. No fp8."""

from __future__ import annotations

from ..models.spec import ModelSpec
from ..schema import Block, Hardware, ParallelConfig


def layer_block(spec: ModelSpec, par: ParallelConfig, hw: Hardware, name: str, kind: tuple[str, bool] | bool,
                fp8: bool = False, cp: int = 1) -> Block:
    if fp8:
        raise ValueError("--fp8: Hugging Face's eager modules train in bf16 (fp8 is priced for --kernels te)")
    from ..analytic.decoder import layer_block as hf_layer

    return hf_layer(spec, par, hw, name, kind, cp)
