"""Splits a model into its layer sequence and groups the layers into block types.

Children of an nn.ModuleList / nn.Sequential with repeated structure are layers; the modules around them (embedding,
final norm, head: the other children of the modules on the way down) are layers of their own; a model without
repetition is one layer per top-level child. Layers sharing a structure (module types and configs, parameter and
buffer shapes) and input shapes share one block type. Layer order is the order of their first call in a forward;
layers never called are left out. Work done by a parent module between its children is not part of any layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .recorder import tensors_in


@dataclass
class LayerSlot:
    path: str  # module path in the model, e.g. 'transformer.h.3'
    module: nn.Module
    args: tuple = ()  # arguments of its first call (detached copies)
    kwargs: dict | None = None
    block: str = ""


def signature(module: nn.Module) -> tuple:
    return (
        tuple((name, type(m).__qualname__, m.extra_repr()) for name, m in module.named_modules()),
        tuple((n, tuple(p.shape), p.dtype) for n, p in module.named_parameters()),
        tuple((n, tuple(b.shape), b.dtype) for n, b in module.named_buffers()),
    )


def _is_repeated(m: nn.Module) -> bool:
    if not isinstance(m, (nn.ModuleList, nn.Sequential)):
        return False
    sigs = [signature(c) for c in m.children()]
    return len(set(sigs)) < len(sigs)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def layer_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, module) of every layer, in registration order."""
    has_repeat = {id(m) for m in model.modules() if any(_is_repeated(x) for x in m.modules())}

    def split(prefix: str, m: nn.Module) -> list[tuple[str, nn.Module]]:
        if _is_repeated(m):
            return [(_join(prefix, n), c) for n, c in m.named_children()]
        if prefix and id(m) not in has_repeat:
            return [(prefix, m)]
        return [layer for n, c in m.named_children() for layer in split(_join(prefix, n), c)]

    return split("", model) or [("", model)]


def _snapshot(x: object) -> object:
    # Later layers may modify a tensor in place: keep a copy of what this layer received.
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


def capture_layers(model: nn.Module, example_inputs: tuple) -> list[LayerSlot]:
    """Runs the model once (no grad) and returns its layers in call order, each with its first call's arguments."""
    slots: dict[str, LayerSlot] = {}
    hooks = []
    for path, module in layer_modules(model):
        def record(m, args, kwargs, path=path):
            if path not in slots:
                slots[path] = LayerSlot(path, m, tuple(map(_snapshot, args)),
                                        {k: _snapshot(v) for k, v in kwargs.items()})
        hooks.append(module.register_forward_pre_hook(record, with_kwargs=True))
    try:
        with torch.no_grad():
            model(*example_inputs)
    finally:
        for h in hooks:
            h.remove()
    return list(slots.values())


def _input_key(slot: LayerSlot) -> tuple:
    return tuple((tuple(t.shape), t.dtype) for t in tensors_in((slot.args, slot.kwargs)))


def name_blocks(slots: list[LayerSlot]) -> dict[str, list[LayerSlot]]:
    """Groups layers into block types named after their class ('GPT2Block', then 'GPT2Block_2', ...)."""
    by_key: dict[tuple, str] = {}
    groups: dict[str, list[LayerSlot]] = {}
    for slot in slots:
        key = (signature(slot.module), _input_key(slot))
        if key not in by_key:
            base = type(slot.module).__name__
            name, n = base, 1
            while name in groups:
                n += 1
                name = f"{base}_{n}"
            by_key[key] = name
            groups[name] = []
        slot.block = by_key[key]
        groups[slot.block].append(slot)
    return groups
