"""A checkpointed call of one layer (a layer × micro-batch) whose recomputation can be released early.

Stock `torch.utils.checkpoint` recomputes only inside backward's first unpack and offers no handle to start it
sooner, so a region is its own saved-tensor-hook checkpoint. The layer's first forward of an input signature is
recorded (keep.Recorder: op ids, storages, saved tensors) into a `Program`; later forwards run the plain layer under
two saved-tensor hooks that keep or drop the p-th saved tensor as the program says, so a region's forward costs a
Python call per saved tensor and nothing per op. `recompute()` (public, idempotent) runs only the program's steps
(the ops the plan recomputes) on the kept tensors under the captured RNG states; backward's unpack calls it itself
when nobody released it earlier. Where the program cannot replay (see keep.py), or a forward saved different tensors
than the recorded one, it re-runs the forward from its start and stops after the last dropped tensor, as PyTorch's
checkpoint does. A layer whose ops follow the MoE routing (routing.py) is recorded at every forward, or, recomputed
in full, keeps what its forward did not make and re-runs it. On CUDA an early recomputation runs on a side stream
that waits only for this region's forward (an event) and backward waits for it (another event); on CPU it runs
inline.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_leaves
from torch.utils._python_dispatch import _disable_current_modes

from .keep import Program, Recorder, build, replay
from .offload import Handle, restored, unpacked
from .opids import ModuleScope
from .replay import AutocastState, RngState, autocast_off


class _Stop(Exception):
    """Raised inside a re-run forward once every dropped tensor is regenerated."""


_SCALARS = (int, float, bool, str, type(None))


def _signature(scope: ModuleScope, leaves: list, autocast: AutocastState) -> tuple:
    """What decides the recorded ops: tensor shapes, strides, dtypes, devices, plain arguments, autocast, train mode."""
    key = tuple((x.shape, x.stride(), x.dtype, x.device, x.requires_grad) if isinstance(x, torch.Tensor)
                else x if isinstance(x, _SCALARS) else type(x) for x in leaves)
    return key, autocast.settings, scope.layer.training


class Region:
    """One forward of one layer; `recompute(trigger)` regenerates its dropped saved tensors exactly once."""

    def __init__(self, fn: Callable[..., Any], scope: ModuleScope, keep: frozenset[str],
                 on_recompute: Callable[[Region, str], None],
                 side_stream: Callable[[torch.device], Any] | None = None, routed: str | None = None,
                 offload: frozenset[str] = frozenset(), stash: Any = None):
        self._fn, self._scope, self._keep = fn, scope, keep
        self._offload, self.stash = offload, stash  # ops whose kept tensors go to the host, via runtime/offload.py
        # a layer whose ops follow the MoE routing (routing.py): 'record' every forward, or keep 'by_storage' (full)
        self._routed = routed
        self._on_recompute, self._side_stream = on_recompute, side_stream
        self.op_ids: frozenset[str] = frozenset()
        self.trigger: str | None = None  # what released the recomputation
        self.recorded = False  # this forward was recorded (the layer's first of its signature)
        self.replayed_ops: list[str] | None = None  # op ids the recomputation ran (None: re-ran the forward)
        self._inputs: tuple[tuple, dict] | None = None
        self._missing: list[int] = []  # pack positions of the tensors dropped after forward
        self._n_packed = 0
        self._diverged = False
        self._saved: dict[int, torch.Tensor] = {}  # kept tensors the replay reads, by pack position
        self._captured: dict[int, torch.Tensor] = {}
        self._snaps: dict[tuple[str, int], RngState] = {}
        self._regenerated: dict[int, torch.Tensor] | None = None
        # A backward split into input and weight gradients (zero bubble) unpacks saved tensors in both passes: the
        # regenerated ones then stay until the region's graph is freed, after the weight gradients.
        self.unpacked_twice = False
        self._fwd_done = self._rec_done = None
        self.conflict: tuple[str, str] | None = None  # another checkpointing seen inside the recorded forward

    # forward ---------------------------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._inputs = (args, kwargs)
        leaves = tree_leaves((args, kwargs))
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        self._device = tensors[0].device if tensors else torch.device("cpu")
        self._rng, self._autocast = RngState.capture(self._device), AutocastState.capture(self._device)
        signature = _signature(self._scope, leaves, self._autocast)
        program = self._scope.programs.get(signature)
        if program is None or program.record_always or self._routed == "record":
            out = self._record(args, kwargs, tensors, signature)
        elif self._routed == "by_storage":
            out = self._by_storage(program, args, kwargs, tensors)
        else:
            out = self._steady(program, args, kwargs, signature)
        if self._device.type == "cuda":
            self._fwd_done = torch.cuda.Event()
            self._fwd_done.record()
        if self.stash is not None:  # an offloaded input is held as its handle, not on the device
            self._inputs = self.stash.swap(self._inputs) if self._missing else None
        return out

    def _steady(self, program: Program, args: tuple, kwargs: dict, signature: tuple) -> Any:
        self._program = program
        self._wanted = program.source_packs
        self._entries: Counter[str] = Counter()
        self._scope.active = self if program.snapshots else None
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                out = self._fn(*args, **kwargs)
        finally:
            self._scope.active = None
        if self._n_packed != len(program.keep):
            self._diverged = True
        if self._diverged:  # record the next forward of this signature again
            self._scope.programs.pop(signature, None)
        self.op_ids = program.op_ids
        return out

    def _by_storage(self, program: Program, args: tuple, kwargs: dict, tensors: list[torch.Tensor]) -> Any:
        """A routed layer recomputed in full, after its first forward: what its ops run follows the batch, the rule
        does not. Keep a saved tensor whose storage the forward did not make (the inputs', parameters', buffers'),
        drop the rest, and recompute by re-running the forward, as PyTorch's checkpoint does: no op is recorded.
        (The recorded rule, keep.Recorder.kept with nothing kept, keeps also other storages made before the
        forward; dropping one frees nothing and the re-run regenerates it. A layer whose recorded forward ran a
        collective is recorded at every forward: its replay reads the captured output, program.record_always.)"""
        before = {t.untyped_storage().data_ptr() for t in tensors}
        for m in self._scope.modules:  # read each forward: FSDP2 swaps in gathered parameters
            before.update(t.untyped_storage().data_ptr() for t in (*m._parameters.values(), *m._buffers.values())
                          if t is not None)

        def pack(t: torch.Tensor) -> torch.Tensor | int:
            p = self._n_packed
            self._n_packed += 1
            if t.untyped_storage().data_ptr() in before:
                return t.detach()
            self._missing.append(p)
            return p

        self._program, self._diverged = program, True  # (diverged: the recomputation re-runs the forward)
        with torch.autograd.graph.saved_tensors_hooks(pack, self._unpack):
            out = self._fn(*args, **kwargs)
        self.op_ids = program.op_ids
        return out

    def _pack(self, t: torch.Tensor) -> torch.Tensor | int:
        p = self._n_packed
        self._n_packed += 1
        program = self._program
        if self._diverged or p >= len(program.keep) or program.shapes[p] != (t.shape, t.dtype):
            self._diverged = True  # not the recorded forward: keep the rest, re-run the forward to recompute
            return t.detach()
        if program.keep[p]:
            kept = t.detach()
            if program.offload and program.offload[p] and self.stash is not None:
                kept = self.stash.pack(kept)
            if p in self._wanted:
                self._saved[p] = kept
            return kept
        self._missing.append(p)
        return p

    def entered(self, path: str) -> None:
        """A submodule was entered (steady state): snapshot the RNG where a replayed random op needs it."""
        k = self._entries[path]
        self._entries[path] += 1
        if (path, k) in self._program.snapshots:
            self._snaps[(path, k)] = RngState.capture(self._device)

    def _record(self, args: tuple, kwargs: dict, tensors: list[torch.Tensor], signature: tuple) -> Any:
        self.recorded = True
        recorder = Recorder(self._scope, self._keep, tensors, self._offload)
        saved: dict[int, torch.Tensor] = {}

        def pack(t: torch.Tensor) -> torch.Tensor | int:
            p = self._n_packed
            self._n_packed += 1
            if recorder.pack(t):
                with _disable_current_modes():  # the region's own detach, not the layer's op: neither named nor
                    saved[p] = t.detach()  # recorded (the profile's trace has none; the recorder took 0.3 ms each)
                if recorder.saved[-1].offload and self.stash is not None:
                    saved[p] = self.stash.pack(saved[p])
                return saved[p]
            self._missing.append(p)
            return p

        def on_entry(path: str, k: int) -> None:
            self._snaps[(path, k)] = RngState.capture(self._device)

        recorder.own_pack = pack
        try:
            with self._scope.tracking(on_entry), torch.autograd.graph.saved_tensors_hooks(pack, self._unpack), \
                    recorder:
                out = self._fn(*args, **kwargs)
        finally:
            # recorder -> pack -> recorder is a cycle: left, it would hold every tensor this forward kept (`saved`)
            # after backward until Python's cyclic collector runs (1.1 GiB after the first step on an H100)
            recorder.own_pack = None
        self.conflict = recorder.conflict
        program = build(recorder)
        self._program = program
        self._saved = {p: t for p, t in saved.items() if p in program.source_packs}
        self._captured = {sid: recorder.collective_out[sid] for sid, (kind, _) in program.sources.items()
                          if kind == "captured"}
        self._snaps = {k: s for k, s in self._snaps.items() if k in program.snapshots}
        if not program.record_always:
            self._scope.programs[signature] = program
            self._scope.hook_rng({path for path, _ in program.snapshots})
        self.op_ids = program.op_ids
        return out

    # recomputation ---------------------------------------------------------------------------------------------
    @property
    def recomputed(self) -> bool:
        return self.trigger is not None

    def recompute(self, trigger: str = "on_demand") -> None:
        """Regenerate the dropped saved tensors now; later calls do nothing. `trigger` names who released it."""
        if self.recomputed or self._inputs is None:
            return
        if self.stash is not None:
            self._inputs = restored(self._inputs)
        self.trigger = trigger
        early_on_gpu = self._device.type == "cuda" and trigger != "on_demand" and self._side_stream is not None
        stream = self._side_stream(self._device) if early_on_gpu else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            if stream is not None:
                stream.wait_event(self._fwd_done)
            self._regenerated = self._regenerate() if self._missing else {}
            if stream is not None:
                self._rec_done = torch.cuda.Event()
                self._rec_done.record(stream)
        self._inputs = None
        self._saved, self._captured, self._snaps = {}, {}, {}
        self._on_recompute(self, trigger)

    def _regenerate(self) -> dict[int, torch.Tensor]:
        program = self._program
        if self._diverged or program.prefix_only:
            return self._rerun()
        leaves = [t for t in tree_leaves(self._inputs) if isinstance(t, torch.Tensor)]
        kinds = {"input": lambda v: leaves[v[0]], "tensor": lambda t: t, "saved": lambda p: unpacked(self._saved[p]),
                 "captured": self._captured.__getitem__}
        sources = {sid: kinds[kind](value) for sid, (kind, value) in program.sources.items()}
        shift = {sid: leaves[v[0]].storage_offset() - v[1] for sid, (kind, v) in program.sources.items()
                 if kind == "input"}
        snaps = {**self._snaps, ("", 0): self._rng}
        autocast = any(enabled for _, enabled, _ in self._autocast.settings)
        with self._rng.fork() if program.random else contextlib.nullcontext(), torch.no_grad(), \
                autocast_off(self._device) if autocast else contextlib.nullcontext():
            regenerated = replay(program, sources, shift, snaps)
        self.replayed_ops = program.recomputed_ops
        return regenerated

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
            with torch.enable_grad(), self._autocast.apply(), torch.autograd.graph.saved_tensors_hooks(pack, unpack):
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
        if isinstance(packed, Handle):
            return packed.get()
        if self._regenerated is None:
            self.recompute()
        t = self._regenerated.get(packed) if self.unpacked_twice else self._regenerated.pop(packed, None)
        if t is None:
            raise RuntimeError("lynx: a recomputed tensor was unpacked twice (backward over the same graph twice, "
                               "retain_graph=True, is not supported for checkpointed layers)")
        if self._rec_done is not None:
            current = torch.cuda.current_stream()
            current.wait_event(self._rec_done)
            t.record_stream(current)
        return t
