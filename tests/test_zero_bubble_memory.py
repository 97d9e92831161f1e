"""Zero bubble's memory as torch runs it (docs/zero-bubble-memory.md): what B holds until W, validate's predicted
bytes when a backward starts, and the last stage's output no longer holding its graph after its backward."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import small_profile

from lynx_planner import evaluate as ev
from lynx_planner import schedules, simulator, solvers, validate
from lynx_planner.profiler.memory import LiveBytes
from lynx_planner.runtime.pipelining import _drop_output_graph
from test_schedules import profile


def test_b_holds_the_gemm_and_norm_output_gradients_and_the_chunk_input_gradient_until_w():
    """torch's stage_backward_input keeps the output gradient of every op with a weight (GEMMs and norms) and sets the
    chunk's input gradient on its input until W; on chunk 0 its B does nothing (W runs the whole backward)."""
    prof = profile("zero-bubble", 1)  # one block: a:mm#0 (1000 B out), b:gelu#0 (3000 B), input 100 B
    block = prof.blocks["layer"]
    ops = [op.model_copy(update={"id": "b:native_layer_norm#0"}) if op.id == "b:gelu#0" else op for op in block.ops]
    normed = prof.model_copy(update={"blocks": {"layer": block.model_copy(update={"ops": ops})}})
    assert simulator.block_split(prof.blocks["layer"])[2] == 1000
    assert simulator.block_split(normed.blocks["layer"])[2] == 1000 + 3000
    pol = ev.none_policy(prof, 0)
    assert simulator.layer_run(prof, 1, pol, first=1).wgrad_bytes == 1000 + 100  # a chunk's lowest layer
    assert simulator.layer_run(prof, 1, pol, first=0).wgrad_bytes == 0  # chunk 0


def test_held_at_backward_walks_the_order_instead_of_adding_maxima():
    """Zero bubble, rank 1 of 2: F0 B0 F1 B1 W0 F2 B2 W1 ...; at most one graph awaits W while one micro-batch is in
    flight when a B starts (17 + 10), not the most in flight plus the most awaiting W (10 + 2 x 17)."""
    order = schedules.order("zero-bubble", 2, 1, 1, 4)
    assert validate.held_at_backward(order, {1: 10}, {1: 17}) == 17 + 10
    # 1F1B, rank 0 of 2: two micro-batches in flight at its first B
    assert validate.held_at_backward(schedules.order("1f1b", 2, 1, 0, 4), {0: 10}, {0: 0}) == 2 * 10
    # interleaved, rank 0 of 2, chunks 0 and 2: F0,0 F0,1 F2,0 F2,1 F0,2 B2,0 F0,3 B2,1 F2,2 B0,0 ...: the most is
    # at B0,0, chunk 0's four and chunk 2's one, not chunk 0's most (4) plus chunk 2's most (2, at B2,0)
    order = schedules.order("interleaved-1f1b", 2, 2, 0, 4)
    assert validate.held_at_backward(order, {0: 10, 2: 1}, {0: 0, 2: 0}) == 4 * 10 + 1


@pytest.mark.parametrize("schedule,v", [("zero-bubble", 1), ("1f1b", 1), ("interleaved-1f1b", 2)])
def test_predicted_held_at_backward_never_exceeds_the_predicted_peak(schedule, v):
    """Without recomputation, what a rank holds when a backward starts is one moment of its activation timeline: never
    above the simulated peak (the sum of maxima printed 175.7 MiB kept against a 126.1 MiB peak)."""
    prof = small_profile(tp=1, pp=2, m=4, layers=8)
    prof = prof.model_copy(update={"parallel": prof.parallel.model_copy(
        update={"schedule": schedule, "virtual_stages": v})})
    s = solvers.solve(prof, "none", 1 << 60)
    plan = ev.make_plan(prof, "p.json", "0" * 64, "none", 1 << 60, s.stages, s.solver, s.evaluation)
    for rank in range(2):
        held = validate.predicted_stage(prof, plan, rank).held_at_backward_bytes
        assert 0 < held <= plan.predicted.stages[rank].activation_bytes


def _graph_of_a_view(x):
    """A last stage's output that is a view (`.transpose`), with B-only saved tensors (exp saves its output)."""
    return (x * 2).exp().exp().transpose(0, 1)


def test_last_stage_output_view_no_longer_holds_its_graph_after_backward():
    x = torch.randn(64, 64, requires_grad=True)
    with LiveBytes([x]) as mem:
        out = _graph_of_a_view(x)
        stage = SimpleNamespace(is_last=True, output_chunks=[out])
        torch.autograd.grad(out.sum(), x, retain_graph=True)  # as B: the graph stays
        del out
        held = mem.live
        _drop_output_graph(stage, 0)
        assert stage.output_chunks[0].grad_fn is None
        assert mem.live == held - 64 * 64 * 4  # the first exp's output; the second's is the output: it stays
    assert torch.equal(stage.output_chunks[0], _graph_of_a_view(x).detach())


def test_other_stages_outputs_are_left_alone():
    x = torch.randn(4, 4, requires_grad=True)
    out = _graph_of_a_view(x)
    stage = SimpleNamespace(is_last=False, output_chunks=[out])
    _drop_output_graph(stage, 0)
    assert stage.output_chunks[0] is out
    _drop_output_graph(SimpleNamespace(is_last=True, output_chunks=[out]), 3)  # no such micro-batch: nothing


def test_the_stage_hooks_drop_the_output_graph_after_each_backward():
    """attach's backward hook runs the drop after the stage's own backward, for that micro-batch only."""
    from lynx_planner.runtime import pipelining
    from lynx_planner.schema import PlanParallel

    x = torch.randn(4, 4, requires_grad=True)
    outs = [_graph_of_a_view(x), _graph_of_a_view(x)]
    runtime = SimpleNamespace(parallel=PlanParallel(tp=1, pp=2, dp=1, num_microbatches=2, schedule="zero-bubble"),
                              action=None, micro_batch=None, trigger=lambda mb, at: None)
    stage = SimpleNamespace(num_stages=2, stage_index=1, is_last=True, output_chunks=outs,
                            forward_one_chunk=lambda *a, **k: None, get_bwd_recv_ops=lambda *a: [],
                            backward_one_chunk=lambda *a, **k: "grads")
    hooks = pipelining._StageHooks(runtime, stage)
    assert hooks.backward_one_chunk(0) == "grads"
    assert stage.output_chunks[0].grad_fn is None and stage.output_chunks[1].grad_fn is not None


def test_the_searches_budget_what_b_holds_until_w():
    """HEU's and OPT's stage models leave room for what each micro-batch awaiting W holds beside its graph (the
    simulator's count): without it they kept everything on the last rank, over the limit, and found no plan at 22-25
    GiB for this layout, where one needing 22.84 GiB exists."""
    from lynx_planner.analytic import gpt_profile
    from lynx_planner.models.catalog import MODELS
    from lynx_planner.models.hardware import HARDWARE
    from lynx_planner.schema import ParallelConfig

    par = ParallelConfig(tp=4, pp=4, num_microbatches=16, schedule="zero-bubble")
    prof = gpt_profile(MODELS["gpt-13b"], par, HARDWARE["a100-80g-nvlink"], "flash", 0.0)
    limit = 24 * 2**30
    assert solvers.solve(prof, "full", 1 << 62).evaluation.peak_bytes > limit  # full recomputation does not fit
    got = solvers.solve(prof, "heu", limit)
    assert got.evaluation.peak_bytes <= limit


def test_the_searches_count_the_graphs_held_at_one_backward_start():
    """The stage models count the micro-batches in flight and awaiting W at one moment, as the simulator holds them.
    Zero bubble p 4, m 8, rank 3: F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 ...: at B3 one in flight, three awaiting W; four
    await W only after B7, with none in flight. The sum of the two maxima (1 + 4) counted one graph twice, and the
    searches, thinking the last rank's plan over its budget, recomputed 1.5 ms per micro-batch where 0.5 ms do
    (`lynx bench --audit`: the llama3-8b zero-bubble cases beaten by 2.75%)."""
    assert [schedules.peak_graphs("zero-bubble", 4, 1, r, 8) for r in range(4)] == [(4, 0), (3, 1), (2, 2), (1, 3)]
    assert (schedules.in_flight("zero-bubble", 4, 1, 3, 8), schedules.awaiting_weight_pass("zero-bubble", 4, 1, 3, 8)) \
        == (1, 4)
    assert schedules.peak_graphs("1f1b", 4, 1, 0, 8) == (4, 0)  # a whole backward: the most in flight, none waits
    # every backward start of every rank holds at most the graphs peak_graphs counts, in the same walk validate uses
    for name, p, v, m in (("zero-bubble", 4, 1, 8), ("zero-bubble", 2, 2, 8), ("1f1b", 4, 1, 8)):
        for chunk in range(p * v):
            flying, waiting = schedules.peak_graphs(name, p, v, chunk, m)
            order = [x for x in schedules.order(name, p, v, chunk % p, m) if x[1] == chunk]
            # a graph in flight weighs 1, one awaiting W 1 + a hair (its recomputed tensors): the walk's most
            most = validate.held_at_backward(order, {chunk: 1000}, {chunk: 1001 if name == "zero-bubble" else 0})
            assert most == 1000 * flying + 1001 * waiting, (name, p, v, chunk)
