"""A checkpointed call of one layer (a layer × micro-batch) whose recomputation can be released early.

Stock `torch.utils.checkpoint` recomputes only inside backward's first unpack and offers no handle to start it
sooner, so a region is its own saved-tensor-hook checkpoint: the forward keeps the tensors of the plan's kept ops and
an index for every other saved tensor; `recompute()` (public, idempotent) runs the forward again under the captured
RNG and autocast state and stops as soon as the last missing tensor is regenerated; backward's unpack calls it itself
when nobody released it earlier. On CUDA an early recomputation runs on a side stream that waits only for this
region's forward (an event) and backward waits for it (another event); on CPU it runs inline.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_leaves

from .keep import ForwardMode, ReplayMode, storage_key
from .opids import ModuleScope, OpNamer
from .replay import AutocastState, RngState


class _Stop(Exception):
    """Raised inside a recomputation once every missing tensor is regenerated."""


def _device_of(args: tuple, kwargs: dict) -> torch.device:
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    return tensors[0].device if tensors else torch.device("cpu")


class Region:
    """One forward of one layer; `recompute(trigger)` regenerates its dropped saved tensors exactly once."""

    def __init__(self, fn: Callable[..., Any], scope: ModuleScope, keep: frozenset[str],
                 on_recompute: Callable[[Region, str], None],
                 side_stream: Callable[[torch.device], Any] | None = None):
        self._fn, self._scope, self._keep = fn, scope, keep
        self._on_recompute, self._side_stream = on_recompute, side_stream
        self.op_ids: frozenset[str] = frozenset()
        self.trigger: str | None = None  # what released the recomputation
        self._inputs: tuple[tuple, dict] | None = None
        self._missing: list[int] = []  # pack positions of the tensors dropped after forward
        self._n_packed = 0
        self._regenerated: dict[int, torch.Tensor] | None = None
        self._fwd_done = self._rec_done = None

    # forward ---------------------------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._inputs = (args, kwargs)
        self._device = _device_of(args, kwargs)
        self._rng, self._autocast = RngState.capture(self._device), AutocastState.capture(self._device)
        self._mode = ForwardMode(OpNamer(self._scope), self._keep, self._device)
        self._kept: set[StorageWeakRef] = set()
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack), self._mode:
            out = self._fn(*args, **kwargs)
        self.op_ids = frozenset(self._mode.seen)
        self._cache = self._mode.finish(self._kept)
        del self._mode, self._kept
        if self._device.type == "cuda":
            self._fwd_done = torch.cuda.Event()
            self._fwd_done.record()
        return out

    def _pack(self, t: torch.Tensor) -> torch.Tensor | int:
        position = self._n_packed
        self._n_packed += 1
        if self._mode.kept(self._mode.producer(t)):
            self._kept.add(storage_key(t))
            return t.detach()
        self._missing.append(position)
        return position

    # recomputation ---------------------------------------------------------------------------------------------
    @property
    def recomputed(self) -> bool:
        return self.trigger is not None

    def recompute(self, trigger: str = "on_demand") -> None:
        """Regenerate the dropped saved tensors now; later calls do nothing. `trigger` names who released it."""
        if self.recomputed or self._inputs is None:
            return
        self.trigger = trigger
        early_on_gpu = self._device.type == "cuda" and trigger != "on_demand" and self._side_stream is not None
        stream = self._side_stream(self._device) if early_on_gpu else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            if stream is not None:
                stream.wait_event(self._fwd_done)
            self._regenerated = self._rerun() if self._missing else {}
            if stream is not None:
                self._rec_done = torch.cuda.Event()
                self._rec_done.record(stream)
        self._inputs = self._cache = None
        self._on_recompute(self, trigger)

    def _rerun(self) -> dict[int, torch.Tensor]:
        wanted, last = set(self._missing), self._missing[-1]
        regenerated: dict[int, torch.Tensor] = {}
        position = 0

        def pack(t: torch.Tensor) -> None:
            nonlocal position
            if position in wanted:
                regenerated[position] = t.detach()
            position += 1
            if position > last:
                raise _Stop

        def unpack(_: None) -> torch.Tensor:
            raise RuntimeError("lynx: the recomputed graph is not differentiated")

        args, kwargs = self._inputs
        with self._rng.fork():
            self._rng.restore()
            with torch.enable_grad(), self._autocast.apply(), ReplayMode(OpNamer(self._scope), self._cache), \
                    torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                try:
                    self._fn(*args, **kwargs)
                except _Stop:
                    pass
        if len(regenerated) != len(wanted):
            raise RuntimeError(f"lynx: recomputation saved {position} tensors, the forward saved {self._n_packed}: "
                               "the layer's forward is not deterministic in the tensors it saves")
        return regenerated

    def _unpack(self, packed: torch.Tensor | int) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        if self._regenerated is None:
            self.recompute()
        t = self._regenerated.pop(packed, None)
        if t is None:
            raise RuntimeError("lynx: a recomputed tensor was unpacked twice (backward over the same graph twice, "
                               "retain_graph=True, is not supported for checkpointed layers)")
        if self._rec_done is not None:
            current = torch.cuda.current_stream()
            current.wait_event(self._rec_done)
            t.record_stream(current)
        return t
