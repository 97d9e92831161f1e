"""`apply_plan`: wrap the layers of one pipeline stage as the plan says; `LynxRuntime` releases recomputations.

Placements map to triggers (see `Placement` in schema.py):
  on_demand     backward's first unpack of the layer's saved tensors (classic checkpointing)
  layer_above   a gradient hook on the outputs of the next layer of the stage: backward entering it; for the
                stage's top layer, the grad_wait trigger
  grad_wait     `trigger(mb, "grad_wait")`: before micro-batch mb's backward, while its gradient receive is in flight
  prev_forward  `trigger(mb, "prev_forward")`: at the start of the forward of another micro-batch right before mb's
                backward (lynx_planner/placements.py; on demand where there is none)
The pipelining integration (`attach`) calls `trigger`; without it a training loop may call it itself, and a placement
nobody triggers falls back to on_demand. Layers run in stage order within a micro-batch's forward.
"""

from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from ..io import load_model
from ..opid import split_id, split_use, use_name
from ..policy import records_every_forward
from ..schema import LayerPolicy, Plan, PlanParallel
from . import compiled, conflicts, routing
from . import offload as host
from .errors import PlanMismatchError
from .opids import ModuleScope
from .region import Region
from .names import layer_paths, layer_policy
from .stages import layer_policies, resolve_layers, select_stage

# Analytic profiles name the TP collectives that the model issues outside its layers 'tp_*' (analytic.py): they never
# occur in a layer's forward, so the first-forward check skips them.
_PLACEHOLDER_PREFIX = "tp_"

_LOG_LENGTH = 4096

# Weak both ways: a layer's wrapped forward holds its runtime, and a runtime held here strongly would hold its layers,
# the keys, alive for ever (every planned model leaked, measured on an H100 as a previous model's GiB).
_RUNTIME_OF_LAYER: weakref.WeakKeyDictionary[nn.Module, weakref.ref[LynxRuntime]] = weakref.WeakKeyDictionary()


def _runtime_of_layer(module: nn.Module) -> LynxRuntime | None:
    ref = _RUNTIME_OF_LAYER.get(module)
    return ref() if ref is not None else None


@dataclass
class _Layer:
    index: int  # global layer index
    path: str
    module: nn.Module
    policy: LayerPolicy
    at: str  # the trigger that releases its recomputation
    keep: frozenset[str]
    scope: ModuleScope | None
    outer: tuple[nn.Module, ...] = ()  # the modules holding it (Hugging Face's flag may be set on them)
    routed: tuple[str, ...] = ()  # its submodules whose ops follow the routing (experts: routing.py)
    recording: str | None = None  # routed: recorded at every forward ('record') or kept by storage ('by_storage')
    checked: bool = False
    context: Any = None  # its selective-checkpoint context_fn under torch.compile (compiled.py)
    offload: frozenset[str] = frozenset()  # kept ops (and 'input') whose saved tensors go to the host
    reload: str = "layer_above"  # when they come back (the stage's top layer: grad_wait)


class LynxRuntime:
    """The applied plan of one stage: per-layer regions keyed by (micro-batch, layer) and their triggers."""

    def __init__(self, stage: int, layers: list[_Layer], parallel: PlanParallel):
        self.stage, self.parallel = stage, parallel
        self.layers = layers
        # The micro-batch whose forward runs next (set by the training loop or the pipelining integration; None: a
        # forward outside the schedule, e.g. its shape inference, whose regions no trigger releases).
        self.micro_batch: int | None = 0
        # The schedule action running now, ("F" | "B", micro-batch), set by the pipelining integration (None: unknown)
        self.action: tuple[str, int] | None = None
        # (micro-batch, layer, trigger, action) of the latest recomputations
        self.log: deque[tuple[int | None, int, str, tuple[str, int] | None]] = deque(maxlen=_LOG_LENGTH)
        self._regions: weakref.WeakValueDictionary[tuple[int | None, int], Region] = weakref.WeakValueDictionary()
        self._keys: weakref.WeakKeyDictionary[Region, tuple[int | None, int]] = weakref.WeakKeyDictionary()
        self._latest: dict[int, weakref.ref[Region]] = {}  # last region of each stage position
        self._stream = None
        self.offloader = host.Offloader()  # the stage's copy engine (runtime/offload.py)
        # (dtype, autocast) of plans that record a precision; autocast is checked at each layer's first forward
        self.precision: tuple[str, str | None] | None = None
        self.compiled_plan = False  # the plan was made for torch.compile (on-demand placements, priced so)
        from .. import schedules

        self.split_backward = schedules.get(parallel.schedule).splits_backward  # zero bubble: B then W
        # A module used at several places (layer names 'path', 'path#1', ...) is wrapped once; its k-th call of a
        # forward runs as its k-th use (calls counted modulo the uses: every forward calls each use once).
        uses: dict[int, list[tuple[int, int]]] = {}
        for position, layer in enumerate(layers):
            uses.setdefault(id(layer.module), []).append((split_use(layer.path)[1], position))
        for found in uses.values():
            positions = [position for _, position in sorted(found)]
            module = layers[positions[0]].module
            module.forward = self._wrapped_forward(positions, module.forward)

    def _wrapped_forward(self, positions: list[int], forward: Any) -> Any:
        calls = 0

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            position = positions[calls % len(positions)]
            calls += 1
            return self._forward(position, forward, args, kwargs)

        def single(*args: Any, **kwargs: Any) -> Any:  # no call counter: a compiled forward would guard on it
            return self._forward(positions[0], forward, args, kwargs)
        return single if len(positions) == 1 else wrapped

    def _forward(self, position: int, forward: Any, args: tuple, kwargs: dict) -> Any:
        layer = self.layers[position]
        training = layer.module.training and torch.is_grad_enabled()
        if training and layer.scope is not None and torch.compiler.is_compiling():  # traced by dynamo
            return self._compiled(layer, forward, args, kwargs)
        if training and any(map(conflicts.hf_checkpointing, (layer.module, *layer.outer))):
            raise PlanMismatchError(conflicts.hf_message(layer.path))  # enabled after apply_plan
        if training and layer.scope is not None and conflicts.compiled():  # dynamo fell back to running it eagerly
            raise PlanMismatchError(self._refusal(layer) or conflicts.compile_message(layer.path))
        if training and not layer.checked:
            conflicts.check_fsdp(layer.path, layer.module, [*layer.outer], layer.policy.at)  # sharded after apply_plan
        if layer.scope is None or not torch.is_grad_enabled():
            out = forward(*args, **kwargs)
        else:
            if self.precision is not None and layer.module.training and not layer.checked:
                check_autocast(self.precision[1], layer.path, layer.module)
            conflicts.check_outer_hooks(layer.path)
            region = Region(forward, layer.scope, layer.keep, self._recorded, self._side_stream,
                            routed=layer.recording, offload=layer.offload,
                            stash=host.Stash(self.offloader) if layer.offload else None)
            region.unpacked_twice = self.split_backward
            out = region.forward(*args, **kwargs)
            if region.conflict is not None:
                raise PlanMismatchError(conflicts.inner_message(layer.path, *region.conflict))
            if layer.module.training and not layer.checked:
                self._check_ops(layer, region.op_ids)
            key = (self.micro_batch, layer.index)
            self._regions[key], self._keys[region] = region, key
            self._latest[position] = weakref.ref(region)
        if torch.is_grad_enabled():
            self._chain(position, out)
        return out

    def _refusal(self, layer: _Layer) -> str | None:
        return compiled.refusal(layer.path, layer.at, self.compiled_plan, layer.policy.recompute_with,
                                bool(layer.routed))

    def _compiled(self, layer: _Layer, forward: Any, args: tuple, kwargs: dict) -> Any:
        why = self._refusal(layer)
        if why is not None:  # dynamo falls back to running the frame eagerly, where _forward raises it
            raise PlanMismatchError(why)
        if layer.context is None:
            raise PlanMismatchError(f"planned layer {layer.path!r} has no compiled policy")
        return compiled.run(forward, args, kwargs, layer.context)

    def _chain(self, position: int, out: Any) -> None:
        """layer_above: recompute the layer below when backward reaches this layer's outputs."""
        below = self._latest.pop(position - 1, None) if position > 0 else None
        region = below() if below is not None else None
        if region is None:
            return
        recompute = self.layers[position - 1].at == "layer_above"
        reload = region.stash is not None and self.layers[position - 1].reload == "layer_above"
        if not (recompute or reload):
            return
        tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        below_module = self.layers[position - 1].module

        def entered(_grad: Any) -> None:  # backward reaches this layer: the layer below's reload, then recompute
            if reload:
                region.stash.prefetch()
            if recompute:
                if not region.recomputed:
                    conflicts.gather_for_recompute(below_module)  # FSDP2: its parameters, as backward prefetch would
                region.recompute("layer_above")
        if tensors:
            torch.autograd.graph.register_multi_grad_hook(tensors, entered, mode="any")

    def _check_ops(self, layer: _Layer, seen: frozenset[str]) -> None:
        named = [*layer.policy.keep, *layer.policy.recompute]
        unknown = [op for op in named if op not in seen and not op.split(":")[-1].startswith(_PLACEHOLDER_PREFIX)
                   and not routing.is_routed(op, layer.routed)]  # experts that received no tokens do not run
        if _autocast_on(layer.module):
            # Autocast caches the cast copy of a weight for the whole forward: a weight shared with a layer that ran
            # before (tied, ALBERT-style) is not cast again here. The copy exists (the earlier layer made it), so
            # the plan holds; the profile traced each layer on its own, so it names the cast in every layer.
            unknown = [op for op in unknown if split_id(op)[1] != "_to_copy"]
        if unknown:
            casts = all(split_id(op)[1] == "_to_copy" for op in unknown)
            raise PlanMismatchError(
                f"layer {layer.index} ({layer.path!r}): the plan names ops its forward never runs: "
                f"{', '.join(unknown[:4])}; its forward runs e.g. {', '.join(sorted(seen)[:6])}. " + (
                    "The missing ops are all casts: the layer runs in another precision than profiled, or its "
                    "weights were already cast outside it; train in the profile's precision (--dtype/--autocast)"
                    if casts else "Was the plan made from a profile of this model?"))
        layer.checked = True

    def _recorded(self, region: Region, trigger: str) -> None:
        mb, index = self._keys[region]
        self.log.append((mb, index, trigger, self.action))

    def _side_stream(self, device: torch.device) -> Any:
        """Early recomputations on CUDA run on one side stream per stage (untested without a GPU)."""
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        return self._stream

    def trigger(self, micro_batch: int, at: str) -> None:
        """Release the recomputations placed `at` for one micro-batch, top layer first (backward needs it first)."""
        for layer in reversed(self.layers):
            if layer.reload == at and layer.offload:
                region = self._regions.get((micro_batch, layer.index))
                if region is not None and region.stash is not None:
                    region.stash.prefetch()
            if layer.at == at:
                region = self._regions.get((micro_batch, layer.index))
                if region is not None:
                    if layer.policy.at == "layer_above" and not region.recomputed:  # a top layer's, at the wait
                        conflicts.gather_for_recompute(layer.module)
                    region.recompute(at)

    def recomputations(self, micro_batch: int | None = None) -> dict[int, list[str]]:
        """Triggers of the latest recomputations, per global layer (of one micro-batch, or all)."""
        out: dict[int, list[str]] = {}
        for mb, index, trigger, _ in self.log:
            if micro_batch is None or mb == micro_batch:
                out.setdefault(index, []).append(trigger)
        return out


def _layer(index: int, path: str, module: nn.Module, policy: LayerPolicy, top: bool) -> _Layer:
    at = "grad_wait" if policy.at == "layer_above" and top else policy.at
    routed = routing.routed_paths(module)
    # a layer that keeps all and offloads some runs as a region too: its pack hooks send the offloaded tensors away
    keep = frozenset(policy.keep) if policy.mode == "selective" or policy.offload and policy.mode == "none" \
        else frozenset()
    keep = routing.shared_keep(keep, module) if routed else keep
    scope = ModuleScope(module) if policy.mode != "none" or policy.offload else None
    named = frozenset(policy.keep) | frozenset(policy.recompute) if policy.mode == "selective" else frozenset()
    # the plan recomputes some kept ops (their outputs autograd does not save, other recomputed ops read them): saved
    # in a compiled region they would not be recomputed, and add bytes the plan does not count
    saved = keep - frozenset(policy.recompute)
    context = compiled.context_fn(path, module, saved, named, _ignorable) if scope is not None else None
    reload = "grad_wait" if policy.reload == "layer_above" and top else policy.reload
    recording = ("record" if records_every_forward(policy.mode, policy.offload) else "by_storage") if routed else None
    return _Layer(index, path, module, policy, at, keep, scope, routed=routed, recording=recording, context=context,
                  offload=frozenset(policy.offload), reload=reload)


def _ignorable(op: str) -> bool:
    """An op id a compiled forward may lack: the TP placeholders of analytic profiles."""
    return op.split(":")[-1].startswith(_PLACEHOLDER_PREFIX)


def apply_plan(module: nn.Module, plan: Plan | str | Path, stage: int | None = None,
               names: str | None = None) -> nn.Module:
    """Wrap the layers of `stage` (None: the plan's only stage) of `module` as the plan says; returns `module`.

    `module` is the whole model or a stage module that keeps the model's module paths for the stage's layers
    (`StagePlan.layer_names`). Where it has not those paths, the plan's layers are found by role in the module's
    layout (torchtitan, Megatron, Hugging Face, lynx's own: runtime/names.py), detected or named by `names`, and a
    Llama block's op ids are translated between Hugging Face's and torchtitan's modules. Mismatches raise
    `PlanMismatchError`: here for stages, paths and ops without counterpart, at a layer's first training forward for
    op ids the layer never runs. Apply it once, after copying the model and before training.
    """
    if not isinstance(plan, Plan):
        plan = load_model(plan, Plan)
    stage_plan = select_stage(plan, stage)
    policies = layer_policies(stage_plan)
    paths = layer_paths(module, plan, stage_plan.layer_names, [p.mode for p in policies], names)
    first = stage_plan.layers[0]
    chosen = [(first + i, name, path, p)
              for i, (name, path, p) in enumerate(zip(stage_plan.layer_names, paths, policies)) if path is not None]
    modules = resolve_layers(module, stage_plan.stage, [path for _, _, path, _ in chosen])
    for (_, _, path, _), layer_module in zip(chosen, modules):
        applied = _runtime_of_layer(layer_module)
        if applied is not None:
            raise PlanMismatchError(f"a plan is already applied to layer {path!r}" + (
                " (a module used at several places: keep all its uses in one pipeline stage)"
                if applied.stage != stage_plan.stage else ""))
    check_uses(stage_plan.stage, [path for _, _, path, _ in chosen], modules)
    layers = [_layer(index, path, m, host.translated(p, layer_policy(p, m, name, path)), top=k == len(modules) - 1)
              for k, ((index, name, path, p), m) in enumerate(zip(chosen, modules))]
    for layer in layers:
        layer.outer = tuple(conflicts.ancestors(module, split_use(layer.path)[0]))
        conflicts.check_static(layer.path, layer.module, [*layer.outer], layer.policy.at)
    check_dtype(plan, [layer.path for layer in layers], modules)
    runtime = LynxRuntime(stage_plan.stage, layers, plan.parallel)
    runtime.precision = (plan.dtype, plan.autocast) if plan.dtype is not None else None
    runtime.compiled_plan = plan.compiled
    for layer in layers:
        _RUNTIME_OF_LAYER[layer.module] = weakref.ref(runtime)
    return module


def check_uses(stage: int, names: list[str], modules: list[nn.Module]) -> None:
    """A module used at several places is named once per use, uses 0, 1, ... in order (its calls map to its uses
    in call order); the same name twice, or a module the plan names once but under two paths, would apply one
    use's policy to another's call."""
    seen: dict[int, list[tuple[str, int]]] = {}
    for name, module in zip(names, modules):
        seen.setdefault(id(module), []).append(split_use(name))
    for found in seen.values():
        if [use for _, use in found] != list(range(len(found))) or len({path for path, _ in found}) > 1:
            raise PlanMismatchError(
                f"stage {stage}: layers {', '.join(use_name(p, u) for p, u in found)} are one module: a module "
                "used at several places must be named 'path', 'path#1', ... once per call, all in one stage "
                "(re-profile the model: lynx profiles each use of a shared module as its own layer)")


_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _how(dtype: str | None, autocast: str | None) -> str:
    return f"fp32 weights under {autocast} autocast" if autocast else f"{dtype} weights without autocast"


def check_dtype(plan: Plan, paths: list[str], modules: list[nn.Module]) -> None:
    """The stage's layers hold their weights in the plan's precision (plans that record one): another precision runs
    other ops (casts) and saves other bytes, so the plan would not fit."""
    if plan.dtype is None:
        return
    for path, module in zip(paths, modules):
        sizes: dict[str, int] = {}
        for p in module.parameters():
            if p.is_floating_point():
                name = _DTYPES.get(p.dtype, str(p.dtype))
                sizes[name] = sizes.get(name, 0) + p.numel()
        found = max(sizes, key=sizes.__getitem__) if sizes else plan.dtype
        if found != plan.dtype:
            raise PlanMismatchError(
                f"layer {path!r} has {found} weights, but the plan was made for {_how(plan.dtype, plan.autocast)}: "
                f"convert the model as the profile did (model.to(...)) or re-profile with --dtype {found}")


def _autocast_on(module: nn.Module) -> bool:
    param = next(module.parameters(), None)
    return torch.is_autocast_enabled(param.device.type if param is not None else "cpu")


def check_autocast(expected: str | None, path: str, module: nn.Module) -> None:
    """At a layer's first training forward: autocast is on, in the plan's dtype, exactly when the plan says so."""
    param = next(module.parameters(), None)
    device = param.device.type if param is not None else "cpu"
    found = _DTYPES.get(torch.get_autocast_dtype(device)) if torch.is_autocast_enabled(device) else None
    if found != expected:
        now = f"under {found} autocast" if found else "without autocast"
        want = f"under {expected} autocast (--autocast {expected})" if expected else "without autocast"
        raise PlanMismatchError(f"layer {path!r} runs {now}, but the plan was made for a forward {want}: train as "
                                "profiled, or re-profile with the precision you train in")


def runtime_of(module: nn.Module) -> LynxRuntime:
    """The runtime of the plan applied to (layers inside) `module`."""
    found = {id(r): r for m in module.modules() if (r := _runtime_of_layer(m)) is not None}
    if len(found) != 1:
        raise PlanMismatchError("no plan is applied to this module" if not found else
                                f"{len(found)} plans are applied inside this module: pass one stage's module")
    return next(iter(found.values()))
