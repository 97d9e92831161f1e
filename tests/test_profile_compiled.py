"""`lynx profile --compile` (profiler/compiled.py): blocks measured as torch.compile (inductor, CPU) runs them. The
compiled profile's bytes are what the compiled graphs save (measured on their saved tensors), its dropout masks are
compiled dropout's bool masks, and its elementwise ops take the fused loops' time."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lynx_planner import apply_plan, policy, solvers
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.profiler import profile_model_file
from lynx_planner.io import dumps
from lynx_planner.profiler.compiled import (compile_saves, dropout_masks, fused_times, recompute_times, saved_bytes,
                                            with_recompute_times)
from lynx_planner.schema import Block, Op, ParallelConfig

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS / "models"))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def profile(path: str, compile: bool, warnings: list[str] | None = None, **overrides):
    return profile_model_file(path, parallel=ParallelConfig(), hardware=HARDWARE["a100-80g-nvlink"], method="measure",
                              repeats=2, overrides=overrides, progress=False, compile=compile,
                              warn=(warnings.append if warnings is not None else lambda m: None))


def test_fused_times_share_the_compiled_remainder():
    """Hand arithmetic: GEMMs keep their times; the compiled block's 10 ms forward less the 6 ms GEMM leaves 4 ms for
    the two elementwise ops, shared 1:3 as their eager 2 ms and 6 ms; the backward alike (9 - 5 = 4 over 1 + 1)."""
    times = {"mm": (0.006, 0.005), "silu": (0.002, 0.001), "mul": (0.006, 0.001)}
    got = fused_times(times, {"mm"}, (0.010, 0.009))
    assert got["mm"] == (0.006, 0.005)
    assert got["silu"] == pytest.approx((0.001, 0.002)) and got["mul"] == pytest.approx((0.003, 0.002))
    # a compiled block faster than its GEMMs alone (noise): the elementwise ops cost nothing, never less
    assert fused_times(times, {"mm"}, (0.004, 0.004))["silu"] == (0.0, 0.0)


def _swiglu_block() -> Block:
    """A residual branch into a norm-like op, then SwiGLU, as eager autograd saves them (bytes by hand)."""
    def op(id, inputs, saves, out, fwd=0.001):
        return Op(id=id, fwd_s=fwd, bwd_s=fwd, out_bytes=out, inputs=inputs, saves=saves)
    return Block(name="b", input_bytes=40, output_bytes=40, ops=[
        op("o:mm#0", ["input"], ["input"], 40, 0.004),
        op(":add#0", ["input", "o:mm#0"], [], 40),        # the residual: read by the norm-like op's backward
        op("n:pow#0", [":add#0"], [":add#0"], 40),
        op("gate:mm#0", ["n:pow#0"], ["n:pow#0"], 100, 0.004),
        op("up:mm#0", ["n:pow#0"], ["n:pow#0"], 100, 0.004),
        op("act:silu#0", ["gate:mm#0"], ["gate:mm#0"], 100, 0.002),
        op(":mul#0", ["act:silu#0", "up:mm#0"], ["act:silu#0", "up:mm#0"], 100, 0.003),
        op("down:mm#0", [":mul#0"], [":mul#0"], 40, 0.004),
    ])


def test_compile_saves_stands_what_compile_recomputes_for_its_sources():
    """Eager autograd saves the residual, the norm's output, gate, silu, up and their product: 40 + 40 + 400 B, the
    input's 40 B aside. Compile saves the output projection instead of the residual (recomputing the add from it and
    the input) and recomputes silu from gate: in the compiled profile silu and the residual are no saved units, the
    output projection is one, and keeping everything keeps 40 + 40 + 300 B. A plan that recomputes the product then
    recomputes silu with it (3 + 2 ms), which the eager profile never needed."""
    block = _swiglu_block()
    eager = policy.analyse(block)
    assert set(eager.units) == {":add#0", "n:pow#0", "gate:mm#0", "act:silu#0", "up:mm#0", ":mul#0"}
    assert policy.cost(eager, policy.none_keep(eager), ()).kept_bytes == 40 + 40 + 40 + 400
    compiled = compile_saves(block, {"o:mm#0", "n:pow#0", "gate:mm#0", "up:mm#0", ":mul#0"})
    info = policy.analyse(compiled)
    assert set(info.units) == {"o:mm#0", "n:pow#0", "gate:mm#0", "up:mm#0", ":mul#0"}
    saves = {op.id: op.saves for op in compiled.ops}
    assert saves["n:pow#0"] == ["input", "o:mm#0"] and saves[":mul#0"] == ["gate:mm#0", "up:mm#0"]
    assert policy.cost(info, policy.none_keep(info), ()).kept_bytes == 40 + 40 + 40 + 300
    keep = frozenset(info.units) - {":mul#0"}
    recompute = policy.closure(info, keep)
    assert recompute == ("act:silu#0", ":mul#0")
    assert policy.cost(info, keep, recompute).recompute_s == pytest.approx(0.005)
    assert policy.closure(eager, frozenset(eager.units) - {":mul#0"}) == (":mul#0",)


def test_what_compile_saves_of_a_linear_layer_and_where_it_cannot_be_read():
    """A linear layer saves its input and weight, both arguments: no op of it is saved (aot_eager's partitioner read
    through the stamping region). The eager backend has no partitioner to read: None, and the block keeps eager
    autograd's units (eager_bases None)."""
    from lynx_planner.profiler.compiled import eager_bases, saved_ops

    layer, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    assert saved_ops(layer, (x,), {}, "aot_eager") == []
    torch._dynamo.reset()
    assert saved_ops(layer, (x,), {}, "eager") is None
    assert eager_bases(_swiglu_block(), None, set()) is None
    assert eager_bases(_swiglu_block(), ["act:silu#0", "up:mm#0"], set()) == {"act:silu#0", "up:mm#0"}
    assert eager_bases(_swiglu_block(), ["act:silu#0", None], set()) is None


def test_recompute_times_share_the_measured_recomputation():
    """Hand arithmetic: recomputing silu and mul adds 0.4 ms to the compiled backward, shared 1:3 as their eager
    forward times (the GEMM keeps its forward time as its recomputation's). A block's recompute_s prices its
    recomputation in policy.cost (0.1 + 0.3 ms, not the 5 ms forward) and is written only where given."""
    times = {"mm": (0.006, 0.005), "silu": (0.002, 0.001), "mul": (0.006, 0.001)}
    got = recompute_times(times, {"mm"}, 0.0004)
    assert got == pytest.approx({"silu": 0.0001, "mul": 0.0003})
    block = with_recompute_times(_swiglu_block(), {"act:silu#0": 0.0001, ":mul#0": 0.0003})
    info = policy.analyse(block)
    assert policy.cost(info, frozenset(), ("act:silu#0", ":mul#0")).recompute_s == pytest.approx(0.0004)
    assert policy.cost(info, frozenset(), ("gate:mm#0",)).recompute_s == pytest.approx(0.004)
    text = dumps(block)
    assert text.count('"recompute_s"') == 2 and '"recompute_s"' not in dumps(_swiglu_block())


def test_compiled_profile_of_a_tiny_hf_llama_saves_what_its_compiled_graph_saves():
    """A tiny HF Llama profiled with --compile: no block warns that its compiled graph saves other bytes than the
    profile predicts for keeping everything (what compile recomputes in its fused backward, the activation among
    them, is no saved unit); then a plan of it keeping the GEMMs' and attention's outputs, applied and
    each decoder layer compiled with inductor, saves the plan's kept bytes exactly (the block input aside, which the
    profile counts and the layer receives)."""
    from runtime_utils import Spec, layer_policy
    from zoo_models import lynx_model

    warnings: list[str] = []
    prof = profile(str(TESTS / "zoo_models.py"), True, warnings, name="llama")
    assert prof.compiled and not [w for w in warnings if "compiled saves" in w]
    eager = profile(str(TESTS / "zoo_models.py"), False, name="llama")
    block = prof.blocks["LlamaDecoderLayer"]
    # the GEMMs keep their eager times; the block's other ops take what the compiled block's time leaves them
    gemms = [op for op in block.ops if op.flops > 0]
    assert gemms and all(op.fwd_s > 0 for op in gemms)
    assert [op.out_bytes for op in block.ops] == [op.out_bytes for op in eager.blocks["LlamaDecoderLayer"].ops]
    # compile recomputes the activation in its fused backward (from the gate it saves): no saved unit compiled
    units = {name: set(policy.analyse(p.blocks["LlamaDecoderLayer"]).units) for name, p in (("c", prof), ("e", eager))}
    assert [u for u in units["e"] - units["c"] if ":silu#" in u]
    assert all(op.recompute_s is not None for op in block.ops if op.flops == 0 and not op.view)

    plan = solvers.plan(prof, "p.json", "0" * 64, "full", 1 << 60)
    assert plan.compiled  # a compiled profile's plans are for compiled training
    policies, costs = plan.stages[0].policies, []
    for i, p in enumerate(policies):
        if p.mode == "full":
            info = policy.analyse(prof.blocks[p.block])
            keep = tuple(o.id for o in info.block.ops if o.id.endswith(":mm#0") or "_attention#" in o.id)
            policies[i] = layer_policy(info, p.layers[0], Spec("selective", keep=keep)).model_copy(
                update={"layers": p.layers})
            costs += [policy.cost(info, frozenset(keep), tuple(policies[i].recompute)).kept_bytes] * (
                p.layers[1] - p.layers[0])
    model, inputs = lynx_model("llama")
    apply_plan(model.train(), plan)
    x = model.model.embed_tokens(inputs[0]).detach().requires_grad_()
    positions = torch.arange(inputs[0].shape[1])[None]
    rope = model.model.rotary_emb(x, positions)
    assert len(costs) == len(model.model.layers) == 2
    for layer, kept in zip(model.model.layers, costs):
        layer.compile()
        out = layer(x, position_embeddings=rope, attention_mask=None, position_ids=positions)
        assert saved_bytes(out, [x, *layer.parameters(), *rope]) + x.nbytes == kept


def test_compiled_profile_holds_bool_dropout_masks():
    """A Llama-style decoder with residual dropout: eagerly (CPU) dropout saves its scaled fp32 mask; compiled, a
    native_dropout saves a bool mask: 2 x 16 x 32 elements, 1,024 B, where the eager profile has 4,096 B. The compiled
    graph that keeps everything saves what the compiled profile predicts (no warning)."""
    warnings: list[str] = []
    prof = profile(str(TESTS / "models" / "drop_llama.py"), True, warnings)
    eager = profile(str(TESTS / "models" / "drop_llama.py"), False)
    assert not [w for w in warnings if "compiled saves" in w]
    block = next(b for b in prof.blocks.values() if dropout_masks(b))
    masks = dropout_masks(block)
    assert len(masks) == 2
    compiled_bytes = {op.id: op.out_bytes for op in block.ops}
    eager_bytes = {op.id: op.out_bytes for op in eager.blocks[block.name].ops}
    assert [compiled_bytes[m] for m in masks] == [2 * 16 * 32] * 2
    assert [eager_bytes[m] for m in masks] == [2 * 16 * 32 * 4] * 2


def test_compile_needs_measure_and_a_model_file(tmp_path):
    from typer.testing import CliRunner

    from lynx_planner.cli import app

    for args, message in ((["tests/models/drop_llama.py"], "--method measure"),
                          (["llama3-8b", "--method", "measure"], "--compile")):
        result = CliRunner().invoke(app, ["profile", *args, "-o", str(tmp_path / "p.json"), "--compile"])
        assert result.exit_code == 2 and message in result.output, result.output
        assert not (tmp_path / "p.json").exists()
