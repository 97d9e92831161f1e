"""The family readers (models/families): every config field is modelled, named as irrelevant, or refused by name;
sliding windows are priced by the window (hand arithmetic); biases and MoE layer patterns equal transformers' counts."""

import json
from pathlib import Path

import pytest

from lynx_planner.analytic import profile
from lynx_planner.io import InputError
from lynx_planner.models.catalog import HF_CONFIGS
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.models.hf_config import read_hf_config, spec_from_hf
from lynx_planner.schema import ParallelConfig
from conftest import lynx
from hf_families import CONFIGS as TINY

HW = HARDWARE["h100-80g-nvlink"]
CORE = "self_attn:_scaled_dot_product_flash_attention#0"
# Mistral 7B v0.1's published config.json
MISTRAL_7B = {"architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
              "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
              "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
              "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
              "sliding_window": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000}


def _hf_count(cfg: dict) -> int:
    import torch
    import transformers

    kw = {k: v for k, v in cfg.items() if k != "model_type"}
    config = transformers.AutoConfig.for_model(cfg["model_type"], **kw)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _core(spec, seq):
    prof = profile(spec, ParallelConfig(seq_len=seq, micro_batch_size=1), HW)
    layer = prof.blocks[prof.layers[1].block]
    return next(op for op in layer.ops if op.id == CORE)


def test_mistral_sliding_window_priced_by_window():
    s, w, b, heads, d = 8192, 4096, 1, 32, 128
    spec = spec_from_hf(MISTRAL_7B, "mistral-7b", "test")
    assert spec.layer_types == ("sliding",) * 32 and spec.window == 4096
    # by hand: the first 4096 queries see 1..4096 keys, the other 4096 queries 4096 keys each
    pairs = 4096 * 4097 // 2 + 4096 * 4096
    assert spec.kv_pairs(0, s) == pairs == 25_167_872
    full_pairs = s * (s + 1) // 2
    windowed, full = _core(spec, s), _core(spec_from_hf({**MISTRAL_7B, "sliding_window": None}, "m", "t"), s)
    assert full.flops == 2.0 * b * s * s * heads * 2 * d
    assert windowed.flops == pytest.approx(full.flops * pairs / full_pairs)
    assert windowed.fwd_s < 0.8 * full.fwd_s
    # a window at least the sequence is full attention
    assert _core(spec, 4096).flops == _core(spec_from_hf({**MISTRAL_7B, "sliding_window": None}, "m", "t"), 4096).flops


def test_chunked_pairs_by_hand():
    spec = spec_from_hf({**MISTRAL_7B, "sliding_window": None}, "m", "t").model_copy(
        update={"layer_types": ("chunked",) * 32, "chunk": 3})
    assert spec.kv_pairs(0, 8) == 6 + 6 + 3  # chunks of 3, 3 and 2 tokens


def test_made_up_field_is_named(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**MISTRAL_7B, "moe_shortcut_ratio": 0.5}))
    with pytest.raises(InputError, match=rf"{path}.*'moe_shortcut_ratio'.*not modelled"):
        read_hf_config(str(path))
    r = lynx("profile", str(path), "-o", str(tmp_path / "p.json"))
    assert r.exit_code == 2 and "moe_shortcut_ratio" in r.output
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("field,value", [("attention_dropout", 0.1), ("hidden_act", "gelu")])
def test_unmodelled_values_refused(field, value):
    with pytest.raises(InputError, match=field):
        spec_from_hf({**MISTRAL_7B, field: value}, "m", "t")


def test_quantization_config_is_a_note(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**MISTRAL_7B, "quantization_config": {"quant_method": "fp8"}}))
    assert "quantization_config" in read_hf_config(str(path)).notes[0]
    r = lynx("profile", str(path), "-o", str(tmp_path / "p.json"))
    assert r.exit_code == 0 and "quantization_config" in r.output


@pytest.mark.parametrize("cfg", [
    {**HF_CONFIGS["llama3-8b"][1], "num_hidden_layers": 2, "attention_bias": True, "mlp_bias": True},
    {**HF_CONFIGS["qwen3-235b-a22b"][1], "num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [5]},
    {**HF_CONFIGS["qwen2.5-72b"][1], "num_hidden_layers": 4, "use_sliding_window": True, "sliding_window": 4096,
     "max_window_layers": 2},
    TINY["llama4_text"],  # dense layers (intermediate_size_mlp) between MoE ones (interleave_moe_layer_step 2)
], ids=["llama-biases", "qwen3-moe-interleaved", "qwen2-window", "llama4-dense-and-moe"])
def test_params_equal_transformers(cfg):
    pytest.importorskip("transformers")
    spec = spec_from_hf(cfg, "x", "test")
    assert spec.params() == _hf_count(cfg)
    prof = profile(spec, ParallelConfig(seq_len=256, micro_batch_size=1), HW)
    assert prof.model.params == spec.params() == sum(l.params for l in prof.layers)


def test_qwen_moe_interleaving_layers():
    cfg = {**HF_CONFIGS["qwen3-235b-a22b"][1], "num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [5]}
    spec = spec_from_hf(cfg, "x", "test")
    assert [spec.is_moe_layer(i) for i in range(6)] == [False, True, False, True, False, False]


def test_qwen2_window_layers():
    cfg = {**HF_CONFIGS["qwen2.5-72b"][1], "num_hidden_layers": 4, "use_sliding_window": True,
           "sliding_window": 4096, "max_window_layers": 2}
    spec = spec_from_hf(cfg, "x", "test")
    assert spec.layer_types == ("full", "full", "sliding", "sliding")
    prof = profile(spec, ParallelConfig(seq_len=8192, micro_batch_size=1), HW)
    assert len({l.block for l in prof.layers[1:5]}) == 2  # full and sliding layers are two block types


def test_mtp_layer_on_the_last_stage():
    """DeepSeek-V3's published config has one multi-token-prediction module: its layer (norms, eh_proj, a decoder
    layer, the shared head and its loss) follows the decoder layers; transformers does not build it."""
    cfg = {**HF_CONFIGS["deepseek-v3"][1], "num_nextn_predict_layers": 1}
    spec = spec_from_hf(cfg, "dsv3", "test")
    base = spec_from_hf(HF_CONFIGS["deepseek-v3"][1], "dsv3", "test")
    h = 7168
    # by hand: enorm, hnorm, shared_head.norm (h each), eh_proj (2h x h), one MoE layer as the last
    assert spec.mtp_params() == 3 * h + 2 * h * h + base.layer_params(60)
    assert spec.params() == base.params() + spec.mtp_params()
    prof = profile(spec, ParallelConfig(seq_len=1024, micro_batch_size=1, pp=4, tp=8, dp=8, ep=8,
                                        num_microbatches=8), HW)
    names = [l.name for l in prof.layers]
    assert names[-4:] == ["model.layers.60", "model.layers.61", "model.norm", "lm_head"]
    mtp = prof.blocks[prof.layers[-3].block]
    ids = [op.id for op in mtp.ops]
    assert "eh_proj:mm#0" in ids and "shared_head.head:mm#0" in ids and "loss:mtp_cross_entropy#0" in ids
    assert any(i.startswith("mtp_block.mlp.experts:") for i in ids)
    with_mtp = profile(spec, ParallelConfig(seq_len=1024, micro_batch_size=1, tp=8, dp=8, ep=8), HW)
    without = profile(base, ParallelConfig(seq_len=1024, micro_batch_size=1, tp=8, dp=8, ep=8), HW)
    assert sum(l.params for l in with_mtp.layers) - sum(l.params for l in without.layers) > 0


def test_llama4_chunked_and_nope_layers():
    from pathlib import Path

    spec = read_hf_config(str(Path(__file__).parent / "data" / "hf" / "llama4-scout.json"))
    assert spec.layer_types[:4] == ("chunked", "chunked", "chunked", "full") and spec.nope_layers[:2] == (3, 7)
    assert spec.moe.shared_ffn == spec.moe.expert_ffn == 8192 and spec.ffn_hidden == 16384
    assert all(spec.is_moe_layer(i) for i in range(48))
    prof = profile(spec, ParallelConfig(seq_len=16384, micro_batch_size=1, tp=8), HW)
    chunked, nope = (prof.blocks[prof.layers[i].block] for i in (1, 4))
    core = {b.name: next(op for op in b.ops if op.id == CORE).flops for b in (chunked, nope)}
    # chunks of 8192 in 16384 tokens: two chunks' causal pairs against the full causal triangle, by hand
    share = 2 * (8192 * 8193 // 2) / (16384 * 16385 // 2)
    assert core[chunked.name] == pytest.approx(core[nope.name] * share)


def test_gemma3_layer_pattern_is_transformers():
    """Gemma 3 27B's published config gives sliding_window_pattern (6), not layer_types: every 6th layer is full
    attention, as transformers' Gemma3TextConfig derives its layer_types from the same config."""
    transformers = pytest.importorskip("transformers")
    path = Path(__file__).parent / "data" / "hf" / "gemma3-27b.json"
    text = json.loads(path.read_text())["text_config"]
    assert "layer_types" not in text
    kw = {k: v for k, v in text.items() if k not in ("model_type", "architectures", "torch_dtype")}
    hf = transformers.Gemma3TextConfig(**kw).layer_types
    spec = read_hf_config(str(path))
    assert spec.layer_types == tuple("full" if t == "full_attention" else "sliding" for t in hf)
    assert spec.layer_types[5] == "full" and spec.layer_types[0] == "sliding"
