"""Planned layers under torch.compile (runtime/compiled.py): the plan's keep decisions as selective-checkpoint
policies. Gradients equal the compiled unplanned model's (dropout masks included), the saved bytes of a compiled
planned block equal the plan's kept bytes (measured on the compiled graph's saved tensors), and what cannot run
compiled is refused. Most tests use the aot_eager backend (AOTAutograd's partitioner honours the tags, no C++ build);
one compiles with inductor."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

from lynx_planner import apply_plan, policy, solvers
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.profiler import profile_model_file
from lynx_planner.runtime import PlanMismatchError
from lynx_planner.schema import ParallelConfig

MODELS = Path(__file__).resolve().parent / "models"
sys.path.insert(0, str(MODELS))
import drop_llama  # noqa: E402

MODEL = str(MODELS / "drop_llama.py")


@pytest.fixture(scope="module")
def prof():
    return profile_model_file(MODEL, parallel=ParallelConfig(), hardware=HARDWARE["a100-80g-nvlink"], overrides={},
                              progress=False, warn=lambda m: None)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def heu_plan(prof, compiled=True):
    """HEU between no and full recomputation: blocks keep some ops (dropout masks among them) and recompute others."""
    none, full = (solvers.plan(prof, "p.json", "0" * 64, algo, 1 << 60) for algo in ("none", "full"))
    peak = [p.predicted.stages[0].peak_memory_bytes for p in (none, full)]
    plan = solvers.plan(prof, "p.json", "0" * 64, "heu", (peak[0] + peak[1]) // 2)
    assert {p.mode for p in plan.stages[0].policies} >= {"selective"}
    return plan.model_copy(update={"compiled": compiled})


def grads(model, backend, steps=2):
    compiled = torch.compile(model, backend=backend)
    _, inputs = drop_llama.lynx_model()
    for step in range(steps):
        model.zero_grad()
        torch.manual_seed(step)
        compiled(*inputs).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def saved_bytes(out: torch.Tensor, ignore: list[torch.Tensor]) -> int:
    """Bytes of the storages the autograd graph behind `out` holds for backward (a compiled graph's saved tensors are
    its CompiledFunctionBackward's), `ignore`'s storages excluded."""
    skip = {t.untyped_storage()._cdata for t in ignore}
    counted: dict[int, int] = {}
    todo, done = [out.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in done:
            continue
        done.add(node)
        for t in getattr(node, "saved_tensors", None) or ():
            if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in skip:
                counted[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
        todo.extend(f for f, _ in node.next_functions)
    return sum(counted.values())


def test_compiled_plan_has_the_unplanned_models_gradients(prof):
    """HEU's plan (kept dropout masks, recomputed norms and attention) and full recomputation (every dropout mask
    drawn again in backward): gradients equal the compiled unplanned model's, bit for bit under aot_eager."""
    reference, _ = drop_llama.lynx_model()
    expected = grads(copy.deepcopy(reference), "aot_eager")
    for plan in (heu_plan(prof), solvers.plan(prof, "p.json", "0" * 64, "full", 1 << 60)):
        planned = apply_plan(copy.deepcopy(reference), plan)
        got = grads(planned, "aot_eager")
        assert all(torch.equal(a, b) for a, b in zip(expected, got))
        torch._dynamo.reset()


def test_compiled_block_saves_the_plans_kept_bytes():
    """A tiny HF Llama, each block compiled on its own (as torchtitan compiles), planned to keep its GEMMs' and
    attention's outputs: the tensors the compiled graph saves, its input excluded, are the plan's kept bytes of the
    block (policy.cost) minus that input, which the profile counts. Without the rule that a kept op the plan also
    recomputes is not saved (its output autograd does not save; other recomputed ops read it), the compiled block
    kept 12,288 B more (the q, k and o projections)."""
    sys.path.insert(0, str(MODELS.parent))
    from runtime_utils import Spec, layer_policy
    from zoo_models import lynx_model

    prof = profile_model_file(str(MODELS.parent / "zoo_models.py"), parallel=ParallelConfig(),
                              hardware=HARDWARE["a100-80g-nvlink"], overrides={"name": "llama"}, progress=False,
                              warn=lambda m: None)
    plan = solvers.plan(prof, "p.json", "0" * 64, "full", 1 << 60)
    policies, costs = plan.stages[0].policies, []
    for i, p in enumerate(policies):
        if p.mode == "full":
            info = policy.analyse(prof.blocks[p.block])
            keep = tuple(o.id for o in info.block.ops if o.id.endswith(":mm#0") or "_attention#" in o.id)
            policies[i] = layer_policy(info, p.layers[0], Spec("selective", keep=keep)).model_copy(
                update={"layers": p.layers})
            cost = policy.cost(info, frozenset(keep), tuple(policies[i].recompute)).kept_bytes
            costs += [cost] * (p.layers[1] - p.layers[0])
    model, inputs = lynx_model("llama")
    apply_plan(model.train(), plan.model_copy(update={"compiled": True}))
    x = model.model.embed_tokens(inputs[0]).detach().requires_grad_()
    positions = torch.arange(inputs[0].shape[1])[None]
    rope = model.model.rotary_emb(x, positions)
    assert len(costs) == len(model.model.layers) == 2
    for block, kept in zip(model.model.layers, costs):
        block.compile(backend="aot_eager")
        out = block(x, position_embeddings=rope, attention_mask=None, position_ids=positions)
        out = out[0] if isinstance(out, tuple) else out
        assert saved_bytes(out, [x, *block.parameters(), *rope]) + x.nbytes == kept


def test_early_placement_under_compile_is_refused_unless_planned_for_it(prof):
    """A layer_above recomputation cannot run before the fused backward of its layer: an eager plan with one is
    refused at the first compiled forward; the same plan marked compiled runs."""
    plan = solvers.plan(prof, "p.json", "0" * 64, "full", 1 << 60)
    for p in plan.stages[0].policies:
        if p.mode != "none":
            p.at = "layer_above"
    model, inputs = drop_llama.lynx_model()
    apply_plan(model, plan)
    with pytest.raises(Exception, match="early recomputation") as info:
        torch.compile(model, backend="aot_eager")(*inputs).sum().backward()
    assert "lynx plan ... --compile" in str(info.value)


def test_ops_the_compiled_forward_never_runs_are_refused(prof):
    plan = heu_plan(prof)
    policy0 = next(p for p in plan.stages[0].policies if p.mode == "selective")
    policy0.recompute = [*policy0.recompute, "mlp.gate:addmm#7"]
    model, inputs = drop_llama.lynx_model()
    apply_plan(model, plan)
    with pytest.raises(Exception, match="never runs: mlp.gate:addmm#7"):
        torch.compile(model, backend="aot_eager")(*inputs).sum().backward()


def test_inductor_fuses_a_planned_block_with_the_unplanned_gradients(prof):
    """With inductor (C++ kernels on the CPU): equal to the compiled unplanned model's within compile's own
    tolerance (fusion reorders fp32 sums), dropout masks included (a differing mask moves a gradient by ~1e-2)."""
    plan = heu_plan(prof)
    reference, _ = drop_llama.lynx_model()
    expected = grads(copy.deepcopy(reference), "inductor", steps=1)
    torch._dynamo.reset()
    got = grads(apply_plan(copy.deepcopy(reference), plan), "inductor", steps=1)
    assert max((a - b).abs().max().item() for a, b in zip(expected, got)) < 1e-5


def test_a_plan_for_compile_recomputes_on_demand_and_check_knows_it(prof):
    """lynx plan --compile: HEU searches on-demand placements only, the plan records compiled: true and passes check;
    an early placement in it is a check violation. Plans made without it keep their bytes (no 'compiled' key)."""
    from lynx_planner.evaluate import check
    from lynx_planner.io import dumps

    none, full = (solvers.plan(prof, "p.json", "0" * 64, algo, 1 << 60) for algo in ("none", "full"))
    limit = (none.predicted.stages[0].peak_memory_bytes + full.predicted.stages[0].peak_memory_bytes) // 2
    eager = solvers.plan(prof, "p.json", "0" * 64, "heu", limit)
    plan = solvers.plan(prof, "p.json", "0" * 64, "heu", limit, compiled=True)
    assert plan.compiled and '"compiled": true' in dumps(plan) and '"compiled"' not in dumps(eager)
    assert {p.at for st in plan.stages for p in st.policies} == {"on_demand"}
    assert check(plan, prof) == []
    assert plan.predicted.iteration_time_s >= eager.predicted.iteration_time_s  # on demand is never faster
    bad = plan.model_copy(deep=True)
    next(p for p in bad.stages[0].policies if p.mode != "none").at = "layer_above"
    assert any("not on_demand" in problem for problem in check(bad, prof))


def test_dry_run_compiled(prof, tmp_path):
    """lynx apply --dry-run --compile: the planned model runs a compiled training step; an eager plan with an early
    placement is refused with the runtime's message."""
    from lynx_planner.io import dumps
    from lynx_planner.runtime import dry_run

    profile_path = tmp_path / "profile.json"
    profile_path.write_text(dumps(prof))
    from lynx_planner.io import file_sha256

    plan = solvers.plan(prof, str(profile_path), file_sha256(profile_path), "full", 1 << 60)
    (tmp_path / "plan.json").write_text(dumps(plan))
    rows = dry_run(str(tmp_path / "plan.json"), MODEL, compile="aot_eager")
    assert [r["module"] for r in rows if r["mode"] == "full"] == ["blocks.0", "blocks.1"]
    for p in plan.stages[0].policies:
        if p.mode != "none":
            p.at = "layer_above"
    (tmp_path / "early.json").write_text(dumps(plan))
    torch._dynamo.reset()
    with pytest.raises(PlanMismatchError, match="early recomputation"):
        dry_run(str(tmp_path / "early.json"), MODEL, compile="aot_eager")
