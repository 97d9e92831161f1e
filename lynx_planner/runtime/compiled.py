"""Planned layers under torch.compile: the plan's keep decisions as a selective-checkpoint policy.

The eager runtime (region.py) keeps and drops saved tensors with saved-tensor hooks and replays recomputations with a
dispatch mode; dynamo traces neither faithfully. Under torch.compile a planned layer instead runs inside
`torch.utils.checkpoint` with a `create_selective_checkpoint_contexts` policy, as torchtitan's compiled selective
checkpointing does: every op of the layer the plan keeps is `MUST_SAVE`, every other op `PREFER_RECOMPUTE`. Dynamo
turns the checkpoint into a tagged region, AOTAutograd's partitioner honours the tags, and inductor fuses the
recomputation into the backward kernels. `MUST_SAVE` saves the op's output even where compile would have recomputed it
in the fused backward; the plans of a compiled profile keep only ops whose outputs compile itself saves
(profiler/compiled.py), so their kept layers hold no tensor compile fuses away.

The policy runs while AOTAutograd traces the region (once per compilation, not per step). It names each op as the
profiler does ('<submodule path>:<aten op>#<occurrence>', opid.py): the submodule comes from the node's
`nn_module_stack`, which dynamo records and the tagged region's interpreter exposes as the current node meta.

What the compiled path cannot do, it refuses (PlanMismatchError, or the compile error dynamo wraps it in):
- early placements (layer_above, grad_wait, prev_forward) need hooks between the layer's forward and its backward;
  compiled, the recomputation runs inside the layer's fused backward, i.e. on demand. A plan made for compiled
  training (`lynx plan --compile`: `compiled: true`, every placement on_demand and priced so) runs; an eager plan
  with early placements is refused at the first compiled forward (re-plan with --compile);
- Megatron's uniform chunks (`recompute_with`) and routed MoE layers (their op set follows the batch);
- a plan naming ops the compiled forward never runs (checked once the forward has been traced).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from torch import nn

from ..opid import make_id, op_name, split_id
from .conflicts import EARLY
from .errors import PlanMismatchError

_INDEX = re.compile(r"\[(\d+)\]")
_QUOTED = re.compile(r"\[['\"]([^'\"]+)['\"]\]")


def _plain(fqn: str) -> str:
    """dynamo's module path ("L['self'].layers[0].mlp", "L['args'][0].model.layers.0") in dotted form."""
    return _INDEX.sub(r".\1", _QUOTED.sub(r".\1", fqn))


class OpNames:
    """Names the ops of one traced forward (or its recomputation) of a layer from the current node's module stack."""

    def __init__(self, layer: nn.Module):
        self._type = type(layer)
        self._paths = sorted((p for p, _ in layer.named_modules() if p), key=len, reverse=True)
        self._counts: Counter[tuple[str, str]] = Counter()

    def submodule(self) -> str:
        """The running submodule's path relative to the layer ('' : the layer's own forward)."""
        import torch.fx.traceback as fx_traceback

        meta = fx_traceback.get_current_meta() or {}
        stack = list((meta.get("nn_module_stack") or {}).values())
        own = [i for i, (_, kind) in enumerate(stack) if kind is self._type or kind == _qualname(self._type)]
        inner = stack[own[-1] + 1:] if own else stack
        if not inner:
            return ""
        path = "." + _plain(inner[-1][0])
        return next((p for p in self._paths if path.endswith("." + p)), "")

    def __call__(self, func: Any) -> str:
        key = (self.submodule(), op_name(func))
        occurrence = self._counts[key]
        self._counts[key] += 1
        return make_id(key[0], key[1], occurrence)


# Dropout on the CPU runs eagerly as empty_like, bernoulli_, div_ (the scaled mask, saved) and mul; compiled, as one
# native_dropout (a bool mask, saved). The plan's ids are the eager ones: the k-th native_dropout of a submodule is
# kept when the plan keeps its mask (div_#k) and stands for those eager ops in the check of named ops.
_EAGER_DROPOUT = ("empty_like", "bernoulli_", "div_")


def eager_ids(op: str, dropout_module: bool) -> list[str]:
    """The eager op ids a compiled op stands for (itself, or a native_dropout's eager ops)."""
    path, name, k = split_id(op)
    if name != "native_dropout":
        return [op]
    return [op, *(make_id(path, n, k) for n in _EAGER_DROPOUT), *([make_id(path, "mul", k)] if dropout_module else [])]


def _kept(op: str, keep: frozenset[str]) -> bool:
    path, name, k = split_id(op)
    return op in keep or (name == "native_dropout" and make_id(path, "div_", k) in keep)


_CHECKED: dict[type, type] = {}


def _on_exit(mode: Any, callback: Callable[[], None]) -> Any:
    """`mode` (the checkpoint's forward context) calling `callback` once its forward has been traced."""
    base = type(mode)
    if base not in _CHECKED:
        def __exit__(self: Any, *exc: Any) -> Any:
            out = base.__exit__(self, *exc)
            if exc[0] is None:
                self._lynx_exit()
            return out
        _CHECKED[base] = type(f"Checked{base.__name__}", (base,), {"__exit__": __exit__})
    mode.__class__ = _CHECKED[base]
    mode._lynx_exit = callback
    return mode


def _qualname(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def context_fn(path: str, layer: nn.Module, keep: frozenset[str], named: frozenset[str],
               ignore: Callable[[str], bool]) -> Callable[[], tuple[Any, Any]]:
    """The checkpoint's `context_fn` for one planned layer: a fresh policy per traced call. `named`: the op ids the
    plan names (keep and recompute), checked against the traced forward when it ends; `ignore`: ids that may be
    missing (the TP placeholders of analytic profiles)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    dropouts = {p for p, m in layer.named_modules() if isinstance(m, nn.Dropout)}

    def make() -> tuple[Any, Any]:
        names = {False: OpNames(layer), True: OpNames(layer)}
        seen: set[str] = set()

        def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
            op = names[ctx.is_recompute](func)
            if not ctx.is_recompute:
                seen.update(eager_ids(op, split_id(op)[0] in dropouts))
            return CheckpointPolicy.MUST_SAVE if _kept(op, keep) else CheckpointPolicy.PREFER_RECOMPUTE

        forward, recompute = create_selective_checkpoint_contexts(policy)
        # once the forward is traced every op it runs was named
        return _on_exit(forward, lambda: check_ops(path, named, frozenset(seen), ignore)), recompute

    return make


def check_ops(path: str, named: frozenset[str], seen: frozenset[str], ignore: Callable[[str], bool]) -> None:
    unknown = sorted(op for op in named if op not in seen and not ignore(op))
    if unknown:
        raise PlanMismatchError(
            f"layer {path!r} under torch.compile: the plan names ops its traced forward never runs: "
            f"{', '.join(unknown[:4])}; it runs e.g. {', '.join(sorted(seen)[:6])}. Was the plan made from a "
            "profile of this model? Compiled, some ops also decompose otherwise than eagerly (attention with "
            "dropout on the CPU runs as matmuls): plan such a layer with full recomputation, or train eagerly")


def refusal(path: str, at: str, compiled_plan: bool, recompute_with: int | None, routed: bool) -> str | None:
    """Why this planned layer cannot run compiled (None: it can)."""
    if at in EARLY and not compiled_plan:
        return (f"planned layer {path!r} runs under torch.compile with an early recomputation ({at}): compiled, "
                "its recomputation runs inside the layer's fused backward (on demand), which the plan did not "
                "price. Re-plan for compiled training (lynx plan ... --compile: every placement on demand, priced "
                "so), or train eagerly")
    if recompute_with is not None:
        return (f"planned layer {path!r}: Megatron's uniform chunks (recompute_with) do not run under "
                "torch.compile; plan with another algorithm or train eagerly")
    if routed:
        return (f"planned layer {path!r} holds routed experts: their ops follow the batch, which a compiled "
                "policy traced once cannot; train the planned model eagerly")
    return None


def run(forward: Callable[..., Any], args: tuple, kwargs: dict, make_context: Callable[[], Any]) -> Any:
    """The layer's forward under a selective checkpoint with the plan's policy (traced by dynamo)."""
    from torch.utils.checkpoint import checkpoint

    return checkpoint(forward, *args, use_reentrant=False, context_fn=make_context, **kwargs)


__all__ = ["OpNames", "check_ops", "context_fn", "refusal", "run"]
