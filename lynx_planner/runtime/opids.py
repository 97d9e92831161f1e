"""Naming the aten ops of one layer's forward with the profiler's op ids ('attn.qkv:addmm#0').

The module part is the path of the innermost submodule running, relative to the layer; forward hooks on the layer's
submodules keep it. The occurrence counts calls of that op name in that module since `OpNamer` was made.
"""

from __future__ import annotations

from collections import Counter
from functools import partial

from torch import nn

from ..opid import make_id, op_name


class ModuleScope:
    """The layer-relative path of the submodule whose forward is running inside a layer ('' for the layer itself)."""

    def __init__(self, layer: nn.Module):
        self._stack = [""]
        self._handles = []
        for path, sub in layer.named_modules():
            if path:
                self._handles.append(sub.register_forward_pre_hook(partial(self._enter, path)))
                self._handles.append(sub.register_forward_hook(self._exit))

    def _enter(self, path: str, module: nn.Module, args: tuple) -> None:
        self._stack.append(path)

    def _exit(self, module: nn.Module, args: tuple, output: object) -> None:
        del self._stack[-1]

    def reset(self) -> None:
        """Forget submodules left open (a recomputation stops early by raising inside one)."""
        del self._stack[1:]

    @property
    def path(self) -> str:
        return self._stack[-1]


class OpNamer:
    """Gives each op of one forward (or its recomputation) its op id, in call order."""

    def __init__(self, scope: ModuleScope):
        scope.reset()
        self._scope = scope
        self._counts: Counter[tuple[str, str]] = Counter()

    def __call__(self, func: object) -> str:
        key = (self._scope.path, op_name(func))
        occurrence = self._counts[key]
        self._counts[key] += 1
        return make_id(key[0], key[1], occurrence)
