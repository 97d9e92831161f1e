"""Megatron's built-in recomputation (full, selective, uniform, block) and export's nearest Megatron choice act on
every transformer layer, whatever its type: DeepSeek-V3's dense first layers as well as its MoE layers; never the
embedding, final norm or head."""

import pytest

from lynx_planner import export
from lynx_planner.analytic import profile
from lynx_planner.evaluate import evaluate, stage_plans
from lynx_planner.models.catalog import HF_CONFIGS
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.models.hf_config import spec_from_hf
from lynx_planner.schema import ParallelConfig
from lynx_planner.solvers import Problem, megatron
from lynx_planner.solvers.partition import even_bounds

HW = HARDWARE["h100-80g-nvlink"]


@pytest.fixture(scope="module")
def deepseek():
    # DeepSeek-V3's shape, 6 layers of which the first 3 dense (first_k_dense_replace), on 2 stages
    cfg = dict(HF_CONFIGS["deepseek-v3"][1], num_hidden_layers=6, n_routed_experts=16, hidden_size=1024,
               num_attention_heads=8, num_key_value_heads=8, intermediate_size=2048, vocab_size=4096)
    spec = spec_from_hf(cfg, "ds", "test")
    return profile(spec, ParallelConfig(seq_len=512, micro_batch_size=1, pp=2, num_microbatches=4), HW)


def _modes(prof, pols):
    return [(prof.layers[i].name, p.mode) for i, p in enumerate(pols)]


def test_transformer_layers_are_dense_and_moe(deepseek):
    names = [deepseek.layers[i].name for i in megatron.transformer_layers(deepseek)]
    assert names == [f"model.layers.{i}" for i in range(6)]
    assert len({deepseek.layers[i].block for i in megatron.transformer_layers(deepseek)}) == 2  # dense and MoE


@pytest.mark.parametrize("algo,mode", [("full", "full"), ("selective", "selective")])
def test_full_and_selective_recompute_every_layer_type(deepseek, algo, mode):
    strat = megatron.search(Problem(deepseek, 10**15), algo)
    modes = _modes(deepseek, strat.policies)
    assert [m for n, m in modes if n.startswith("model.layers.")] == [mode] * 6
    assert [m for n, m in modes if not n.startswith("model.layers.")] == ["none"] * 3


def test_block_counts_dense_layers(deepseek):
    bounds = even_bounds(deepseek, 2)
    pols = megatron._block(deepseek, bounds, 1)
    firsts = [n for n, m in _modes(deepseek, pols) if m == "full"]
    # the first transformer layer of each stage, the dense layer 0 on stage 0 included
    first_of_stage = [min(i for i in megatron.transformer_layers(deepseek) if bounds[s] <= i < bounds[s + 1])
                      for s in range(2)]
    assert firsts == [deepseek.layers[i].name for i in first_of_stage]
    assert firsts[0] == "model.layers.0"


def test_export_full_choice_recomputes_dense_layers(deepseek):
    bounds = even_bounds(deepseek, 2)
    choices = {c.name: c for c in export._megatron_choices(deepseek, bounds, 10**15)}
    full = megatron._block(deepseek, bounds, len(deepseek.layers))  # every transformer layer of every stage
    assert [p.mode for i, p in enumerate(full) if deepseek.layers[i].name.startswith("model.layers.")] == ["full"] * 6
    ev = evaluate(deepseek, stage_plans(deepseek, bounds, full), ideal=False)
    assert choices["full"].peak_memory_bytes == ev.peak_bytes
    # recomputing all six layers keeps less than leaving the dense ones alone (the old behaviour)
    moe_only = [p if deepseek.layers[i].block == deepseek.layers[-3].block else megatron.none_policy(deepseek, i)
                for i, p in enumerate(full)]
    assert ev.peak_bytes < evaluate(deepseek, stage_plans(deepseek, bounds, moe_only), ideal=False).peak_bytes
