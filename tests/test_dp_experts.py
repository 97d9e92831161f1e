"""The end of the iteration for MoE and tied models: routed experts' gradients are reduced, and their optimizer
step is taken, over their dp / ep replicas (expert data parallelism), as memory shards them; a tied word
embedding's gradients are all-reduced between the first and last stage in every family that ties it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from lynx_planner import costs, simulator  # noqa: E402
from lynx_planner.analytic import profile  # noqa: E402
from lynx_planner.evaluate import stage_plans  # noqa: E402
from lynx_planner.models.catalog import MODELS  # noqa: E402
from lynx_planner.models.hardware import HARDWARE  # noqa: E402
from lynx_planner.models.hf_config import spec_from_hf  # noqa: E402
from lynx_planner.schema import ParallelConfig  # noqa: E402
from lynx_planner.solvers.partition import even_bounds  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_families import CONFIGS  # noqa: E402

HW = HARDWARE["h100-80g-nvlink"]
MIX = MODELS["mixtral-8x7b"]


def _events(prof) -> dict[tuple[int, str], float]:
    """(stage, event name) -> seconds of the end-of-iteration events of a no-recomputation plan, split evenly."""
    from lynx_planner import evaluate as ev

    stages = stage_plans(prof, even_bounds(prof, prof.parallel.pp),
                         [ev.none_policy(prof, i) for i in range(len(prof.layers))])
    sim = simulator.simulate(prof, ev.runs_of(prof, stages), trace=True)
    return {(e["pid"], e["name"]): e["dur"] / 1e6 for e in sim.trace if e.get("tid") == "dp collective"}


def _mixtral(**par):
    return profile(MIX, ParallelConfig(**{"seq_len": 1024, "tp": 1, "pp": 2, "num_microbatches": 2,
                                          "optimizer_step": True, **par}), HW)


def _dense_only(prof):
    """The same profile with the routed experts' parameters taken out of every layer."""
    layers = [l.model_copy(update={"params": l.params - l.expert_params, "expert_params": 0}) for l in prof.layers]
    return prof.model_copy(update={"layers": layers})


@pytest.mark.parametrize("distopt", [False, True])
def test_experts_replicated_nowhere_else_need_no_gradient_reduction(distopt):
    """ep = dp: each expert lives on one rank of the DP group, so only the rest of the layer is reduced: the
    reduction of every layer takes what it takes without the experts."""
    prof = _mixtral(dp=8, ep=8, distributed_optimizer=distopt)
    assert any(l.expert_params for l in prof.layers)
    got, dense = _events(prof), _events(_dense_only(prof))
    grads = [k for k in got if k[1].startswith("DP grad")]
    assert grads and all(got[k] == pytest.approx(dense[k]) for k in grads)


def test_expert_gradients_move_over_their_dp_over_ep_replicas():
    """ep = dp / 2: the experts' gradients all-reduced over 2 ranks (tp x ep = 4 apart), the rest over dp."""
    prof = _mixtral(dp=8, ep=4)
    got, dense = _events(prof), _events(_dense_only(prof))
    layer = next(i for i, l in enumerate(prof.layers) if l.expert_params)
    e = prof.layers[layer].expert_params
    key = next(k for k in got if k[1] == f"DP grad L{layer}")
    by_hand = costs.all_reduce_s(4 * e, 2, costs.group_link(HW, 2, 4))
    assert got[key] - dense[key] == pytest.approx(by_hand)


def test_optimizer_step_time_follows_the_optimizer_state_memory_holds():
    """The Adam step reads and writes the optimizer state this rank holds. With the distributed optimizer a rank
    holds 1 / dp of the dense state and, of E / ep experts, 1 / (dp / ep) each: the same bytes at every EP size
    (memory's static bytes less the bf16 weight and fp32 gradient, 6 bytes a parameter, say so), hence the same
    step time."""
    steps, state = [], []
    for ep in (1, 2, 8):
        prof = _mixtral(dp=8, ep=ep, distributed_optimizer=True)
        steps.append(_events(prof)[(0, "optimizer step")])
        first = prof.layers[:even_bounds(prof, 2)[1]]
        state.append(sum(l.static_bytes - 6 * l.params for l in first))
    assert all(s == pytest.approx(state[0], rel=1e-6) for s in state)
    assert all(s == pytest.approx(steps[0], rel=1e-6) for s in steps)


def test_tied_embedding_gradients_are_all_reduced_in_hf_families():
    """Tied: the first and last stage's steps each add the all-reduce (2 ranks) of the word embedding's fp32
    gradients (vocab x hidden / tp); untied, the same layers and parameters, no such all-reduce."""
    def prof(tied):
        spec = spec_from_hf({**CONFIGS["llama"], "tie_word_embeddings": tied, "num_hidden_layers": 4}, "llama", "t")
        return profile(spec, ParallelConfig(seq_len=16, micro_batch_size=2, tp=2, pp=2, num_microbatches=2,
                                            optimizer_step=True), HW)

    tied, untied = _events(prof(True)), _events(prof(False))
    v, h = CONFIGS["llama"]["vocab_size"], CONFIGS["llama"]["hidden_size"]
    link = costs.link(HW, 2 * 1 * (2 - 1) + 1)  # first and last stage: tp x dp x (p - 1) ranks apart
    by_hand = costs.all_reduce_s(4 * v * h // 2, 2, link)
    for stage in (0, 1):
        assert tied[(stage, "optimizer step")] - untied[(stage, "optimizer step")] == pytest.approx(by_hand)
