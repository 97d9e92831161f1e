"""profile_model_file on the example GPT: structure, layers, static bytes, tensor parallelism, measurement."""

from pathlib import Path

import pytest

from lynx_planner import analytic, policy
from lynx_planner.models.catalog import GPTConfig
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.profiler import profile_model_file
from lynx_planner.schema import ParallelConfig

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "gpt_model.py")
H100 = HARDWARE["h100-80g-nvlink"]


def profile(**kw):
    par = ParallelConfig(seq_len=64, micro_batch_size=2, **kw.pop("par", {}))
    return profile_model_file(EXAMPLE, parallel=par, hardware=H100, progress=False, **kw)


def test_structure_and_layers():
    p = profile()
    assert [layer.name for layer in p.layers] == ["embed", "layers.0", "layers.1", "layers.2", "layers.3",
                                                   "norm", "head"]
    assert [layer.block for layer in p.layers][:2] == ["Embedding", "GPTBlock"]
    assert set(p.blocks) == {"Embedding", "GPTBlock", "LayerNorm", "Linear"}
    assert p.method == "analytic" and p.model.source == EXAMPLE and p.attention == "flash"
    assert sum(layer.params for layer in p.layers) == p.model.params
    assert all(layer.static_bytes == layer.params * 18 for layer in p.layers)
    for block in p.blocks.values():
        info = policy.analyse(block)
        assert policy.closure(info, policy.none_keep(info)) == ()
    gpt = p.blocks["GPTBlock"]
    assert all(op.fwd_s > 0 for op in gpt.ops) and sum(op.bwd_s for op in gpt.ops) > sum(op.fwd_s for op in gpt.ops)


@pytest.mark.parametrize("sp", [False, True])
def test_tensor_parallel_matches_analytic(sp):
    par = {"tp": 2, "sequence_parallel": sp}
    got = policy.analyse(profile(par=par, dtype="bf16").blocks["GPTBlock"])  # the analytic profile is bf16
    ref = policy.analyse(analytic.gpt_layer_block(GPTConfig("t", 4, 128, 4), ParallelConfig(
        seq_len=64, micro_batch_size=2, **par), H100, "flash", 0.0))
    assert [op.id for op in got.block.ops if op.kind == "collective"] == [
        op.id for op in ref.block.ops if op.kind == "collective"]
    assert got.units == ref.units
    for unit in ref.units:
        if "layer_norm" not in unit:
            assert got.unit_bytes[unit] == ref.unit_bytes[unit], unit
    assert got.block.input_bytes == ref.block.input_bytes


def test_tensor_parallel_params():
    full, split = profile(), profile(par={"tp": 2})
    layer, layer2 = full.layers[1], split.layers[1]
    h = 128
    assert layer.params - layer2.params == (3 * h * h + 3 * h + h * h + 8 * h * h + 4 * h) // 2


def test_measure_on_cpu():
    p = profile(method="measure")
    assert p.method == "measure"
    assert sum(op.fwd_s for op in p.blocks["GPTBlock"].ops) > 0
    assert sum(op.bwd_s for op in p.blocks["GPTBlock"].ops) > 0
