"""How a decoder block runs, one module per training stack: which ops it fuses, which tensors it saves and in which
precision. The analytic decoder (analytic/decoder.py) builds each layer with the kernel set the profile names:

  hf   Hugging Face eager modules (hf.py): fp32 RMSNorm copies, unfused SwiGLU, rotary as separate ops; op ids as
       lynx's profiler records the HF model, so its plans apply to it (and to torchtitan's Llama).
  te   Megatron-core with Transformer Engine (te.py): RMSNorm fused into the next linear (LayerNormLinear), fused
       rotary, fused SwiGLU, fused attention; with fp8, the linear layers' saved inputs in fp8.
  torchtitan  torchtitan 0.3's Llama 3 block, eager (torchtitan.py): its fp32 norm and rotary, fused wqkv; op ids
       as lynx's profiler records torchtitan's module, so its plans apply to it.
"""

from __future__ import annotations

from types import ModuleType

KERNELS: tuple[str, ...] = ("hf", "te", "torchtitan")


def kernel_set(name: str) -> ModuleType:
    """The module that builds a decoder layer's block with these kernels (`layer_block(spec, par, hw, name, kind,
    fp8, cp)`)."""
    if name == "hf":
        from . import hf

        return hf
    if name == "te":
        from . import te

        return te
    if name == "torchtitan":
        from . import torchtitan

        return torchtitan
    raise ValueError(f"--kernels {name}: expected one of {', '.join(KERNELS)}")
