"""Tests for the three mutants tests/test_bite.py left alive (scripts/mutants.py): the runtime's saved-tensor shape
check, the profiler's copies of each layer's arguments, and the recorder's view detection for ops with several
outputs. Each checks a result against one derived independently (plain autograd, a hand-run of the layers, the
tensors' own sizes)."""

import copy

import torch
from torch import nn

# A kernel returning its input (aliased, as its schema says) and a new tensor, as fused kernels returning an output
# plus a statistic do. Defined once per process (a second definition of the namespace would raise).
_LIB = torch.library.Library("lynx_bite_more", "DEF")
_LIB.define("view_and_amax(Tensor(a) x) -> (Tensor(a), Tensor)")
_LIB.impl("view_and_amax", lambda x: (x.view(x.shape), x.amax(-1)), "CompositeExplicitAutograd")


def test_a_forward_saving_tensors_of_other_shapes_is_recomputed_by_a_rerun():
    """A layer whose branch (a flag set between steps, which no argument shows) saves as many tensors as recorded,
    but of other shapes, is not the recorded forward: the gradients must still equal plain autograd's (replaying
    the recorded ops would hand autograd tensors of the recorded shapes)."""
    from runtime_utils import Spec, plan_from_policies, tiny_profile

    import lynx_planner
    from lynx_planner.schema import LayerPolicy, StagePlan

    class MaybePooled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.pool = False

        def forward(self, x):
            y = self.lin(x)
            # both branches save the same tensors for addmm, then one for sin: [4, 8] or [8]
            return torch.sin(y.sum(0)) if self.pool else torch.sin(y)

    torch.manual_seed(0)
    base = nn.Sequential(MaybePooled())
    plan = plan_from_policies(tiny_profile(1), [[Spec("full")]])
    plan = plan.model_copy(update={"stages": [StagePlan(stage=0, layers=(0, 1), layer_names=["0"], policies=[
        LayerPolicy(layers=(0, 1), block="x", mode="full")])]})
    model = copy.deepcopy(base)
    lynx_planner.apply_plan(model, plan)
    for i in range(4):
        x = torch.randn(4, 8)
        grads = []
        for m in (copy.deepcopy(base), model):
            m[0].pool = i % 2 == 1
            m.zero_grad()
            m(x).pow(2).sum().backward()
            grads.append([p.grad.clone() for p in m.parameters()])
        assert all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(*grads)), i


def test_each_layer_is_captured_with_what_it_received_also_when_it_changes_its_input_in_place():
    """Layers that scale their input in place: each captured argument must be what the layer received (computed here
    by running the layers by hand on copies), not the tensor as the layer left it."""
    from lynx_planner.profiler.structure import capture_layers

    class ScalesInPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 6)

        def forward(self, x):
            x.mul_(2.0)  # in place on the tensor it received
            return self.lin(x)

    torch.manual_seed(0)
    model = nn.Sequential(ScalesInPlace(), ScalesInPlace(), ScalesInPlace())
    x = torch.randn(3, 6)
    expected = []
    with torch.no_grad():
        h = x.clone()
        for layer in model:
            expected.append(h.clone())
            h = layer.lin(2.0 * h)
    slots = capture_layers(model, (x.clone(),))
    assert [s.path for s in slots] == ["0", "1", "2"]
    for slot, want in zip(slots, expected):
        (got,) = slot.args
        assert torch.equal(got, want), slot.path
        assert not got.requires_grad  # a detached copy, not a piece of the traced graph


def test_an_op_returning_a_view_and_a_new_tensor_is_a_kernel_that_owns_the_new_one():
    """An op with two outputs, one aliasing its input and one new, reads and writes memory (its bytes: the input,
    the view, the new tensor) and is where its consumers' new input comes from; only ops whose outputs all alias
    inputs are views."""
    from lynx_planner.profiler.recorder import OpRecorder

    class Block(nn.Module):
        def forward(self, x):
            v, m = torch.ops.lynx_bite_more.view_and_amax(x)
            return v * m.unsqueeze(-1)

    x = torch.randn(4, 8)
    block = Block()
    rec = OpRecorder(block, x, [])
    with rec:
        block(x)
    rec.finish_forward()
    by_name = {r.name: r for r in rec.records}
    fused, mul = by_name["view_and_amax"], by_name["mul"]
    assert not fused.view
    assert fused.fwd.rw_bytes == 4 * (4 * 8) * 2 + 4 * 4  # fp32: input, its view, the [4] maxima
    assert fused.id in mul.inputs  # the maxima come from the fused op, not from the block's input


def test_experts_ending_the_block_are_all_found():
    """A block whose last op is the last expert's (no residual add after the experts): all 8 copies are a repeat,
    as they are with an op after them."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from moe_models import synthetic_moe_block

    from lynx_planner.solvers import repeats

    block = synthetic_moe_block(8)
    assert block.ops[-1].id == ":add#1" and block.ops[-2].id == "mlp.experts.7:index_add_#0"
    ending = block.model_copy(update={"ops": list(block.ops[:-1])})
    assert repeats.find(ending) == [(10, 6, 8)]  # 10 ops before the experts, 6 ops each, 8 experts
