"""Where plans meet other training code (docs/composition.md): a module used at several places is a layer per use;
other activation checkpointing on a planned layer is refused; autocast with shared weights; FSDP2 with early
placements; torch.compile; MoE routing that leaves experts empty."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from models.moe import PlainMoE, route_to_first  # noqa: E402
from models.moe import lynx_model as moe_model  # noqa: E402
from zoo_models import lynx_model  # noqa: E402

from lynx_planner import apply_plan, solvers  # noqa: E402
from lynx_planner.models.hardware import HARDWARE  # noqa: E402
from lynx_planner.profiler import profile_model_file  # noqa: E402
from lynx_planner.runtime import PlanMismatchError, dry_run, runtime_of  # noqa: E402
from lynx_planner.schema import ParallelConfig  # noqa: E402

TESTS = Path(__file__).resolve().parent
ZOO, SHARED = str(TESTS / "zoo_models.py"), str(TESTS / "models" / "shared_layers.py")
HW = HARDWARE["a100-80g-nvlink"]


def profile(path: str, autocast: str | None = None, **overrides):
    return profile_model_file(path, parallel=ParallelConfig(), hardware=HW, overrides=overrides, autocast=autocast,
                              dtype="fp32" if autocast else None, progress=False, warn=lambda m: None)


@pytest.fixture(scope="module")
def llama():
    """A tiny HF Llama's profile and a plan recomputing every layer (on demand)."""
    prof = profile(ZOO, name="llama")
    return prof, solvers.plan(prof, "p.json", "0" * 64, "full", 1 << 60)


def train_step(model, inputs):
    out = model(*inputs)
    (out.logits if hasattr(out, "logits") else out).float().sum().backward()


# a module used at several places --------------------------------------------------------------------------------
def test_a_module_called_twice_is_a_layer_per_use():
    prof = profile(SHARED)
    assert [layer.name for layer in prof.layers] == ["embed", "layers.0", "layers.1", "layers.0#1", "norm", "head"]
    assert [layer.params > 0 for layer in prof.layers][1:4] == [True, True, False]  # weights counted once
    albert = profile(ZOO, name="albert")
    names = [layer.name for layer in albert.layers]
    assert "albert.encoder.albert_layer_groups.0" in names and "albert.encoder.albert_layer_groups.0#1" in names


def test_each_use_runs_its_own_policy():
    """Use 0 of the shared block and block B recompute (full), use 1 keeps everything: the log shows
    recomputations at layers 1 and 2 only; gradients are the unplanned model's."""
    from runtime_utils import Spec, layer_policy

    from lynx_planner import policy

    prof = profile(SHARED)
    plan = solvers.plan(prof, "p.json", "0" * 64, "full", 1 << 60)
    modes = ["none", "full", "full", "none", "none", "none"]
    plan.stages[0].policies = [layer_policy(policy.analyse(prof.blocks[layer.block]), i, Spec(mode))
                               for i, (layer, mode) in enumerate(zip(prof.layers, modes))]
    reference, inputs = lynx_model("shared_layers")
    planned = copy.deepcopy(reference)
    apply_plan(planned, plan)
    for model in (reference, planned):
        torch.manual_seed(1)
        train_step(model, inputs)
    assert runtime_of(planned).recomputations(0) == {1: ["on_demand"], 2: ["on_demand"]}  # once each, not at 3
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(reference.parameters(), planned.parameters()))


def test_uses_of_one_module_in_two_stages_are_refused():
    prof = profile(SHARED)
    plan = solvers.plan(prof, "p.json", "0" * 64, "full", 1 << 60)
    plan.stages[0].layer_names[3] = "layers.0#2"
    with pytest.raises(PlanMismatchError, match=r"layers.0, layers.0#2 are one module"):
        apply_plan(lynx_model("shared_layers")[0], plan)


# other activation checkpointing on a planned layer ---------------------------------------------------------------
def _hf(reentrant):
    return lambda m: m.gradient_checkpointing_enable({"use_reentrant": reentrant})


def _wrapper(m):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    apply_activation_checkpointing(m, check_fn=lambda s: isinstance(s, LlamaDecoderLayer))


def _inner(reentrant):
    def prep(m):
        mlp = m.model.layers[0].mlp
        forward = mlp.forward
        mlp.forward = lambda x: torch.utils.checkpoint.checkpoint(forward, x, use_reentrant=reentrant)
    return prep


def _composable(m):
    from torch.distributed._composable import checkpoint

    checkpoint(m.model.layers[0])


CHECKPOINTING = {  # name: (set up before apply_plan, set up after it, what the refusal says)
    "hf-reentrant-before": (_hf(True), None, "Hugging Face gradient checkpointing is on"),
    "hf-before": (_hf(False), None, "Hugging Face gradient checkpointing is on"),
    "hf-reentrant-after": (None, _hf(True), "Hugging Face gradient checkpointing is on"),
    "hf-after": (None, _hf(False), "Hugging Face gradient checkpointing is on"),
    "checkpoint_wrapper-before": (_wrapper, None, "wrapped by torch's checkpoint_wrapper"),
    "checkpoint_wrapper-after": (None, _wrapper, "saved-tensor hooks set outside it"),
    "composable-checkpoint": (_composable, None, "saved-tensor hooks set outside it"),
    "inner-checkpoint": (_inner(False), None, "other saved-tensor hooks are active inside it"),
    "inner-checkpoint-reentrant": (_inner(True), None, "GEMM on a trainable parameter runs with autograd off"),
}


@pytest.mark.parametrize("case", list(CHECKPOINTING))
def test_other_checkpointing_is_refused(llama, case):
    """Each would run the layer under its own checkpoint, the plan's recomputations silently not happening."""
    before, after, message = CHECKPOINTING[case]
    torch.manual_seed(0)
    model, inputs = lynx_model("llama")
    model.train()
    with pytest.raises(PlanMismatchError, match=message):
        if before:
            before(model)
        apply_plan(model, llama[1])
        if after:
            after(model)
        train_step(model, inputs)


def test_without_other_checkpointing_the_plan_runs(llama):
    model, inputs = lynx_model("llama")
    apply_plan(model.train(), llama[1])
    train_step(model, inputs)
    planned = [i for p in llama[1].stages[0].policies if p.mode != "none" for i in range(*p.layers)]
    assert sorted(runtime_of(model).recomputations(0)) == planned


# autocast with shared weights ----------------------------------------------------------------------------------
def test_autocast_with_a_shared_mlp_applies(tmp_path):
    """Autocast caches the bf16 copy of a weight: the second layer using the shared MLP never casts it. The plan
    applies (dry run), and gradients are the unplanned model's."""
    from lynx_planner.io import dumps, file_sha256

    prof = profile(SHARED, autocast="bf16", shared_mlp=True)
    (tmp_path / "p.json").write_text(dumps(prof))
    plan = solvers.plan(prof, str(tmp_path / "p.json"), file_sha256(tmp_path / "p.json"), "full", 1 << 60)
    (tmp_path / "plan.json").write_text(dumps(plan))
    dry_run(str(tmp_path / "plan.json"), SHARED)
    from models.shared_layers import lynx_model as shared_model

    reference, ids = shared_model(shared_mlp=True)
    planned = copy.deepcopy(reference)
    apply_plan(planned, plan)
    for model in (reference, planned):
        torch.manual_seed(1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(ids)
        out.float().sum().backward()
    assert runtime_of(planned).recomputations(0)  # the plan did recompute
    grads = [(a.grad, b.grad) for a, b in zip(reference.parameters(), planned.parameters())]
    assert all(a is not None for a, _ in grads) and all(torch.equal(a, b) for a, b in grads)


def test_missing_casts_are_named_as_casts(llama):
    """A plan naming casts the layer does not run says so, not 'was the plan made from a profile of this model?'."""
    plan = llama[1].model_copy(deep=True)
    next(p for p in plan.stages[0].policies if p.mode == "full").recompute.append("mlp.up_proj:_to_copy#0")
    model, inputs = lynx_model("llama")
    apply_plan(model.train(), plan)
    with pytest.raises(PlanMismatchError, match="all casts: the layer runs in another precision"):
        train_step(model, inputs)


# MoE routing ----------------------------------------------------------------------------------------------------
MOE = str(TESTS / "models" / "moe.py")


@pytest.fixture(scope="module")
def moe_plans():
    """Per MoE model: its selective and full plans (profiled on a batch that routes to every expert)."""
    out = {}
    for name in ("plain", "mixtral", "qwen2_moe"):
        prof = profile(MOE, name=name)
        out[name] = {algo: solvers.plan(prof, "p.json", "0" * 64, algo, 1 << 60) for algo in ("selective", "full")}
    return out


@pytest.mark.parametrize("name", ["plain", "mixtral", "qwen2_moe"])
@pytest.mark.parametrize("algo", ["selective", "full"])
@pytest.mark.parametrize("routing", ["as profiled", "two experts take every token"])
def test_plans_hold_for_any_routing(moe_plans, name, algo, routing):
    """Training batches route differently from the profiled one: experts left empty (their ops never run) and one
    overloaded. The plan applies, every planned layer recomputes, gradients are the unplanned model's."""
    reference, inputs = moe_model(name)
    if routing != "as profiled":
        route_to_first(reference)
    planned = copy.deepcopy(reference)
    plan = moe_plans[name][algo]
    apply_plan(planned.train(), plan)
    for step in range(2):  # the second step runs the steady state (its ops may differ from the recorded ones)
        for model in (reference, planned):
            model.zero_grad()
            torch.manual_seed(step)
            train_step(model, inputs)
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(reference.parameters(), planned.parameters())
                   if a.grad is not None)
    recomputing = [i for p in plan.stages[0].policies if p.mode != "none" for i in range(*p.layers)]
    assert sorted(runtime_of(planned).recomputations(0)) == recomputing


@pytest.mark.parametrize("name", ["plain", "mixtral", "qwen2_moe"])
def test_routed_layers_recomputed_in_full_record_once(moe_plans, name):
    """After its first forward, a routed layer recomputed in full runs without recording its ops, whatever the
    routing (recording every forward made a step 3x the simulated one, docs/composition.md): it drops what the
    recorded rule drops and its recomputation re-runs the forward; gradients are the unplanned model's."""
    reference, inputs = moe_model(name)
    planned = copy.deepcopy(reference)
    apply_plan(planned.train(), moe_plans[name]["full"])
    runtime = runtime_of(planned)
    seen = []
    for step in range(3):
        if step == 1:  # another routing than the recorded forward's
            route_to_first(reference)
            route_to_first(planned)
        if step == 2:  # the same routing, recorded again: the recorded rule's drops
            for layer in runtime.layers:
                if layer.scope is not None:
                    layer.scope.programs.clear()
        for model in (reference, planned):
            model.zero_grad()
            torch.manual_seed(step)
            out = model(*inputs)
            if model is planned:
                seen.append({k: (r.recorded, len(r._missing)) for k, r in runtime._regions.items()})
            (out.logits if hasattr(out, "logits") else out).float().sum().backward()
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(reference.parameters(), planned.parameters())
                   if a.grad is not None)
    assert seen[0] and all(recorded for recorded, _ in seen[0].values())
    assert not any(recorded for recorded, _ in seen[1].values())
    assert all(recorded for recorded, _ in seen[2].values())
    assert {k: n for k, (_, n) in seen[1].items()} == {k: n for k, (_, n) in seen[2].items()}
    assert all(n > 0 for _, n in seen[1].values())
    assert sorted(runtime.recomputations(0)) == sorted(k[1] for k in seen[1])


def test_identical_experts_share_one_policy():
    from lynx_planner.runtime import routing

    layer = PlainMoE().layers[0]
    assert routing.routed_paths(layer) == ("moe", "moe.experts")
    assert routing.is_routed("moe.experts.2.0:addmm#0", ("moe", "moe.experts"))
    assert not routing.is_routed("attn:addmm#0", ("moe", "moe.experts"))
    keep = routing.shared_keep(frozenset({"moe.experts.1.0:addmm#0", "attn:bmm#0"}), layer)
    assert keep == {"attn:bmm#0", *(f"moe.experts.{e}.0:addmm#0" for e in range(4))}


# torch.compile ---------------------------------------------------------------------------------------------------
def test_torch_compile_around_early_placements_is_refused():
    """Compiled, a planned layer's recomputation runs inside its fused backward (runtime/compiled.py): an eager plan
    placing it earlier (layer_above) is refused at the first training forward, before any step runs
    (tests/test_runtime_compiled.py: what runs compiled)."""
    from runtime_utils import Spec, Stage, inputs, plan_from_policies, tiny_profile

    torch.manual_seed(0)
    model = Stage(2, dtype=torch.float32)
    planned = apply_plan(model, plan_from_policies(tiny_profile(2), [[Spec("full", at="layer_above"), Spec("none")]]))
    compiled = torch.compile(planned, backend="aot_eager")
    with pytest.raises(PlanMismatchError, match="runs under torch.compile with an early recomputation"):
        compiled(inputs(1, torch.float32)[0]).sum().backward()
    torch._dynamo.reset()
