"""Ground truth for saved bytes: storages created during a real forward that are still alive after it."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .recorder import tensors_in
from .tracing import fresh_arguments, split_arguments


class LiveBytes(TorchDispatchMode):
    """Bytes of the tensor storages first created under this mode and still alive (keyed by storage `_cdata`,
    which fake and real tensors both have). Storages of `ignore` tensors are never counted."""

    def __init__(self, ignore: list[torch.Tensor] = ()):
        super().__init__()
        self.live = 0
        self._seen: dict[int, weakref.ref] = {}
        self._ignore = {t.untyped_storage()._cdata for t in ignore}

    def _free(self, key: int, nbytes: int) -> None:
        self._seen.pop(key, None)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tensors_in(out):
            storage = t.untyped_storage()
            key, nbytes = storage._cdata, storage.nbytes()
            if nbytes and key not in self._seen and key not in self._ignore:
                self._seen[key] = weakref.ref(storage, lambda _r, k=key, n=nbytes: self._free(k, n))
                self.live += nbytes
        return out


def saved_bytes_after_forward(module: torch.nn.Module, args: tuple, kwargs: dict | None = None) -> int:
    """Bytes a real forward leaves alive for backward: parameters, buffers, inputs and the output excluded."""
    args, kwargs = fresh_arguments(args, kwargs or {})
    first, others = split_arguments(args, kwargs)
    ignore = [*module.parameters(), *module.buffers(), *([first] if first is not None else []), *others]
    with LiveBytes(ignore) as mem:
        out = module(*args, **kwargs)
    outputs = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors_in(out)}
    return mem.live - sum(n for key, n in outputs.items() if key in mem._seen)
