"""Which stage of a plan to apply, its layers' modules and one policy per layer, with clear errors on mismatch.

Layers are found by `StagePlan.layer_names`, module paths resolved from the module given: the whole model, or a
stage module that keeps the model's paths for its layers (e.g. the model with other stages' layers removed, or a
module whose `layers` is a ModuleDict keyed by the original indices).
"""

from __future__ import annotations

from torch import nn

from ..opid import split_use
from ..schema import LayerPolicy, Plan, StagePlan
from .errors import PlanMismatchError


def select_stage(plan: Plan, stage: int | None) -> StagePlan:
    if stage is None:
        if len(plan.stages) != 1:
            raise PlanMismatchError(f"the plan has {len(plan.stages)} pipeline stages: pass stage= (0 to "
                                    f"{len(plan.stages) - 1}) for the stage this process runs")
        return plan.stages[0]
    for stage_plan in plan.stages:
        if stage_plan.stage == stage:
            return stage_plan
    raise PlanMismatchError(f"stage {stage} is out of range: the plan has stages "
                            f"{', '.join(str(s.stage) for s in plan.stages)}")


def layer_policies(stage_plan: StagePlan) -> list[LayerPolicy]:
    """The policy of each layer of the stage, in order; every layer must have exactly one."""
    first, end = stage_plan.layers
    if end <= first:
        raise PlanMismatchError(f"stage {stage_plan.stage}: empty layer range [{first}, {end})")
    if len(stage_plan.layer_names) != end - first:
        raise PlanMismatchError(f"stage {stage_plan.stage}: {len(stage_plan.layer_names)} layer_names for the "
                                f"{end - first} layers [{first}, {end}); re-run the planner with a profile that "
                                "names the layers' module paths")
    by_layer: list[LayerPolicy | None] = [None] * (end - first)
    for policy in stage_plan.policies:
        lo, hi = policy.layers
        if lo < first or hi > end or hi <= lo:
            raise PlanMismatchError(f"stage {stage_plan.stage}: policy for layers [{lo}, {hi}) is outside the "
                                    f"stage's layers [{first}, {end})")
        for i in range(lo, hi):
            if by_layer[i - first] is not None:
                raise PlanMismatchError(f"stage {stage_plan.stage}: layer {i} has two policies")
            by_layer[i - first] = policy
    missing = [first + i for i, p in enumerate(by_layer) if p is None]
    if missing:
        raise PlanMismatchError(f"stage {stage_plan.stage}: layers {missing[:5]} have no policy")
    return by_layer  # type: ignore[return-value]


def resolve_layers(module: nn.Module, stage_plan: StagePlan) -> list[nn.Module]:
    layers = []
    for path in stage_plan.layer_names:
        try:
            layers.append(module.get_submodule(split_use(path)[0]))  # 'layers.0#1': a module's second use
        except AttributeError:
            raise PlanMismatchError(
                f"stage {stage_plan.stage}: the module has no submodule {path!r}; pass the whole model or a stage "
                f"module that keeps the model's paths (it has e.g. {_child_paths(module)})") from None
    return layers


def _child_paths(module: nn.Module, limit: int = 5) -> str:
    names = [name for name, _ in module.named_modules() if name][:limit]
    return ", ".join(repr(n) for n in names) or "no submodules"
