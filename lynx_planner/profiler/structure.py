"""Splits a model into its layer sequence and groups the layers into block types.

Children of an nn.ModuleList / nn.ModuleDict / nn.Sequential with repeated structure are layers (a child that is
itself a container, e.g. a ModuleList of ModuleLists, is split further: containers are never called); the modules
around them (embedding, final norm, head: the other children of the modules on the way down) are layers of their
own; a model without repetition is one layer per top-level child. Layers sharing a structure (module types and
configs, parameter and buffer shapes) and input shapes share one block type. Layer order is the order of their first
call in a forward; layers never called are left out, and `uncovered` says how many parameters that leaves outside
the layers. Work done by a parent module between its children is not part of any layer.

A module called more than once per forward (one object at several places of a layer list, ALBERT's one layer group
run 12 times, a block looped over) is one layer per call: each use is profiled and planned on its own, named by its
path and, from the second call on, '#<call index>' ('layers.0#1', see `use_name`). A module with parameters inside a
container (ModuleList/ModuleDict/Sequential) that is called more often than the layer holding it splits that layer
down to it, as a repeated container does.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._pytree import tree_map

from ..opid import use_name
from .recorder import tensors_in


@dataclass
class LayerSlot:
    path: str  # module path in the model, e.g. 'transformer.h.3'
    module: nn.Module
    use: int = 0  # which call of the module in one forward (modules used at several places)
    args: tuple = ()  # arguments of its first call (detached copies)
    kwargs: dict | None = None
    block: str = ""
    ops: tuple[str, ...] = ()  # ids of the ops its forward runs (when read), part of its block type

    @property
    def name(self) -> str:
        return use_name(self.path, self.use)


def signature(module: nn.Module) -> tuple:
    return (
        tuple((name, type(m).__qualname__, m.extra_repr()) for name, m in module.named_modules()),
        tuple((n, tuple(p.shape), p.dtype) for n, p in module.named_parameters()),
        tuple((n, tuple(b.shape), b.dtype) for n, b in module.named_buffers()),
    )


_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)


def _is_repeated(m: nn.Module, shared: frozenset[int] = frozenset()) -> bool:
    if not isinstance(m, _CONTAINERS):
        return False
    if any(id(c) in shared for c in m.children()):
        return True
    sigs = [signature(c) for c in m.children()]
    return len(set(sigs)) < len(sigs)


def _shared(model: nn.Module, calls: dict[int, int]) -> frozenset[int]:
    """Modules with parameters, in a container, called more often than the nearest called module holding them."""
    found: set[int] = set()

    def walk(m: nn.Module, outer: int) -> None:
        for c in m.children():
            n = calls.get(id(c), 0)
            if isinstance(m, _CONTAINERS) and n > max(outer, 1) and next(c.parameters(), None) is not None:
                found.add(id(c))
            walk(c, n or outer)

    walk(model, calls.get(id(model), 1))
    return frozenset(found)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def layer_modules(model: nn.Module, calls: dict[int, int] | None = None) -> list[tuple[str, nn.Module]]:
    """(path, module) of every layer, in registration order; `calls` (module id -> calls in one forward) splits
    layers down to the modules used at several places (see the module docstring)."""
    shared = _shared(model, calls or {})
    has_repeat = {id(m) for m in model.modules() if any(_is_repeated(x, shared) for x in m.modules())}

    def container(c: nn.Module) -> bool:  # a child to split further rather than a layer
        return isinstance(c, (nn.ModuleList, nn.ModuleDict)) or (isinstance(c, nn.Sequential) and
                                                                  _is_repeated(c, shared))

    def split(prefix: str, m: nn.Module) -> list[tuple[str, nn.Module]]:
        if _is_repeated(m, shared):
            return [layer for n, c in m.named_children()
                    for layer in (split(_join(prefix, n), c) if container(c) else [(_join(prefix, n), c)])]
        if prefix and id(m) not in has_repeat and not isinstance(m, (nn.ModuleList, nn.ModuleDict)):
            return [(prefix, m)]
        return [layer for n, c in m.named_children() for layer in split(_join(prefix, n), c)]

    return split("", model) or [("", model)]


def _snapshot(x: object) -> object:
    # Later layers may modify a tensor in place: keep a copy of what this layer received (tuples of rotary tables
    # included).
    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, x)


def _run_hooked(model: nn.Module, example_inputs: tuple, context, hooks: list[tuple[nn.Module, object]]) -> None:
    handles = [m.register_forward_pre_hook(fn, with_kwargs=True) for m, fn in hooks]
    try:
        with context() if context is not None else contextlib.nullcontext():
            model(*example_inputs)
    finally:
        for h in handles:
            h.remove()


def capture_layers(model: nn.Module, example_inputs: tuple, context=None) -> list[LayerSlot]:
    """Runs the model and returns its layers in call order, one per call (a module used at several places is a
    layer per use), each with its call's arguments. The forward runs with autograd on, as in training (some models
    take other paths without it), under `context()` (autocast). A first forward counts every module's calls; a
    second one captures the arguments when the counts change the layers."""
    calls: dict[int, int] = {}

    def count(m, args, kwargs):
        calls[id(m)] = calls.get(id(m), 0) + 1

    structural = layer_modules(model)
    slots = _capture(model, example_inputs, context, structural, [(m, count) for m in model.modules()])
    layers = layer_modules(model, calls)
    if [p for p, _ in layers] != [p for p, _ in structural]:
        slots = _capture(model, example_inputs, context, layers, [])
    return slots


def _capture(model, example_inputs, context, layers, extra) -> list[LayerSlot]:
    slots: list[LayerSlot] = []
    uses: dict[str, int] = {}

    def hook(path):
        def record(m, args, kwargs):
            use = uses.get(path, 0)
            uses[path] = use + 1
            slots.append(LayerSlot(path, m, use, tuple(map(_snapshot, args)),
                                   {k: _snapshot(v) for k, v in kwargs.items()}))
        return record

    _run_hooked(model, example_inputs, context, [*extra, *((m, hook(p)) for p, m in layers)])
    return slots


def _input_key(slot: LayerSlot) -> tuple:
    return tuple((tuple(t.shape), t.dtype) for t in tensors_in((slot.args, slot.kwargs)))


def name_blocks(slots: list[LayerSlot]) -> dict[str, list[LayerSlot]]:
    """Groups layers into block types named after their class ('GPT2Block', then 'GPT2Block_2', ...)."""
    by_key: dict[tuple, str] = {}
    groups: dict[str, list[LayerSlot]] = {}
    for slot in slots:
        key = (signature(slot.module), _input_key(slot), slot.ops)
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


def uncovered(model: nn.Module, slots: list[LayerSlot]) -> tuple[int, list[str]]:
    """Parameters of `model` outside every captured layer, and the layers found but never called."""
    inside = {id(p) for slot in slots for p in slot.module.parameters()}
    outside = sum(p.numel() for p in model.parameters() if id(p) not in inside)
    called = {slot.path for slot in slots}
    never = [path for path, _ in layer_modules(model)
             if path not in called and not any(p.startswith(f"{path}.") for p in called)]  # or split into used ones
    return outside, never
