"""Expert parallelism: validation, memory sharded over EP (and expert-DP for the distributed optimizer), the
all-to-all dispatch/combine ops and their links, tune's EP search; config.json and model JSON as MODEL."""

import json

import pytest
from pydantic import ValidationError

from lynx_planner.analytic import profile
from lynx_planner.analytic.ops import bytes_per_param
from lynx_planner.build import build_profile, model_spec
from lynx_planner.io import InputError
from lynx_planner.models.catalog import HF_CONFIGS, MODELS
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.models.spec import ModelSpec
from lynx_planner.schema import ParallelConfig
from lynx_planner import tune
from conftest import lynx

HW = HARDWARE["h100-80g-nvlink"]
MIX = MODELS["mixtral-8x7b"]


def _par(**kw):
    return ParallelConfig(**{"seq_len": 1024, "dp": 8, **kw})


def test_ep_must_divide_dp_and_experts():
    with pytest.raises(ValidationError, match="ep"):
        ParallelConfig(dp=6, ep=4)
    with pytest.raises(ValueError, match="divide the model's 8 experts"):
        profile(MIX, ParallelConfig(dp=16, ep=16), HW)
    with pytest.raises(ValueError, match="no experts"):
        profile(MODELS["llama3-8b"], ParallelConfig(dp=2, ep=2), HW)


def test_ep_default_leaves_profile_json_unchanged():
    assert "ep" not in ParallelConfig().model_dump(mode="json")
    assert ParallelConfig(dp=2, ep=2).model_dump(mode="json")["ep"] == 2


@pytest.mark.parametrize("distopt", [False, True])
def test_expert_memory_sharded_over_ep(distopt):
    p1 = profile(MIX, _par(distributed_optimizer=distopt), HW)
    p4 = profile(MIX, _par(ep=4, distributed_optimizer=distopt), HW)
    spec = MIX
    routed = spec.moe_params()[0]
    l1, l4 = p1.layers[1], p4.layers[1]
    assert l1.params - l4.params == routed - routed // 4
    dense = l4.params - routed // 4
    expert_dp = _par(dp=2, distributed_optimizer=distopt)  # dp / ep
    assert l4.static_bytes == int(dense * bytes_per_param(p4.parallel)) + int(routed // 4 * bytes_per_param(expert_dp))


def test_all_to_all_ops_and_links():
    p1 = profile(MIX, _par(), HW)
    assert not any("ep_" in op.id for op in p1.blocks["MixtralDecoderLayer"].ops)
    intra = {op.id: op for op in profile(MIX, _par(ep=8), HW).blocks["MixtralDecoderLayer"].ops}
    d, c = intra["mlp.experts:ep_dispatch#0"], intra["mlp.experts:ep_combine#0"]
    assert d.kind == c.kind == "collective" and d.fwd_s > 0 and d.bwd_s > 0 and c.bwd_s > 0
    tokens = 1024 * MIX.moe.top_k
    assert d.out_bytes == 2 * tokens * MIX.hidden
    # the grouped GEMM reads (and saves) the dispatched tokens, the weighting reads the combined ones
    assert "mlp.experts:ep_dispatch#0" in intra["mlp.experts:_grouped_mm#0"].saves
    assert "mlp.experts:ep_combine#0" in intra["mlp.experts:mul#1"].inputs
    # tp 2 x ep 8 spans 16 GPUs: 4 of a rank's 7 peers are off its node, over the 8x slower inter-node link
    inter = {op.id: op for op in profile(MIX, _par(ep=8, tp=2), HW).blocks["MixtralDecoderLayer"].ops}
    assert inter["mlp.experts:ep_dispatch#0"].fwd_s > 3 * d.fwd_s


def test_expert_gemms_do_not_shrink_with_ep():
    """Balanced routing: each EP rank's experts get tokens x top_k rows whatever EP is."""
    ops1 = {op.id: op for op in profile(MIX, _par(), HW).blocks["MixtralDecoderLayer"].ops}
    ops8 = {op.id: op for op in profile(MIX, _par(ep=8), HW).blocks["MixtralDecoderLayer"].ops}
    assert ops1["mlp.experts:_grouped_mm#0"].flops == ops8["mlp.experts:_grouped_mm#0"].flops > 0


def test_deepseek_dense_first_layers_are_their_own_block():
    p = profile(MODELS["deepseek-v3"], ParallelConfig(seq_len=512, tp=8, dp=8, ep=8), HW)
    blocks = [l.block for l in p.layers[1:-2]]
    assert blocks[:3] == ["DeepseekV3DecoderLayer"] * 3 and set(blocks[3:]) == {"DeepseekV3DecoderLayer_2"}
    assert not any(op.id.startswith("mlp.experts") for op in p.blocks["DeepseekV3DecoderLayer"].ops)


def test_tune_searches_ep_for_moe_only():
    lays = tune.layouts(16, HW, 64, 32, 8, 1024, experts=8)
    assert {l.ep for l in lays} == {1, 2, 4, 8}
    assert all(l.dp % l.ep == 0 and 8 % l.ep == 0 for l in lays)
    assert {l.ep for l in tune.layouts(16, HW, 64, 32, 8, 1024, experts=8, ep=2)} == {2}
    assert {l.ep for l in tune.layouts(16, HW, 64, 32, 8, 1024)} == {1}
    assert tune.model_experts("mixtral-8x7b") == 8 and tune.model_experts("llama3-8b") == 0


def test_model_json_and_config_json_as_model(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(HF_CONFIGS["mixtral-8x7b"][1]))
    mine = tmp_path / "my-moe.json"
    spec = MIX.model_copy(update={"name": "my-moe", "num_layers": 4})
    mine.write_text(spec.model_dump_json())
    assert model_spec(str(cfg)).params() == MIX.params()
    assert model_spec(str(mine)) == spec
    p = build_profile(str(mine), _par(ep=2), HW)
    assert p.model.name == "my-moe" and len(p.layers) == 4 + 3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "family": "llama", "hidden": 64}))
    with pytest.raises(InputError, match=r"bad.json.*num_layers"):
        model_spec(str(bad))


def test_cli_config_json_bad_field_exit_2(tmp_path):
    cfg = dict(HF_CONFIGS["llama3-8b"][1])
    del cfg["intermediate_size"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    res = lynx("profile", str(path), "-o", str(tmp_path / "p.json"))
    assert res.exit_code == 2 and "intermediate_size" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "p.json").exists()


def test_cli_schema_model():
    res = lynx("schema", "model")
    assert res.exit_code == 0 and "kv_lora_rank" in res.output and ModelSpec.__name__ in res.output


def test_ep_all_to_all_priced_by_traffic_share():
    """EP 16 at TP 1 over two 8-GPU nodes: 7 of a rank's 15 peers share its node. The dispatch costs 7/15 of the
    all-intra-node price plus 8/15 of the all-inter-node one (hand arithmetic from the hardware's links)."""
    hw = HARDWARE["h100-80g-nvlink"]
    assert hw.gpus_per_node == 8
    spec = MODELS["deepseek-v3"].model_copy(update={"num_layers": 5})
    par = ParallelConfig(seq_len=2048, dp=16, ep=16)
    ops = {op.id: op for op in profile(spec, par, hw).blocks["DeepseekV3DecoderLayer_2"].ops}
    d = ops["mlp.experts:ep_dispatch#0"]
    nbytes = 2 * 2048 * spec.moe.top_k * spec.hidden  # bf16 tokens x top_k copies
    sent = nbytes * 15 / 16
    all_intra = sent / hw.intra_node_bus_bytes_per_s + hw.intra_node_latency_s
    all_inter = sent / hw.inter_node_bus_bytes_per_s + hw.inter_node_latency_s
    assert d.fwd_s == pytest.approx(7 / 15 * all_intra + 8 / 15 * all_inter, rel=1e-9)
    assert all_intra < d.fwd_s < all_inter
    # inside one node (EP 8): the intra-node price alone
    d8 = {op.id: op for op in profile(spec, _par(seq_len=2048, ep=8), hw).blocks["DeepseekV3DecoderLayer_2"].ops}
    sent8 = nbytes * 7 / 8
    assert d8["mlp.experts:ep_dispatch#0"].fwd_s == pytest.approx(
        sent8 / hw.intra_node_bus_bytes_per_s + hw.intra_node_latency_s, rel=1e-9)
