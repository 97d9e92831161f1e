"""apply_plan on one stage in one process: exact gradients, one recomputation per region, kept bytes = the plan's."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from runtime_utils import (
    LiveBytes,
    Spec,
    Stage,
    inputs,
    plan_from_policies,
    predicted_kept_bytes,
    tiny_profile,
)

import lynx_planner
from lynx_planner.runtime import PlanMismatchError, runtime_of

N_LAYERS, N_MB = 4, 2
PROFILE = tiny_profile(N_LAYERS)
BASE = Stage(N_LAYERS)

PLANS = {
    "none": [Spec("none")] * N_LAYERS,
    "full": [Spec("full")] * N_LAYERS,
    "selective": [Spec("selective")] * N_LAYERS,
    "mixed": [Spec("none"), Spec("full"), Spec("selective"),
              Spec("selective", keep=("attn.qkv:addmm#0", "mlp.fc1:addmm#0"))],
    "early": [Spec("full", "layer_above"), Spec("selective", "prev_forward"), Spec("full", "grad_wait"),
              Spec("selective", "layer_above")],  # the top layer's layer_above is its grad_wait
}
EXPECTED_TRIGGERS = {"early": ["layer_above", "prev_forward", "grad_wait", "grad_wait"]}


def run(plan=None, autocast: bool = False, model: torch.nn.Module = BASE):
    """All forwards, then per micro-batch: release its early recomputations, backward (as a pipeline stage would)."""
    model = copy.deepcopy(model)
    if plan is not None:
        lynx_planner.apply_plan(model, plan)
    runtime = runtime_of(model) if plan is not None else None
    xs = inputs(N_MB, dtype=next(model.parameters()).dtype)
    torch.manual_seed(1234)
    with LiveBytes() as mem:
        outs = []
        for mb, x in enumerate(xs):
            if runtime:
                runtime.micro_batch = mb
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                outs.append(model(x))
        live = mem.live - mem.bytes_of(outs)
    for mb, out in enumerate(outs):
        if runtime:
            runtime.trigger(mb, "prev_forward")
            runtime.trigger(mb, "grad_wait")
        out.float().pow(2).sum().backward()
    grads = [p.grad for p in model.parameters()] + [x.grad for x in xs]
    return grads, live, runtime


REFERENCE = run()


@pytest.mark.parametrize("name", list(PLANS))
def test_plan_gives_exact_gradients_one_recomputation_and_planned_bytes(name):
    plan = plan_from_policies(PROFILE, [PLANS[name]])
    grads, live, runtime = run(plan)

    assert all(torch.equal(a, b) for a, b in zip(grads, REFERENCE[0]))
    checkpointed = [p.layers[0] for p in plan.stages[0].policies if p.mode != "none"]
    for mb in range(N_MB):
        done = runtime.recomputations(mb)
        assert sorted(done) == checkpointed
        assert all(len(triggers) == 1 for triggers in done.values())
        if name in EXPECTED_TRIGGERS:
            assert [done[i][0] for i in checkpointed] == EXPECTED_TRIGGERS[name]
    # the stage input is created outside the tracker; every layer's kept bytes count their input
    predicted = predicted_kept_bytes(PROFILE, plan.stages[0], N_MB) - N_MB * PROFILE.blocks["gpt_layer"].input_bytes
    assert live == pytest.approx(predicted, rel=0.02)


def test_autocast_state_is_replayed():
    fp32 = Stage(N_LAYERS, dtype=torch.float32)
    reference, _, _ = run(autocast=True, model=fp32)
    grads, _, _ = run(plan_from_policies(PROFILE, [PLANS["early"]]), autocast=True, model=fp32)
    assert all(torch.equal(a, b) for a, b in zip(grads, reference))


def test_no_grad_forward_runs_plain():
    model = copy.deepcopy(BASE)
    lynx_planner.apply_plan(model, plan_from_policies(PROFILE, [PLANS["full"]]))
    with torch.no_grad():
        out = model(inputs(1)[0])
    assert not out.requires_grad and not runtime_of(model).log


def test_plan_file_and_stage_selection(tmp_path):
    plan = plan_from_policies(PROFILE, [PLANS["full"][:2], PLANS["selective"][:2]])
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    stage1 = copy.deepcopy(BASE)
    assert lynx_planner.apply_plan(stage1, str(path), stage=1) is stage1
    assert [layer.path for layer in runtime_of(stage1).layers] == ["layers.2", "layers.3"]
    with pytest.raises(PlanMismatchError, match="2 pipeline stages: pass stage="):
        lynx_planner.apply_plan(copy.deepcopy(BASE), plan)
    with pytest.raises(PlanMismatchError, match="stage 5 is out of range"):
        lynx_planner.apply_plan(copy.deepcopy(BASE), plan, stage=5)


def test_missing_module_path_is_reported():
    plan = plan_from_policies(tiny_profile(6), [[Spec("full")] * 6])
    with pytest.raises(PlanMismatchError, match="no submodule 'layers.4'"):
        lynx_planner.apply_plan(copy.deepcopy(BASE), plan)


def test_applying_twice_is_refused():
    model = copy.deepcopy(BASE)
    plan = plan_from_policies(PROFILE, [PLANS["full"]])
    lynx_planner.apply_plan(model, plan)
    with pytest.raises(PlanMismatchError, match="already applied"):
        lynx_planner.apply_plan(model, plan)


def test_a_planned_model_is_freed_when_dropped():
    """The runtime's registry holds neither the model nor its runtime: a planned model dropped after training is
    collected with its parameters and gradients (each planned model leaked, seen on an H100 as GiB per model)."""
    import gc
    import weakref

    model = copy.deepcopy(BASE)
    lynx_planner.apply_plan(model, plan_from_policies(PROFILE, [PLANS["selective"]]))
    model(inputs(1)[0]).float().pow(2).sum().backward()
    dropped, runtime = weakref.ref(model), weakref.ref(runtime_of(model))
    del model
    gc.collect()
    assert dropped() is None and runtime() is None


def test_the_recording_step_leaves_no_cycle_holding_activations():
    """The first forward of a planned layer records its program; nothing of it may wait for Python's cyclic
    collector (a recorder <-> pack-hook cycle held every kept tensor after backward: 1.1 GiB on an H100). With the
    collector off, only the gradients outlive the step."""
    import gc

    model = copy.deepcopy(BASE)
    lynx_planner.apply_plan(model, plan_from_policies(PROFILE, [PLANS["selective"]]))
    x = inputs(1)[0]
    gc.collect()
    gc.disable()
    try:
        with LiveBytes() as probe:
            model(x).float().pow(2).sum().backward()
        grads = [p.grad for p in model.parameters()] + [x.grad]
        assert probe.live == probe.bytes_of(grads) > 0
    finally:
        gc.enable()


def test_unknown_op_id_fails_at_first_forward():
    plan = plan_from_policies(PROFILE, [PLANS["selective"]])
    plan.stages[0].policies[1].keep.append("mlp.fc3:addmm#0")
    model = copy.deepcopy(BASE)
    lynx_planner.apply_plan(model, plan)  # op ids are only known once the layer runs
    with pytest.raises(PlanMismatchError, match=r"layer 2 \('layers.1'\).*mlp.fc3:addmm#0"):
        model(inputs(1)[0])


def test_import_stays_light():
    code = "import sys, lynx_planner; assert 'torch' not in sys.modules; lynx_planner.apply_plan"
    subprocess.run([sys.executable, "-c", code], check=True)
