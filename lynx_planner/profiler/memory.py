"""Ground truth for saved bytes: storages created during a real forward that are still alive after it."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .recorder import tensors_in
from .tracing import fresh_arguments, split_arguments


class LiveBytes(TorchDispatchMode):
    """Bytes of the tensor storages that ops create under this mode and that are still alive (`live`), and the most
    alive at once (`peak`). Views and in-place results are not new storages; storages of `ignore` tensors are never
    counted. Keyed by storage `_cdata`, which fake and real tensors both have. The one probe of live memory: the
    profiler's ground truth, `lynx validate`'s measurement and the runtime tests all use it."""

    def __init__(self, ignore: list[torch.Tensor] = ()):
        super().__init__()
        self.live = self.peak = 0
        self._seen: dict[int, weakref.ref] = {}
        self._ignore = {t.untyped_storage()._cdata for t in ignore}

    def _free(self, key: int, nbytes: int) -> None:
        self._seen.pop(key, None)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        schema = func._schema
        if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
            return out
        for t in tensors_in(out):
            storage = t.untyped_storage()
            key, nbytes = storage._cdata, storage.nbytes()
            if nbytes and key not in self._seen and key not in self._ignore:
                self._seen[key] = weakref.ref(storage, lambda _r, k=key, n=nbytes: self._free(k, n))
                self.live += nbytes
        self.peak = max(self.peak, self.live)
        return out

    def bytes_of(self, tensors: list[torch.Tensor]) -> int:
        """Bytes of those tensors' storages that this mode counts."""
        keys = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors}
        return sum(n for k, n in keys.items() if k in self._seen)


def saved_bytes_after_forward(module: torch.nn.Module, args: tuple, kwargs: dict | None = None) -> int:
    """Bytes a real forward leaves alive for backward: parameters, buffers, inputs and the output excluded. The
    output is the first tensor returned (the next layer's input, as the profile's `output_bytes`): further outputs
    that autograd saved stay counted (Bloom's block returns its attention probabilities, which softmax saves; a
    measurement excluding them read the profile's right bytes as a 7-15% over-prediction)."""
    args, kwargs = fresh_arguments(args, kwargs or {})
    first, others = split_arguments(args, kwargs)
    ignore = [*module.parameters(), *module.buffers(), *([first] if first is not None else []), *others]
    with LiveBytes(ignore) as mem:
        out = module(*args, **kwargs)
    return mem.live - mem.bytes_of(tensors_in(out)[:1])
