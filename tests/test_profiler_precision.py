"""The training precision is part of the profile and the plan; apply_plan refuses a model running in another one."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from lynx_planner import apply_plan, solvers
from lynx_planner.io import InputError
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.profiler import load_model_file, profile_model_file
from lynx_planner.profiler.loading import Precision
from lynx_planner.runtime.errors import PlanMismatchError
from lynx_planner.schema import ParallelConfig, Plan

MODEL = str(Path(__file__).resolve().parent / "models" / "own_llama.py")
SMALL = {"dim": 64, "layers": 2, "seq_len": 16}


@functools.lru_cache(maxsize=None)  # one profile per precision for the whole module (plans are not mutated)
def plan_for(dtype, autocast) -> Plan:
    prof = profile_model_file(MODEL, parallel=ParallelConfig(), hardware=HARDWARE["a100-80g-nvlink"],
                              overrides=SMALL, dtype=dtype, autocast=autocast, progress=False)
    full = solvers.solve(prof, "full", 1 << 60).evaluation.peak_bytes
    none = solvers.solve(prof, "none", 1 << 60).evaluation.peak_bytes
    plan = solvers.plan(prof, "p.json", "", "heu", (full + none) // 2)
    assert (plan.dtype, plan.autocast) == (prof.dtype, prof.autocast) == (dtype, autocast)
    assert any(p.mode != "none" for st in plan.stages for p in st.policies)
    return plan


def train_step(plan: Plan, dtype: str, autocast: str | None) -> None:
    model, inputs = load_model_file(MODEL, dtype=dtype, **SMALL)
    apply_plan(model.train(), plan)
    with Precision(dtype, autocast).forward_context("cpu"):
        out = model(*inputs)
    out.float().sum().backward()


@pytest.mark.parametrize("profiled,trained,message", [
    (("bf16", None), ("fp32", None), "has fp32 weights, but the plan was made for bf16 weights without autocast"),
    (("fp32", None), ("bf16", None), "has bf16 weights, but the plan was made for fp32 weights"),
    (("fp32", "bf16"), ("fp32", None), "runs without autocast, but the plan was made for a forward under bf16"),
    (("fp32", None), ("fp32", "bf16"), "runs under bf16 autocast, but the plan was made for a forward without"),
])
def test_apply_plan_refuses_another_precision(profiled, trained, message):
    plan = plan_for(*profiled)
    train_step(plan, *profiled)  # the precision profiled trains
    with pytest.raises(PlanMismatchError, match=message):
        train_step(plan, *trained)


def test_precision_options():
    with pytest.raises(InputError, match="cannot be combined with --dtype bf16"):
        Precision("bf16", "bf16")
    with pytest.raises(InputError, match="--dtype must be one of"):
        Precision("fp8")


def test_old_plans_without_precision_still_apply():
    plan = plan_for("fp32", None)
    old = Plan.model_validate({k: v for k, v in plan.model_dump().items() if k not in ("dtype", "autocast")})
    assert old.dtype is None
    train_step(old, "fp32", "bf16")  # unchecked: nothing recorded to compare with
    assert torch.get_default_dtype() == torch.float32
