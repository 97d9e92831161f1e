"""Offloading a layer's planned saved tensors to host memory and bringing them back (the runtime of offload.py).

A region (region.py) whose plan offloads some kept ops hands each of their saved tensors to the stage's `Offloader`
at pack time: the tensor's storage is copied once per (storage, version) into a host buffer and the region keeps only
the handle, so the device storage is freed when the copy is done. The copy back is queued when the plan's reload fires
(apply.py: a gradient hook on the layer above, or `trigger(mb, "grad_wait")`), and at the latest when backward unpacks
the tensor. On CUDA the buffers are pinned and both copies run on one copy stream beside the compute stream (the
allocator is told, record_stream, that the copy reads the device storage, so nothing reuses it before the copy ends);
on a CPU device the same path runs with host-to-host copies, so a test sees the gradients and the bytes released.
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import _disable_current_modes


class _Stored:
    """One device storage at one version, copied to the host."""

    def __init__(self, offloader: Offloader, t: torch.Tensor):
        self.offloader = offloader
        self.device = t.device
        src = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
        self.nbytes = src.numel()
        stream = offloader.stream
        if stream is not None:  # copy out beside the compute stream, after what produced the tensor
            stream.wait_stream(torch.cuda.current_stream(t.device))
            with torch.cuda.stream(stream):
                self.host = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=True)
                self.host.copy_(src, non_blocking=True)
            t.untyped_storage()  # the tensor itself may be freed by autograd: tell the allocator the copy reads it
            src.record_stream(stream)
        else:
            self.host = src.clone()  # host-to-host: a copy that owns its bytes
        offloader.sent_bytes += self.nbytes
        offloader.host_bytes += self.nbytes
        self.back: torch.Tensor | None = None
        self.ready = None

    def fetch(self) -> None:
        """Queue the copy back (once)."""
        if self.back is not None:
            return
        with _disable_current_modes():
            self._fetch()

    def _fetch(self) -> None:
        stream = self.offloader.stream
        if stream is not None:
            with torch.cuda.stream(stream):
                self.back = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
                self.back.copy_(self.host, non_blocking=True)
                self.ready = torch.cuda.Event()
                self.ready.record(stream)
        else:
            self.back = self.host.clone()
        self.offloader.fetched_bytes += self.nbytes
        self.offloader.host_bytes -= self.nbytes
        self.host = None  # the host buffer is released once the copy back is queued (its stream orders the copy)

    def bytes_back(self) -> torch.Tensor:
        self.fetch()
        if self.ready is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(self.ready)
            self.back.record_stream(current)
        return self.back


class Handle:
    """What the region keeps for one offloaded saved tensor: its stored storage and how the tensor views it."""

    def __init__(self, stored: _Stored, t: torch.Tensor):
        self.stored = stored
        self.dtype, self.size, self.stride, self.offset = t.dtype, t.size(), t.stride(), t.storage_offset()
        self.requires_grad = t.requires_grad

    def get(self) -> torch.Tensor:
        raw = self.stored.bytes_back()
        with _disable_current_modes():
            return torch.empty(0, dtype=self.dtype, device=raw.device).set_(
                raw.untyped_storage(), self.offset, self.size, self.stride)

    def as_input(self) -> torch.Tensor:
        """The tensor as a recomputation's input (the forward re-run differentiates through it)."""
        return self.get().requires_grad_(self.requires_grad)


class Offloader:
    """A stage's copy engine: one copy stream (CUDA), counters of the bytes sent and fetched."""

    def __init__(self) -> None:
        self._stream = None
        self.sent_bytes = 0
        self.fetched_bytes = 0
        self.host_bytes = 0  # host buffers alive (sent, not yet fetched)
        self.stream = None  # set per device by `for_device`

    def for_device(self, device: torch.device) -> Offloader:
        if device.type == "cuda" and self._stream is None:
            self._stream = torch.cuda.Stream(device)
        self.stream = self._stream if device.type == "cuda" else None
        return self


class Stash:
    """The offloaded tensors of one region (one layer, one micro-batch): a storage copied once, however many saved
    tensors view it."""

    def __init__(self, offloader: Offloader):
        self.offloader = offloader
        self._by_storage: dict[tuple[int, int], tuple[StorageWeakRef, _Stored]] = {}  # for sharing a live storage
        self.stored: list[_Stored] = []  # every copy, including those whose storage address was reused since

    def pack(self, t: torch.Tensor) -> Handle:
        t = t.detach()
        # the same storage at the same version, still alive (a freed storage's address is reused by the allocator)
        key = (t.untyped_storage().data_ptr(), t._version)
        found = self._by_storage.get(key)
        if found is None or found[0].expired():
            # outside the dispatch modes of the forward (the recorder of keep.py, a memory probe): the copy is the
            # copy engine's, not an op of the layer
            with _disable_current_modes():
                found = self._by_storage[key] = (StorageWeakRef(t.untyped_storage()),
                                                _Stored(self.offloader.for_device(t.device), t))
                self.stored.append(found[1])
        return Handle(found[1], t)

    def swap(self, tree):
        """`tree` (a region's forward inputs, kept for its recomputation) with each tensor whose storage this stash
        offloaded replaced by its handle: the region then holds no device copy of an offloaded input."""
        from torch.utils._pytree import tree_map

        def swap_one(x):
            if isinstance(x, torch.Tensor):
                found = self._by_storage.get((x.untyped_storage().data_ptr(), x._version))
                if found is not None and not found[0].expired():
                    return Handle(found[1], x.detach())
            return x
        return tree_map(swap_one, tree)

    def prefetch(self) -> None:
        """The plan's reload fired: queue every copy back."""
        for stored in self.stored:
            stored.fetch()


def restored(tree):
    """A region's inputs with offloaded ones brought back (Stash.swap undone) for its recomputation."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda x: x.as_input() if isinstance(x, Handle) else x, tree)


def unpacked(packed):
    """A saved value as backward reads it: an offloaded tensor comes back (waiting for its copy), others as they are."""
    return packed.get() if isinstance(packed, Handle) else packed


def translated(original, policy):
    """`policy` (a plan layer's policy in the module's op-id convention, names.layer_policy) with its offload list
    carried over from `original`: offloaded ops are kept ops, renamed as the keep list was."""
    if not original.offload:
        return policy
    rename = dict(zip(original.keep, policy.keep)) if len(original.keep) == len(policy.keep) else {}
    return policy.model_copy(update={"offload": [rename.get(o, o) for o in original.offload]})
