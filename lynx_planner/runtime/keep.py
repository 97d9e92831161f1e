"""Selective keeping by op id: which saved tensors of a region stay, and serving kept ops during recomputation.

PyTorch's selective checkpointing (`create_selective_checkpoint_contexts`) caches *every* output of a MUST_SAVE op, so
keeping `native_dropout` would hold its full-width output next to the 1-byte mask the plan counts. Here a kept op's
tensors stay exactly when autograd saves them: `ForwardMode` records which op made each storage, the region's pack
hook keeps a saved tensor whose storage a kept op made (or that existed before the region: inputs, parameters), and
the outputs of a kept op are served from the cache during recomputation only when autograd kept all of them (else the
op runs again, with replayed RNG). Never cached: views, in-place and other mutating ops, factories (`empty_like`) and
tensors mutated after the op. Always cached and kept: outputs of functional collectives (`_c10d_functional.*`), so a
recomputation never repeats a TP collective.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map_only

from ..opid import op_name
from .opids import OpNamer
from .replay import RngState

_FACTORIES = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full",
    "zeros_like", "ones_like", "full_like",
})


def is_collective(func: torch._ops.OpOverload) -> bool:
    return func.namespace == "_c10d_functional"


def _aliases(func: torch._ops.OpOverload) -> bool:
    """The op returns a view of, or writes into, an existing tensor."""
    schema = func._schema
    return schema.is_mutable or any(r.alias_info is not None for r in schema.returns)


def cacheable(func: torch._ops.OpOverload) -> bool:
    return not _aliases(func) and op_name(func) not in _FACTORIES


def _tensors(out: object) -> list[torch.Tensor]:
    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


def storage_key(t: torch.Tensor) -> StorageWeakRef:
    return StorageWeakRef(t.untyped_storage())


@dataclass
class _Cached:
    out: object  # the op's outputs, detached
    versions: tuple[int, ...]
    rng_after: RngState | None  # RNG state after a random op, restored when the op is served instead of run

    def intact(self) -> bool:
        return all(t._version == v for t, v in zip(_tensors(self.out), self.versions))


class ForwardMode(TorchDispatchMode):
    """The forward of a region: names every op, remembers which op made each storage, caches the kept ops."""

    def __init__(self, namer: OpNamer, keep: frozenset[str], device: torch.device):
        super().__init__()
        self._namer, self._keep, self._device = namer, keep, device
        self._producer: dict[StorageWeakRef, tuple[StorageWeakRef, str]] = {}
        self.collectives: set[str] = set()
        self.seen: set[str] = set()
        self.cache: dict[str, _Cached] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        op = self._namer(func)
        self.seen.add(op)
        out = func(*args, **(kwargs or {}))
        if _aliases(func):
            return out
        for t in _tensors(out):
            ref = storage_key(t)
            known = self._producer.get(ref)
            if known is None or known[0].expired():  # a freed storage's address can be reused
                self._producer[ref] = (ref, op)
        if is_collective(func):
            self.collectives.add(op)
        if op in self.collectives or (op in self._keep and cacheable(func)):
            seeded = torch.Tag.nondeterministic_seeded in func.tags
            tensors = _tensors(out)
            self.cache[op] = _Cached(tree_map_only(torch.Tensor, torch.Tensor.detach, out),
                                     tuple(t._version for t in tensors),
                                     RngState.capture(self._device) if seeded else None)
        return out

    def producer(self, t: torch.Tensor) -> str | None:
        """The op of this region that made t's storage, or None (an input, a parameter)."""
        known = self._producer.get(storage_key(t))
        return None if known is None or known[0].expired() else known[1]

    def kept(self, op: str | None) -> bool:
        return op is None or op in self._keep or op in self.collectives

    def finish(self, kept_storages: set[StorageWeakRef]) -> dict[str, _Cached]:
        """The cache to serve during recomputation: kept ops all of whose outputs autograd kept, and collectives."""
        self._producer.clear()
        return {op: c for op, c in self.cache.items()
                if op in self.collectives or all(storage_key(t) in kept_storages for t in _tensors(c.out))}


class ReplayMode(TorchDispatchMode):
    """The recomputation of a region: serves cached ops by op id, runs the others."""

    def __init__(self, namer: OpNamer, cache: dict[str, _Cached]):
        super().__init__()
        self._namer, self._cache = namer, cache

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        hit = self._cache.pop(self._namer(func), None)
        if hit is None or not hit.intact():
            return func(*args, **(kwargs or {}))
        if hit.rng_after is not None:
            hit.rng_after.restore()
        return tree_map_only(torch.Tensor, torch.Tensor.detach, hit.out)
