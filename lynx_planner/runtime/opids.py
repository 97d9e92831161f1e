"""One layer's modules as the runtime sees them: op ids while recording, RNG snapshots at submodule entries, and the
layer's recorded programs.

Op ids follow the profiler ('attn.qkv:addmm#0'): the module part is the path of the innermost submodule running,
relative to the layer; the occurrence counts calls of that op name in that module within one forward. Naming needs
hooks on every submodule, so they are installed only while a forward is recorded (`tracking`); the steady-state
forward keeps only pre-hooks on the few submodules whose entry RNG state a recomputation replays.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from torch import nn

from ..opid import make_id, op_name


class ModuleScope:
    """Per layer: the running submodule's path (while recording), RNG hooks and recorded programs by signature."""

    def __init__(self, layer: nn.Module):
        self.layer = layer
        self.modules = tuple(layer.modules())  # the layer and its submodules (parameters and buffers read from each)
        self.programs: dict[Any, Any] = {}  # input signature -> keep.Program
        self.active: Any = None  # the region whose steady-state forward is running (gets entry callbacks)
        self._rng_hooked: set[str] = set()
        self._stack = [""]
        self.clock = 0  # ops named so far in the forward being recorded
        self._entries: Counter[str] = Counter()
        self.entry_of: dict[str, tuple[int, int]] = {}  # path -> (entry count - 1, clock at its latest entry)
        self._on_entry: Callable[[str, int], None] | None = None

    @contextlib.contextmanager
    def tracking(self, on_entry: Callable[[str, int], None]) -> Iterator[None]:
        """Track the running submodule during one recorded forward; `on_entry(path, k)` at each submodule entry."""
        self._stack, self.clock, self._on_entry = [""], 0, on_entry
        self._entries.clear()
        self.entry_of = {"": (0, 0)}
        handles = []
        for path, sub in self.layer.named_modules():
            if path:
                handles.append(sub.register_forward_pre_hook(partial(self._enter, path)))
                handles.append(sub.register_forward_hook(self._exit))
        try:
            yield
        finally:
            for h in handles:
                h.remove()
            self._on_entry = None

    def _enter(self, path: str, module: nn.Module, args: tuple) -> None:
        self._stack.append(path)
        k = self._entries[path]
        self._entries[path] += 1
        self.entry_of[path] = (k, self.clock)
        if self._on_entry is not None:
            self._on_entry(path, k)

    def _exit(self, module: nn.Module, args: tuple, output: object) -> None:
        del self._stack[-1]

    @property
    def path(self) -> str:
        return self._stack[-1]

    def hook_rng(self, paths: set[str]) -> None:
        """Steady state: tell the active region when these submodules are entered (it snapshots the RNG there)."""
        for path in sorted(paths - self._rng_hooked - {""}):
            self.layer.get_submodule(path).register_forward_pre_hook(partial(self._rng_entry, path))
            self._rng_hooked.add(path)

    def _rng_entry(self, path: str, module: nn.Module, args: tuple) -> None:
        if self.active is not None:
            self.active.entered(path)


class OpNamer:
    """Gives each op of one forward its op id, in call order."""

    def __init__(self, scope: ModuleScope):
        self._scope = scope
        self._counts: Counter[tuple[str, str]] = Counter()

    def __call__(self, func: object) -> str:
        key = (self._scope.path, op_name(func))
        occurrence = self._counts[key]
        self._counts[key] += 1
        self._scope.clock += 1
        return make_id(key[0], key[1], occurrence)
