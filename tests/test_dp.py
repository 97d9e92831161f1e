"""Data parallelism: the gradient reduction at the end of the iteration and the optimizer-state sharding, pinned
against hand computations."""

from __future__ import annotations

import pytest

from lynx_planner import evaluate as ev
from lynx_planner.analytic import gpt_profile, layer_params
from lynx_planner.models.catalog import MODELS
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.schema import Block, Layer, ModelInfo, Op, ParallelConfig, Profile

P = 3 * 10**9  # parameters per layer: 12e9 gradient bytes in fp32


def synthetic(dp: int, distributed_optimizer: bool = False, pp: int = 1, m: int = 2) -> Profile:
    """Two layers per stage of fwd 1.5 s, bwd 2.5 s; links of 4 GB/s in a node and 1 GB/s between nodes."""
    ops = [Op(id="a:mm#0", fwd_s=1.0, bwd_s=2.0, out_bytes=1000, inputs=["input"], saves=["input"]),
           Op(id="b:gelu#0", fwd_s=0.5, bwd_s=0.5, out_bytes=3000, inputs=["a:mm#0"], saves=["a:mm#0"])]
    hw = HARDWARE["a100-80g-nvlink"].model_copy(update={
        "inter_node_latency_s": 0.0, "intra_node_latency_s": 0.0, "intra_node_bus_bytes_per_s": 4e9,
        "inter_node_bus_bytes_per_s": 1e9, "interference": 1.0, "nics_per_node": None})  # one NIC's ring
    return Profile(model=ModelInfo(name="synthetic", source="test", params=0),
                   parallel=ParallelConfig(pp=pp, dp=dp, num_microbatches=m,
                                           distributed_optimizer=distributed_optimizer),
                   hardware=hw, blocks={"layer": Block(name="layer", input_bytes=100, output_bytes=0, ops=ops)},
                   layers=[Layer(block="layer", name=f"layers.{i}", params=P, static_bytes=0)
                           for i in range(2 * pp)])


def iteration(profile: Profile) -> float:
    n = len(profile.layers) // profile.parallel.pp
    bounds = [s * n for s in range(profile.parallel.pp + 1)]
    pols = [ev.none_policy(profile, i) for i in range(len(profile.layers))]
    return ev.evaluate(profile, ev.stage_plans(profile, bounds, pols)).predicted.iteration_time_s


def test_no_data_parallelism_costs_nothing():
    assert iteration(synthetic(1)) == 16.0  # 2 micro-batches x 2 layers x (1.5 + 2.5)


def test_all_reduce_overlaps_the_last_backward():
    # compute ends at 16; the top layer's gradients are ready at 16 - 2.5 = 13.5. Ring all-reduce over 2 ranks of
    # 12e9 bytes at 4 GB/s: 2 * 1/2 * 12e9 / 4e9 = 3 s. Top: 13.5 -> 16.5; bottom: 16.5 -> 19.5.
    assert iteration(synthetic(2)) == pytest.approx(19.5)


def test_distributed_optimizer_reduce_scatters_then_gathers_weights():
    # reduce-scatter 1/2 * 12e9 / 4e9 = 1.5 s per layer: top 13.5 -> 15, bottom 16 -> 17.5; then the bf16
    # weights (2 x 2 x 3e9 bytes) all-gathered: 1/2 * 12e9 / 4e9 = 1.5 s -> 19.
    assert iteration(synthetic(2, distributed_optimizer=True)) == pytest.approx(19.0)


def test_groups_beyond_a_node_use_the_inter_node_links():
    # tp 1 x dp 16 spans two 8-GPU nodes: 2 * 15/16 * 12e9 / 1e9 = 22.5 s per layer: 13.5 -> 36, 36 -> 58.5.
    assert iteration(synthetic(16)) == pytest.approx(58.5)


def test_each_stage_reduces_its_own_layers():
    # pp 2: stage 0's last backward ends last; its own two layers then add the same 0.5 + 3 s tail as above (the
    # top one's all-reduce starts 2.5 s early). Stage 1 finished its tail 5 s earlier (stage 0's last backward).
    base = iteration(synthetic(1, pp=2))
    assert iteration(synthetic(2, pp=2)) == pytest.approx(base + 3.5)


def test_distributed_optimizer_shards_optimizer_state():
    cfg, hw = MODELS["gpt-1.3b"], HARDWARE["a100-80g-nvlink"]
    for dp, sharded, per_param in ((1, False, 18), (8, False, 18), (8, True, 6 + 12 / 8), (64, True, 6 + 12 / 64)):
        par = ParallelConfig(tp=2, pp=2, dp=dp, num_microbatches=4, distributed_optimizer=sharded)
        prof = gpt_profile(cfg, par, hw)
        layer = next(l for l in prof.layers if l.block == "gpt_layer")
        assert layer.static_bytes == int(layer_params(cfg, par)["gpt_layer"] * per_param)
