"""Stable op ids, shared by the profiler (which writes them) and the runtime (which matches them).

An id is '<module path relative to the block>:<aten op name>#<occurrence>', e.g. 'attn.qkv:addmm#0' or ':add#1'
(empty path: the block's own forward). The occurrence counts calls of that op name in that module within one block
forward. Names drop the 'aten.' namespace and the overload, and device-specific spellings are folded so that a plan
made from a CPU trace names the same ops on CUDA.
"""

from __future__ import annotations

from functools import lru_cache

_DEVICE_SUFFIXES = ("_for_cpu",)


@lru_cache(maxsize=4096)  # per op overload: the runtime's recording names every op it sees
def op_name(func: object) -> str:
    """'aten.addmm.default' -> 'addmm'; '_scaled_dot_product_flash_attention_for_cpu' -> '..._flash_attention'."""
    name = getattr(func, "__name__", None) or str(func)
    qual = str(func)
    if qual.count(".") >= 2:  # namespace.name.overload
        name = qual.split(".")[1]
    else:
        name = name.split(".")[0]
    for suffix in _DEVICE_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def make_id(module_path: str, name: str, occurrence: int) -> str:
    return f"{module_path}:{name}#{occurrence}"


def split_id(op_id: str) -> tuple[str, str, int]:
    """'attn.qkv:addmm#0' -> ('attn.qkv', 'addmm', 0)."""
    path, _, rest = op_id.rpartition(":")
    name, _, occ = rest.partition("#")
    return path, name, int(occ or 0)


def use_name(path: str, use: int) -> str:
    """The layer name of the `use`-th call (from 0) of the module at `path` in one forward: the path itself for the
    first call, 'path#use' after it ('layers.0#1': a module used at two places of a layer list)."""
    return f"{path}#{use}" if use else path


def split_use(name: str) -> tuple[str, int]:
    """'layers.0#1' -> ('layers.0', 1); 'layers.0' -> ('layers.0', 0)."""
    path, sep, use = name.rpartition("#")
    return (path, int(use)) if sep and use.isdigit() else (name, 0)
