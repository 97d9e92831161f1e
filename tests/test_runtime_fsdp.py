"""FSDP2 (`fully_shard` per layer, two gloo ranks on CPU) with plans: a grad_wait placement on layers whose
parameters FSDP2 frees after the forward is refused (before: a segfault in the early replay), by apply_plan when the
layers are sharded first and at the first training forward when they are sharded after; on_demand, layer_above (the
runtime all-gathers the layer's parameters first, as FSDP2's backward prefetch would) and early placements with
reshard_after_forward=False run with the unplanned model's gradients."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from runtime_utils import Spec, Stage, free_port, inputs, plan_from_policies, tiny_profile

from lynx_planner import apply_plan
from lynx_planner.runtime import PlanMismatchError, runtime_of

pytest.importorskip("torch.distributed.fsdp")

# case: (placement, shard before or after apply_plan, reshard_after_forward, expected outcome)
CASES = {
    "layer_above-sharded-first": ("layer_above", "before", True, "same grads"),  # gathered by the runtime first
    "layer_above-sharded-after": ("layer_above", "after", True, "same grads"),
    "grad_wait-sharded-first": ("grad_wait", "before", True, "refused"),
    "on_demand": ("on_demand", "before", True, "same grads"),
    "layer_above-kept-gathered": ("layer_above", "before", False, "same grads"),
}


def _grads(model) -> list[torch.Tensor]:
    return [p.grad.full_tensor() for p in model.parameters()]


def _run(case: str, mesh) -> str:
    from torch.distributed.fsdp import fully_shard

    at, order, reshard, _ = CASES[case]
    plan = plan_from_policies(tiny_profile(4), [[Spec("full", at)] * 4])
    x = inputs(1, torch.float32)[0]
    grads = []
    for planned in (False, True):
        torch.manual_seed(0)
        model = Stage(4, dtype=torch.float32)

        def shard(model=model):
            for layer in model.layers:
                fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
            fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        try:
            if order == "before" or not planned:
                shard()
            if planned:
                apply_plan(model, plan)
            if order == "after" and planned:
                shard()
            torch.manual_seed(1)
            model(x.detach().clone().requires_grad_()).pow(2).sum().backward()
            if planned and at == "layer_above":  # released early indeed, not run on demand
                triggers = runtime_of(model).recomputations()
                if not any("layer_above" in t for t in triggers.values()):
                    return f"not early: {triggers}"
        except PlanMismatchError as e:
            return "refused" if "sharded by FSDP2" in str(e) else f"other refusal: {e}"
        grads.append(_grads(model))
    return "same grads" if all(torch.equal(a, b) for a, b in zip(*grads)) else "different grads"


def _worker(rank: int, port: int, results: dict) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    try:
        mesh = init_device_mesh("cpu", (2,))
        for case in CASES:
            results[(case, rank)] = _run(case, mesh)
    finally:
        dist.destroy_process_group()


def test_fsdp2_early_placements_are_refused_and_the_rest_runs():
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(free_port(), results), nprocs=2, join=True)
    for case, (*_, expected) in CASES.items():
        assert [results[(case, r)] for r in range(2)] == [expected] * 2, case
