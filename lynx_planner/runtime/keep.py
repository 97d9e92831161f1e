"""Recording a layer's forward once per input signature: which saved tensors stay, and the ops a recomputation runs.

`Recorder` (a TorchDispatchMode, used only for a layer's first forward of a shape) names every aten op, follows every
storage through its creating op and in-place writers, and sees each tensor autograd saves (pack position). From
that, `build` makes a `Program`:
- `keep[p]`: the p-th saved tensor stays when a plan-kept op made it (the op that created its storage, or the in-place
  op that last wrote it, as the profile names values) or no op of the layer did (inputs, parameters), or it is a
  collective's output; every other saved tensor is dropped. Steady-state forwards decide by position alone.
- `steps`: the ops to run again, in forward order. They are the dependency closure of the dropped tensors over
  storages (an op is needed when it creates or writes, before the version autograd saved, a storage that is neither
  an input, a parameter nor a kept saved tensor), so only what the plan recomputes runs again, reading kept tensors.
  View ops never run again: an op's tensor arguments are rebuilt with `as_strided` from their storage. A random op
  runs under the RNG state captured when its innermost submodule was entered, after the random ops that preceded
  it since then (which the closure includes).
When a replay is impossible (an op's result decides control flow, a storage from outside the layer is written, a
dtype-changing view) the program says why and the region re-runs the forward from its start instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

from ..opid import op_name
from .opids import ModuleScope, OpNamer


def is_collective(func: torch._ops.OpOverload) -> bool:
    return func.namespace in ("_c10d_functional", "c10d_functional")


# Plain argument types: an op's arguments of these (and tensors), without keywords, are already flat.
_PLAIN = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format})


def _flatten(args: tuple, kwargs: dict) -> tuple[list, Any]:
    """tree_flatten((args, kwargs)), with spec None where the arguments are already flat, as most ops' are (pytree
    walks every argument in Python: a sixth of a recorded op's cost)."""
    if not kwargs and all(type(a) in _PLAIN or isinstance(a, torch.Tensor) for a in args):
        return list(args), None
    return tree_flatten((args, kwargs))


def _unflatten(flat: list, spec: Any) -> tuple[tuple, dict]:
    return (tuple(flat), {}) if spec is None else tree_unflatten(flat, spec)


def _leaves(out: Any) -> list:
    return [out] if isinstance(out, torch.Tensor) else tree_leaves(out)


_WRITTEN: dict[Any, tuple[tuple[int, str], ...]] = {}  # per op: (position, name) of each argument it writes


def _written_arguments(func) -> tuple[tuple[int, str], ...]:
    got = _WRITTEN.get(func)
    if got is None:
        got = _WRITTEN[func] = tuple((i, a.name) for i, a in enumerate(func._schema.arguments)
                                     if a.alias_info is not None and a.alias_info.is_write)
    return got


@dataclass(frozen=True)
class Ref:
    """A tensor argument: a view of a storage at a version."""

    sid: int
    version: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype


@dataclass
class Step:
    """One recorded non-view op."""

    index: int  # position among all ops of the forward
    op_id: str
    func: torch._ops.OpOverload
    flat: list  # flattened (args, kwargs), None in place of tensors (see refs)
    spec: Any
    refs: list[tuple[int, Ref]]  # positions of Refs in `flat`
    outs: list[int | None]  # per output tensor: the new storage's sid (None: an alias of an existing one)
    writes: list[int]  # sids it mutates
    random: bool
    snapshot: tuple[str, int] | None = None  # RNG snapshot key (submodule path, entry) for a random op
    snap_time: int = 0
    collective: bool = False


@dataclass(frozen=True)
class Saved:
    """One tensor autograd saved (by pack position)."""

    ref: Ref
    keep: bool
    offload: bool = False  # kept, and the plan sends it to the host (runtime/offload.py)


@dataclass
class Program:
    op_ids: frozenset[str]
    keep: tuple[bool, ...]
    shapes: tuple[tuple[torch.Size, torch.dtype], ...]
    steps: tuple[Step, ...] = ()
    sources: dict[int, tuple[str, Any]] = field(default_factory=dict)  # sid -> ('input', i) | ('tensor', t) | ...
    regenerate: dict[int, tuple[int, Ref, bool]] = field(default_factory=dict)  # pack -> (after step, ref, clone)
    ready_after: dict[int, list[int]] = field(default_factory=dict)  # step -> packs complete after it
    free_after: dict[int, list[int]] = field(default_factory=dict)  # step -> sids no longer needed
    snapshots: frozenset[tuple[str, int]] = frozenset()
    restore: dict[int, tuple[str, int]] = field(default_factory=dict)  # step -> snapshot to restore before it
    prefix_only: str | None = None  # why the recomputation must re-run the forward from its start
    record_always: bool = False  # it reads collective outputs, which only a recorded forward captures
    source_packs: frozenset[int] = frozenset()  # kept saved tensors the replay reads
    offload: tuple[bool, ...] = ()  # per pack position: the kept tensor goes to the host (empty: none does)

    @property
    def recomputed_ops(self) -> list[str]:
        return [s.op_id for s in self.steps]

    @property
    def random(self) -> bool:
        return bool(self.restore)


_DATA_DEPENDENT = frozenset({"_local_scalar_dense", "equal", "is_nonzero", "allclose", "nonzero", "unique",
                             "_unique2", "masked_select"})


_GEMMS = frozenset({"mm", "addmm", "bmm", "baddbmm", "linear", "matmul", "convolution", "_scaled_mm"})


class Recorder(TorchDispatchMode):
    """Names ops, tracks storages and versions, and records steps and saved tensors of one forward."""

    def __init__(self, scope: ModuleScope, keep: frozenset[str], leaves: list[torch.Tensor],
                 offload: frozenset[str] = frozenset()):
        super().__init__()
        self._offload = offload  # op ids (and 'input') whose kept tensors go to the host
        self._namer = OpNamer(scope)
        self._scope, self._keep = scope, keep
        self._sid: dict[StorageWeakRef, tuple[StorageWeakRef, int]] = {}
        self.versions: list[int] = []
        self.producer: list[str | None] = []  # op id that created each storage (None: existed before)
        self.makers: list[list[str | None]] = []  # per storage, the op id that made each version (creator, writers)
        self.base_dtype: list[torch.dtype] = []
        self.external: dict[int, tuple[str, Any]] = {}
        self.collective_out: dict[int, torch.Tensor] = {}
        self.steps: list[Step] = []
        self.saved: list[Saved] = []
        self.seen: set[str] = set()
        self.unsafe: str | None = None
        # an input may be a view into a larger batch at an offset that differs per micro-batch: sources record it
        self._inputs = {StorageWeakRef(t.untyped_storage()): (i, t.storage_offset())
                        for i, t in reversed(list(enumerate(leaves)))}
        self._params = {StorageWeakRef(t.untyped_storage()): t
                        for t in [*scope.layer.parameters(), *scope.layer.buffers()]}
        self._trainable = {StorageWeakRef(t.untyped_storage()) for t in scope.layer.parameters() if t.requires_grad}
        self._count = 0
        self.own_pack: Any = None  # the region's pack hook: any other on top while an op runs is another checkpoint
        self.conflict: tuple[str, str] | None = None  # (op id, what) of another checkpointing inside the layer

    # storages ----------------------------------------------------------------------------------------------------
    def _lookup(self, t: torch.Tensor) -> int | None:
        known = self._sid.get(StorageWeakRef(t.untyped_storage()))
        return None if known is None or known[0].expired() else known[1]  # a freed storage's address is reused

    def _new(self, t: torch.Tensor, producer: str | None) -> int:
        ref = StorageWeakRef(t.untyped_storage())
        sid = len(self.versions)
        self._sid[ref] = (ref, sid)
        self.versions.append(0)
        self.producer.append(producer)
        self.makers.append([producer])
        self.base_dtype.append(t.dtype)
        if producer is None:
            if ref in self._inputs:
                self.external[sid] = ("input", self._inputs[ref])
            elif ref in self._params:
                self.external[sid] = ("tensor", self._params[ref])
            else:
                self.external[sid] = ("foreign", None)
        return sid

    def ref(self, t: torch.Tensor) -> Ref:
        sid = self._lookup(t)
        if sid is None:
            sid = self._new(t, None)
        if t.dtype != self.base_dtype[sid]:
            self.unsafe = self.unsafe or f"a view changes dtype ({self.base_dtype[sid]} -> {t.dtype})"
        return Ref(sid, self.versions[sid], tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype)

    # ops ---------------------------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        index = self._scope.clock
        op = self._namer(func)
        self.seen.add(op)
        flat, spec = _flatten(args, kwargs)
        if self.conflict is None:
            self._check_conflict(op, func, flat)
        refs = [(i, self.ref(x)) for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
        writes = self._written(func, args, kwargs)
        out = func(*args, **kwargs)
        outs: list[int | None] = []
        for t in _leaves(out):
            if isinstance(t, torch.Tensor):
                outs.append(None if self._lookup(t) is not None else self._new(t, op))
            elif refs and op_name(func) in _DATA_DEPENDENT:
                self.unsafe = self.unsafe or f"{op} turns tensor data into a Python value"
        if any(s is not None for s in outs) or writes:
            random = torch.Tag.nondeterministic_seeded in func.tags
            constants = [None if isinstance(x, torch.Tensor) else x for x in flat]  # hold no tensor of this forward
            step = Step(index, op, func, constants, spec, refs, outs, writes, random, collective=is_collective(func))
            if random:
                path = self._scope.path
                k, step.snap_time = self._scope.entry_of.get(path, (0, 0))
                step.snapshot = (path, k)
            self.steps.append(step)
            if step.collective:
                for t, sid in zip([t for t in _leaves(out) if isinstance(t, torch.Tensor)], outs):
                    if sid is not None:
                        self.collective_out[sid] = t.detach()
        for sid in writes:
            self.versions[sid] += 1
            self.makers[sid].append(op)
        return out

    def _check_conflict(self, op: str, func, flat: list) -> None:
        """Another checkpoint inside the layer: its saved-tensor hooks sit above the region's (non-reentrant), or
        the layer's GEMMs on trainable parameters run with autograd off (reentrant: autograd sees none of them)."""
        top = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if self.own_pack is not None and (top is None or top[0] is not self.own_pack):
            self.conflict = (op, "other saved-tensor hooks are active inside it")
        elif (not torch.is_grad_enabled() and op_name(func) in _GEMMS and
              any(isinstance(x, torch.Tensor) and StorageWeakRef(x.untyped_storage()) in self._trainable
                  for x in flat)):
            self.conflict = (op, "a GEMM on a trainable parameter runs with autograd off")

    def _written(self, func, args, kwargs) -> list[int]:
        sids = []
        for i, name in _written_arguments(func):
            value = args[i] if i < len(args) else kwargs.get(name)
            for t in _leaves(value):
                if isinstance(t, torch.Tensor):
                    sid = self._lookup(t)
                    if sid is None:
                        sid = self._new(t, None)
                    if self.producer[sid] is None:
                        self.unsafe = self.unsafe or f"an op writes a tensor from outside the layer ({func})"
                    sids.append(sid)
        return sids

    # saved tensors -----------------------------------------------------------------------------------------------
    def kept(self, ref: Ref) -> bool:
        maker = self.makers[ref.sid][ref.version]  # as the profile, an in-place op makes a new value
        return self.producer[ref.sid] is None or maker in self._keep or ref.sid in self.collective_out

    def pack(self, t: torch.Tensor) -> bool:
        ref = self.ref(t)
        keep = self.kept(ref)
        maker = self.makers[ref.sid][ref.version]
        off = keep and bool(self._offload) and (
            maker in self._offload if maker is not None else
            "input" in self._offload and self.external.get(ref.sid, ("",))[0] == "input")
        self.saved.append(Saved(ref, keep, off))
        return keep


def build(rec: Recorder) -> Program:
    """The program of a recorded forward: keep decisions by pack position and the minimal replay."""
    prog = Program(op_ids=frozenset(rec.seen), keep=tuple(s.keep for s in rec.saved),
                   shapes=tuple((torch.Size(s.ref.size), s.ref.dtype) for s in rec.saved),
                   offload=tuple(s.offload for s in rec.saved) if any(s.offload for s in rec.saved) else ())
    dropped = {p: s.ref for p, s in enumerate(rec.saved) if not s.keep}
    if not dropped:
        return prog
    if rec.unsafe:
        prog.prefix_only = rec.unsafe
        return prog
    final = rec.versions
    # who makes each version of a storage: step position per (sid, version)
    maker: dict[tuple[int, int], int] = {}
    for pos, step in enumerate(rec.steps):
        for sid in step.outs:
            if sid is not None:
                maker[(sid, 0)] = pos
    versions = [0] * len(final)
    for pos, step in enumerate(rec.steps):
        for sid in step.writes:
            versions[sid] += 1
            maker[(sid, versions[sid])] = pos
    kept_at = {(s.ref.sid, s.ref.version): p for p, s in enumerate(rec.saved) if s.keep}
    needed: set[int] = set()
    sources: dict[int, tuple[str, Any]] = {}
    todo = list(dict.fromkeys((r.sid, r.version) for r in dropped.values()))
    done: set[tuple[int, int]] = set()
    random_steps = [pos for pos, s in enumerate(rec.steps) if s.random]
    while todo:
        sid, version = todo.pop()
        if (sid, version) in done:
            continue
        done.add((sid, version))
        if rec.producer[sid] is None:
            kind, value = rec.external[sid]
            if kind == "foreign" or version != 0:
                prog.prefix_only = "a recomputed op reads a tensor from outside the layer's inputs and parameters"
                return prog
            sources[sid] = (kind, value)
            continue
        if sid in rec.collective_out and version == final[sid]:
            sources[sid] = ("captured", sid)
            prog.record_always = True
            continue
        if (sid, version) in kept_at and version == final[sid]:
            sources[sid] = ("saved", kept_at[(sid, version)])
            continue
        for v in range(version + 1):
            pos = maker[(sid, v)]
            if pos in needed:
                continue
            needed.add(pos)
            step = rec.steps[pos]
            todo.extend((ref.sid, ref.version) for _, ref in step.refs)
            if step.random:  # the random ops since its RNG snapshot run too, in order
                for other in random_steps:
                    if step.snap_time <= rec.steps[other].index < step.index and other not in needed:
                        todo.extend((ref.sid, ref.version) for _, ref in rec.steps[other].refs)
                        needed.add(other)
                        todo.extend((s, 0) for s in rec.steps[other].outs if s is not None)
    # a needed step's sources may be made by needed steps: those are not sources
    made = {sid for pos in needed for sid in [*rec.steps[pos].outs, *rec.steps[pos].writes] if sid is not None}
    if any(kind == "saved" and sid in made for sid, (kind, _) in sources.items()):
        prog.prefix_only = "a recomputed op reads a storage at an older version than the kept one"
        return prog
    prog.sources = {sid: src for sid, src in sources.items() if sid not in made}
    prog.source_packs = frozenset(v for kind, v in prog.sources.values() if kind == "saved")
    order = sorted(needed)
    if any(rec.steps[pos].collective for pos in order):
        prog.prefix_only = "the recomputation would repeat a collective"
        return prog
    prog.steps = tuple(rec.steps[pos] for pos in order)
    # where each dropped tensor appears, and whether a later replayed write means it must be copied
    version_after: dict[int, int] = {}
    ready: dict[tuple[int, int], int] = {}
    last_write: dict[int, int] = {}
    for i, step in enumerate(prog.steps):
        for sid in step.outs:
            if sid is not None:
                version_after[sid] = 0
                ready[(sid, 0)] = i
        for sid in step.writes:
            version_after[sid] = version_after.get(sid, 0) + 1
            ready[(sid, version_after[sid])] = i
            last_write[sid] = i
    for p, ref in dropped.items():
        i = ready[(ref.sid, ref.version)]
        prog.regenerate[p] = (i, ref, last_write.get(ref.sid, -1) > i)
        prog.ready_after.setdefault(i, []).append(p)
    # free a replayed storage after its last reader unless a dropped tensor lives in it
    last_use: dict[int, int] = {}
    for i, step in enumerate(prog.steps):
        for _, ref in step.refs:
            last_use[ref.sid] = i
        for sid in step.outs:
            if sid is not None:
                last_use.setdefault(sid, i)
    regenerated = {ref.sid for ref in dropped.values()}
    for sid, i in last_use.items():
        if sid not in regenerated and sid not in prog.sources:
            prog.free_after.setdefault(i, []).append(sid)
    # RNG: restore a snapshot before the first replayed random op after it
    restored: set[tuple[str, int]] = set()
    for i, step in enumerate(prog.steps):
        if step.random and step.snapshot not in restored:
            restored.add(step.snapshot)
            prog.restore[i] = step.snapshot
    prog.snapshots = frozenset(restored)
    return prog


def replay(prog: Program, resolve: dict[int, torch.Tensor], shift: dict[int, int], snapshots: dict
           ) -> dict[int, torch.Tensor]:
    """Run the program's steps (under no_grad, autocast off: the recorded ops are already cast) and return the
    dropped saved tensors by pack position. `resolve` holds a tensor of each source storage, `shift` how far a
    source's storage offsets moved since the recording (inputs that are views into a batch)."""
    store = dict(resolve)
    regenerated: dict[int, torch.Tensor] = {}
    for i, step in enumerate(prog.steps):
        if i in prog.restore:
            snapshots[prog.restore[i]].restore()
        flat = list(step.flat)
        for pos, ref in step.refs:
            flat[pos] = _view(store[ref.sid], ref, shift.get(ref.sid, 0))
        args, kwargs = _unflatten(flat, step.spec)
        result = step.func(*args, **kwargs)
        tensors = [t for t in _leaves(result) if isinstance(t, torch.Tensor)]
        for t, sid in zip(tensors, step.outs):
            if sid is not None:
                store[sid] = t
        for p in prog.ready_after.get(i, ()):
            _, ref, clone = prog.regenerate[p]
            t = _view(store[ref.sid], ref)
            regenerated[p] = t.clone() if clone else t
        for sid in prog.free_after.get(i, ()):
            store.pop(sid, None)
    return regenerated


def _view(base: torch.Tensor, ref: Ref, shift: int = 0) -> torch.Tensor:
    offset = ref.offset + shift
    if tuple(base.shape) == ref.size and tuple(base.stride()) == ref.stride and base.storage_offset() == offset:
        return base
    return base.as_strided(ref.size, ref.stride, offset)
