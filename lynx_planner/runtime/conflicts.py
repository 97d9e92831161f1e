"""What else on a planned layer would make the plan silently not apply, or crash: other activation checkpointing
(Hugging Face's flag, torch's checkpoint_wrapper, checkpoint hooks inside or around the layer) and FSDP2 sharding
under early recomputation. Each is refused with what was found and what to do (docs/composition.md).

Checked at `apply_plan` (what the module tree shows), at every training forward of a planned layer (Hugging Face's
flag, which `gradient_checkpointing_enable()` may set after `apply_plan`), and while a layer's forward is recorded
(saved-tensor hooks other than the region's, a parameter's GEMM run with autograd off: a checkpoint inside it).
"""

from __future__ import annotations

import torch
from torch import nn

from .errors import PlanMismatchError

EARLY = ("layer_above", "grad_wait", "prev_forward")


def _checkpoint_wrapper_type() -> type | None:
    try:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    except ImportError:  # torch built without distributed
        return None
    return CheckpointWrapper


def _fsdp_type() -> type | None:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return None
    return FSDPModule


def hf_checkpointing(module: nn.Module) -> bool:
    """Hugging Face's gradient checkpointing is on for this module (`gradient_checkpointing_enable()` sets the flag
    on every module that has it: the layers, and in older models the module looping over them)."""
    return getattr(module, "gradient_checkpointing", False) is True


def ancestors(root: nn.Module, path: str) -> list[nn.Module]:
    """The modules on the way from `root` down to the module at `path`, `root` included, the module excluded."""
    out, m = [root], root
    for part in [p for p in path.split(".") if p][:-1]:
        m = m.get_submodule(part)
        out.append(m)
    return out


def hf_message(path: str) -> str:
    return (f"Hugging Face gradient checkpointing is on for planned layer {path!r} (gradient_checkpointing_enable() "
            "or TrainingArguments(gradient_checkpointing=True)): it checkpoints the layer its own way, so the plan "
            "would not apply. Turn it off (model.gradient_checkpointing_disable(); gradient_checkpointing=False): "
            "the plan does the recomputation")


def check_static(path: str, module: nn.Module, outer: list[nn.Module], at: str) -> None:
    """At apply_plan: the module tree around and inside a planned layer (`outer`: its ancestors)."""
    wrapper = _checkpoint_wrapper_type()
    inside = list(module.modules())
    if wrapper is not None and any(isinstance(m, wrapper) for m in [*outer[1:], *inside]):
        raise PlanMismatchError(
            f"layer {path!r} is wrapped by torch's checkpoint_wrapper (apply_activation_checkpointing): it "
            "recomputes the layer its own way, so the plan would not apply. Apply the plan to the unwrapped model "
            "(drop apply_activation_checkpointing / checkpoint_wrapper for the planned layers)")
    if any(hf_checkpointing(m) for m in [*outer, *inside]):
        raise PlanMismatchError(hf_message(path))
    check_fsdp(path, module, outer, at)


def check_fsdp(path: str, module: nn.Module, outer: list[nn.Module], at: str) -> None:
    """FSDP2 frees a layer's unsharded parameters after its forward and gathers them again for its own backward. A
    recomputation released when backward enters the layer above (layer_above) runs once the runtime has gathered
    the layer's own FSDP2 groups itself (gather_for_recompute: the all-gather FSDP2's backward prefetch would issue
    there); released earlier (grad_wait, prev_forward) it would keep them gathered far longer, and a layer whose
    parameters an FSDP2 group around it owns cannot be gathered alone: refused, unless every group keeps its
    parameters gathered (reshard_after_forward=False)."""
    fsdp = _fsdp_type()
    if fsdp is None or at not in EARLY:
        return
    around = [m for m in outer[1:] if isinstance(m, fsdp)]
    inside = [m for m in module.modules() if isinstance(m, fsdp)]
    if not around + inside or _keeps_gathered(around + inside):
        return
    if at == "layer_above" and _keeps_gathered(around):
        return
    raise PlanMismatchError(
        f"layer {path!r} is sharded by FSDP2 (fully_shard) and its plan recomputes it early ({at}): FSDP2 "
        "frees the layer's gathered parameters after its forward and gathers them again only for its own "
        "backward, so an early recomputation would read freed memory. Plan with on_demand or layer_above placements "
        "for FSDP-sharded layers (shard each layer with its own fully_shard), or shard them with "
        "fully_shard(..., reshard_after_forward=False)")


def gather_for_recompute(module: nn.Module) -> None:
    """Before an early recomputation of a layer: all-gather its own FSDP2 groups that resharded after the forward
    (FSDPModule.unshard; FSDP2's own pre-backward then finds them gathered, and reshards them after the layer's
    backward as usual)."""
    fsdp = _fsdp_type()
    if fsdp is None:
        return
    for m in module.modules():
        if isinstance(m, fsdp) and not _keeps_gathered([m]):
            m.unshard()


def _keeps_gathered(sharded: list[nn.Module]) -> bool:
    """Every FSDP2 group around the layer keeps its parameters gathered after the forward."""
    for m in sharded:
        state = getattr(m, "_get_fsdp_state", None)
        group = getattr(state(), "_fsdp_param_group", None) if state is not None else None
        if group is None or group.post_forward_mesh_info is not None:
            return False
    return True


def check_outer_hooks(path: str) -> None:
    """At a planned layer's training forward: saved-tensor hooks already active come from outside the layer (a
    checkpoint or offload around it): the region's hooks would hide its tensors from them, or they re-run it."""
    if torch._C._autograd._top_saved_tensors_default_hooks(False) is not None:
        raise PlanMismatchError(
            f"layer {path!r} runs inside saved-tensor hooks set outside it (a checkpoint around it: "
            "torch.utils.checkpoint, checkpoint_wrapper, the composable checkpoint(), or activation offloading "
            "such as save_on_cpu): the plan's recomputation and that mechanism cannot both handle the layer. "
            "Remove it from the planned layers")


def inner_message(path: str, op: str, how: str) -> str:
    return (f"layer {path!r}: {how} ({op}): another activation checkpointing runs inside the layer "
            "(torch.utils.checkpoint, Hugging Face's gradient checkpointing, ...) and the plan would not apply. "
            "Turn it off for the planned layers: the plan does the recomputation")


def compiled() -> bool:
    """A planned layer runs under torch.compile: traced by dynamo, or run eagerly from a compiled frame (a graph
    break at the layer)."""
    if torch.compiler.is_compiling():
        return True
    frames = getattr(torch._C, "_dynamo", None)
    callback = frames.eval_frame.get_eval_frame_callback() if frames is not None else None
    return callback not in (None, False)


def compile_message(path: str) -> str:
    return (f"planned layer {path!r} runs under torch.compile: the plan's recomputation (saved-tensor hooks and a "
            "dispatch mode) is not traced by dynamo, so the compiled model would not run the plan as the eager one "
            "does (other dropout masks, wrong gradients where dynamo traces the hooks). Train the planned model "
            "without torch.compile, or compile only the layers the plan leaves alone")
