"""Regions record a layer once per input signature and recompute exactly the plan's recompute set."""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

import pytest
import torch
from runtime_utils import Spec, Stage, inputs, plan_from_policies, tiny_profile
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import lynx_planner
from lynx_planner import policy
from lynx_planner.opid import op_name, split_id
from lynx_planner.runtime import runtime_of

N_LAYERS = 3
PROFILE = tiny_profile(N_LAYERS)
KEEP_FC1 = ("attn.qkv:addmm#0", "mlp.fc1:addmm#0")
KEEP_GELU_ATTN = ("mlp.act:gelu#0", "attn.core:_scaled_dot_product_flash_attention#0")
PLANS = {
    "full": [Spec("full", "grad_wait")] * N_LAYERS,
    "selective": [Spec("selective", "grad_wait")] * N_LAYERS,
    "mixed": [Spec("selective", "grad_wait", keep=KEEP_FC1), Spec("none"),
              Spec("selective", "grad_wait", keep=KEEP_GELU_ATTN)],
}


class _CountOps(TorchDispatchMode):
    """Ops that compute (not views, not as_strided), by op name."""

    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        schema = func._schema
        if not any(r.alias_info is not None for r in schema.returns) or schema.is_mutable:
            self.ops[op_name(func)] += 1
        return func(*args, **(kwargs or {}))


def _closures(plan) -> dict[int, tuple[str, ...]]:
    """Per checkpointed layer, the op ids of the policy's closure (for `full`: the ops up to the last saved tensor,
    as PyTorch's checkpoint stops early)."""
    out = {}
    for p in plan.stages[0].policies:
        if p.mode != "none":
            info = policy.analyse(PROFILE.blocks[p.block])
            out[p.layers[0]] = policy.closure(info, frozenset(p.keep) if p.mode == "selective" else frozenset())
    return out


@pytest.mark.parametrize("name", list(PLANS))
def test_recomputation_runs_exactly_the_policy_closure(name):
    plan = plan_from_policies(PROFILE, [PLANS[name]])
    model = copy.deepcopy(Stage(N_LAYERS))
    lynx_planner.apply_plan(model, plan)
    runtime = runtime_of(model)
    expected_ids = _closures(plan)
    expected = {i: Counter(split_id(op)[1] for op in ids) for i, ids in expected_ids.items()}
    for step in range(2):  # the recorded forward, then a steady-state one
        x = inputs(1, seed=step)[0]
        out = model(x)
        regions = {i: runtime._regions[(0, i)] for i in expected}
        assert all(r.recorded == (step == 0) for r in regions.values())
        for i in sorted(expected, reverse=True):  # top layer first, as trigger() releases them
            with _CountOps() as count:
                regions[i].recompute("grad_wait")
            assert count.ops == expected[i], f"layer {i}, step {step}: ran {dict(count.ops)}"
            assert sorted(regions[i].replayed_ops) == sorted(expected_ids[i])
        out.float().pow(2).sum().backward()


def test_a_new_shape_is_recorded_again():
    model = copy.deepcopy(Stage(1))
    lynx_planner.apply_plan(model, plan_from_policies(tiny_profile(1), [[Spec("full")]]))
    runtime = runtime_of(model)
    recorded = []
    for batch in (1, 1, 2, 2, 1):
        x = torch.randn(32, batch, 64, dtype=torch.bfloat16, requires_grad=True)
        out = model(x)
        recorded.append(runtime._regions[(0, 1)].recorded)
        out.float().sum().backward()
    assert recorded == [True, False, True, False, False]


class _DataDependent(nn.Module):
    """Which op runs depends on a value: a replay of the recorded ops would be wrong, so the region re-runs it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return torch.sin(y) if y.sum() > 0 else torch.cos(y)


def test_data_dependent_layer_recomputes_by_rerunning_its_forward():
    from lynx_planner.schema import LayerPolicy, StagePlan

    torch.manual_seed(0)
    base = nn.Sequential(_DataDependent())
    plan = plan_from_policies(tiny_profile(1), [[Spec("full")]])
    plan = plan.model_copy(update={"stages": [StagePlan(stage=0, layers=(0, 1), layer_names=["0"], policies=[
        LayerPolicy(layers=(0, 1), block="x", mode="full")])]})
    model = copy.deepcopy(base)
    lynx_planner.apply_plan(model, plan)
    xs = [torch.randn(4, 8) * s for s in (1.0, -1.0, 1.0, -1.0)]
    assert {bool(base[0].lin(x).sum() > 0) for x in xs} == {True, False}  # both branches run
    for x in xs:
        ref = copy.deepcopy(base)
        ref(x).pow(2).sum().backward()
        model.zero_grad()
        model(x).pow(2).sum().backward()
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), model.parameters()))


def test_hugging_face_gpt2_dropout_masks_recompute_as_planned():
    """HF GPT-2 (bf16, dropout 0.1): CPU dropout is empty_like + bernoulli_ + div_ + mul, so masks are values made
    in place; keeping all but the masks recomputes exactly the plan's ops, with bit-identical gradients."""
    pytest.importorskip("transformers")
    from lynx_planner.models.hardware import HARDWARE
    from lynx_planner.profiler import load_model_file, profile_model_file
    from lynx_planner.schema import ParallelConfig

    path = str(Path(__file__).resolve().parents[1] / "examples" / "hf_gpt2.py")
    sizes = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 128}
    profile = profile_model_file(path, parallel=ParallelConfig(seq_len=32, micro_batch_size=2),
                                 hardware=HARDWARE["a100-80g-nvlink"], progress=False)
    first = next(i for i, layer in enumerate(profile.layers) if layer.name == "transformer.h.0")
    info = policy.analyse(profile.blocks[profile.layers[first].block])
    keep = tuple(u for u in info.units if "dropout" not in u)
    plan = plan_from_policies(profile, [[Spec("selective", "grad_wait", keep=keep)] * 2], first_layer=first)
    torch.manual_seed(0)
    model, batch = load_model_file(path, batch_size=2, seq_len=32, **sizes)
    model = model.to(torch.bfloat16).train()
    planned = copy.deepcopy(model)
    lynx_planner.apply_plan(planned, plan)
    runtime = runtime_of(planned)
    recompute = set(plan.stages[0].policies[0].recompute)
    assert any("bernoulli_" in op for op in recompute)
    for step in range(2):
        for m in (model, planned):
            m.zero_grad()
            torch.manual_seed(step)
            out = m(*batch).logits.float().pow(2).mean()
            regions = list(runtime._regions.values()) if m is planned else []
            out.backward()
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), planned.parameters()))
        assert len(regions) == 2
        for region in regions:
            assert region.recorded == (step == 0)
            assert set(region.replayed_ops) == recompute


class _AllReduceThenRelu(nn.Module):
    """relu saves its output, not the all-reduced tensor it reads: replaying relu needs the collective's output."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        import torch.distributed as dist
        import torch.distributed._functional_collectives as funcol

        y = funcol.all_reduce(self.fc(x), "sum", dist.group.WORLD)
        return torch.relu(y) * 2


def test_collective_output_is_captured_not_repeated(tmp_path):
    import torch.distributed as dist

    from lynx_planner.schema import LayerPolicy, StagePlan

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        base = nn.Sequential(_AllReduceThenRelu())
        plan = plan_from_policies(tiny_profile(1), [[Spec("full")]])
        plan = plan.model_copy(update={"stages": [StagePlan(stage=0, layers=(0, 1), layer_names=["0"], policies=[
            LayerPolicy(layers=(0, 1), block="x", mode="full")])]})
        model = copy.deepcopy(base)
        lynx_planner.apply_plan(model, plan)
        runtime = runtime_of(model)
        for step in range(2):
            x = torch.randn(4, 8)
            ref = copy.deepcopy(base)
            out = ref(x)
            with _CountOps() as plain:
                out.pow(2).sum().backward()
            model.zero_grad()
            out = model(x)
            region = runtime._regions[(0, 0)]
            with _CountOps() as count:
                out.pow(2).sum().backward()
            assert region.replayed_ops == [":relu#0"]
            assert region.recorded  # collective outputs are captured by recording every forward
            assert count.ops["all_reduce"] == plain.ops["all_reduce"] == 1  # all_reduce's own backward only
            assert all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), model.parameters()))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("args,kwargs,flat_path", [
    ((torch.ones(2), 3, 0.5, None, torch.float32), {}, True),  # already flat: no pytree walk
    ((torch.ones(2), [torch.zeros(1), 2]), {}, False),  # a list argument (cat, index)
    ((torch.ones(2), torch.Size([2, 1])), {}, False),
    ((torch.ones(2),), {"dim": 0, "out": torch.zeros(2)}, False),  # keywords
])
def test_recorded_arguments_flatten_and_rebuild_as_pytree_does(args, kwargs, flat_path):
    """The recorder's fast path (keep._flatten) gives pytree's leaves, and the replay rebuilds the recorded call."""
    from torch.utils._pytree import tree_flatten, tree_unflatten

    from lynx_planner.runtime import keep

    leaves, structure = tree_flatten((args, kwargs))
    flat, spec = keep._flatten(args, kwargs)
    assert (spec is None) == flat_path
    assert len(flat) == len(leaves) and all(a is b for a, b in zip(flat, leaves))
    rebuilt, expected = keep._unflatten(flat, spec), tree_unflatten(leaves, structure)  # (pytree makes a Size a tuple)
    assert type(rebuilt[0]) is tuple and type(rebuilt[1]) is dict
    again, again_structure = tree_flatten(rebuilt)
    assert again_structure == tree_flatten(expected)[1] and all(a is b for a, b in zip(again, leaves))
