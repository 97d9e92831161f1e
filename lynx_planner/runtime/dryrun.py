"""`dry_run`: check that a plan fits a model file and its profile, prove it applies by running the model's forward
and backward with it, and list what each layer will do."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils._pytree import tree_leaves

from ..io import InputError, file_sha256, find_beside, load_model
from ..schema import Plan, Profile
from .errors import PlanMismatchError
from .names import layer_paths
from .stages import layer_policies, resolve_layers


def _check_profile(plan: Plan, path: Path) -> Profile:
    digest = file_sha256(path)
    if digest != plan.profile_sha256:
        raise PlanMismatchError(f"{path}: the profile changed since the plan was made (sha256 {digest[:12]}..., "
                                f"the plan expects {plan.profile_sha256[:12]}...); re-run the planner")
    return load_model(path, Profile)


def _check_stages(plan: Plan, n_layers: int | None) -> None:
    if len(plan.stages) != plan.parallel.pp * plan.parallel.virtual_stages:
        raise PlanMismatchError(f"the plan has {len(plan.stages)} stages for pp = {plan.parallel.pp} x "
                                f"{plan.parallel.virtual_stages} virtual stages")
    end = 0
    for i, stage in enumerate(plan.stages):
        if stage.stage != i:
            raise PlanMismatchError(f"stages[{i}] is numbered {stage.stage}, expected {i}")
        if stage.layers[0] != end:
            raise PlanMismatchError(f"stage {i} starts at layer {stage.layers[0]}, expected {end} (stages must "
                                    "cover consecutive layers)")
        end = stage.layers[1]
    if n_layers is not None and end != n_layers:
        raise PlanMismatchError(f"the stages cover {end} layers, the profile has {n_layers}")


def _check_ops(profile: Profile, stage: int, index: int, block: str, ops: list[str]) -> None:
    if profile.layers[index].block != block:
        raise PlanMismatchError(f"stage {stage}, layer {index}: the plan says block {block!r}, the profile "
                                f"{profile.layers[index].block!r}")
    known = {op.id for op in profile.blocks[block].ops}
    unknown = [op for op in ops if op not in known]
    if unknown:
        raise PlanMismatchError(f"stage {stage}, layer {index}: ops not in block {block!r} of the profile: "
                                f"{', '.join(unknown[:4])}")


def _overrides(profile: Profile | None) -> dict:
    """The lynx_model() arguments the profile was made with (recorded as 'override.<name>')."""
    if profile is None:
        return {}
    return {k.removeprefix("override."): v for k, v in profile.model.config.items() if k.startswith("override.")}


def _device(profile: Profile | None) -> str:
    """The device the profile's ops were traced on (op ids can differ by device), where it is available."""
    device = str(profile.model.config.get("device", "cpu")) if profile is not None else "cpu"
    return device if device == "cpu" or torch.cuda.is_available() else "cpu"


def run_with_plan(plan: Plan, model: torch.nn.Module, inputs: tuple, model_path: str, device: str = "cpu",
                  compile: str | None = None) -> None:
    """One training forward and backward of the model file's model (built as profiled: same lynx_model() arguments
    and precision) with every stage of the plan applied: what the first training step would do. Raises
    PlanMismatchError when the plan does not apply, InputError when the model fails."""
    from ..profiler.loading import Precision
    from .apply import apply_plan

    model.train()
    for stage in plan.stages:
        apply_plan(model, plan, stage=stage.stage)
    try:
        with Precision(plan.dtype, plan.autocast).forward_context(device):
            out = (torch.compile(model, backend=compile) if compile else model)(*inputs)
        grads_of = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        if grads_of:
            torch.autograd.backward(grads_of, [torch.ones_like(t) for t in grads_of])
    except InputError:
        raise
    except Exception as e:
        inner = getattr(e, "inner_exception", None) or e.__cause__  # dynamo wraps what the compiled policy raises
        if compile and isinstance(inner, InputError):
            raise inner from None
        _raise_user_error(model_path, e)


def _raise_user_error(model_path: str, e: Exception) -> None:
    from ..profiler.loading import user_error

    err = user_error(Path(model_path).resolve(), e)
    raise InputError(f"{err} (running the model's forward and backward with the plan applied)") from None


def dry_run(plan_path: str, model_path: str, run: bool = True, compile: str | None = None) -> list[dict]:
    """One row per layer (stage, layer, module, mode, keep, recompute, when) after checking that the plan fits the
    model file (module paths), its stage layout and, when the plan's profile file exists, the profile (same sha256,
    layer blocks and names, op ids); then (`run`) one forward and backward of the model with the plan applied, in the
    plan's precision, so that a plan the dry run accepts does not fail at the first training step (`compile`: under
    torch.compile with that backend, the planned layers as selective-checkpoint regions: runtime/compiled.py). Raises
    PlanMismatchError (an InputError) on the first mismatch."""
    from ..profiler import load_model_file

    plan = load_model(plan_path, Plan)
    profile_path = find_beside(plan.profile_path, plan_path)
    profile = _check_profile(plan, profile_path) if profile_path is not None else None
    _check_stages(plan, len(profile.layers) if profile is not None else None)
    device = _device(profile)
    model, inputs = load_model_file(model_path, device=device, dtype=plan.dtype, **_overrides(profile))
    rows = []
    for stage in plan.stages:
        modes = [p.mode for p in layer_policies(stage)]
        resolve_layers(model, stage.stage, [p for p in layer_paths(model, plan, stage.layer_names, modes) if p])
        for offset, (name, policy) in enumerate(zip(stage.layer_names, layer_policies(stage))):
            index = stage.layers[0] + offset
            if profile is not None:
                if profile.layers[index].name != name:
                    raise PlanMismatchError(f"stage {stage.stage}, layer {index}: the plan names module {name!r}, "
                                            f"the profile {profile.layers[index].name!r}")
                _check_ops(profile, stage.stage, index, policy.block, [*policy.keep, *policy.recompute])
            rows.append({"stage": stage.stage, "layer": index, "module": name, "mode": policy.mode,
                         "keep": list(policy.keep), "recompute": list(policy.recompute), "when": policy.at}
                        | ({"offload": list(policy.offload), "reload": policy.reload} if policy.offload else {}))
    if run:
        run_with_plan(plan, model, inputs, model_path, device, compile)
    return rows
