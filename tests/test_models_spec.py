"""Model descriptions: catalog and config.json parameter counts equal transformers' for the same config; bad
config.json files are InputErrors naming the field."""

import json

import pytest

from lynx_planner.io import InputError
from lynx_planner.models.catalog import HF_CONFIGS, MODELS
from lynx_planner.models.hf_config import read_hf_config, spec_from_hf


def _hf_count(cfg: dict) -> int:
    import torch
    import transformers

    kw = {k: v for k, v in cfg.items() if k != "model_type"}
    # Kimi K2's model_type names a DeepSeek-V3 shape (transformers builds it as DeepseekV3ForCausalLM)
    config = transformers.AutoConfig.for_model({"kimi_k2": "deepseek_v3"}.get(cfg["model_type"], cfg["model_type"]),
                                               **kw)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", list(HF_CONFIGS))
def test_catalog_params_equal_transformers(name):
    pytest.importorskip("transformers")
    assert MODELS[name].params() == _hf_count(HF_CONFIGS[name][1])


def test_catalog_sources_and_gpt_unchanged():
    assert all(MODELS[n].source for n in MODELS)
    assert MODELS["gpt-13b"].params(2048) == 12_858_214_400  # Megatron's 13B: the formula of before


def test_config_json_file(tmp_path):
    cfg = dict(HF_CONFIGS["mixtral-8x7b"][1])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = read_hf_config(str(path))
    assert spec.moe.experts == 8 and spec.moe.top_k == 2 and spec.kv == 8
    assert spec.params() == MODELS["mixtral-8x7b"].params()


@pytest.mark.parametrize("change,field", [
    ({"model_type": "gpt_bigcode"}, "model_type"),
    ({"hidden_size": None}, "hidden_size"),
    ({"num_local_experts": "8"}, "num_local_experts"),
    ({"hidden_act": "gelu"}, "hidden_act"),
])
def test_bad_config_names_field(tmp_path, change, field):
    cfg = {k: v for k, v in HF_CONFIGS["mixtral-8x7b"][1].items()}
    for k, v in change.items():
        if v is None:
            del cfg[k]
        else:
            cfg[k] = v
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(InputError, match=rf"{path}.*{field}"):
        read_hf_config(str(path))


def test_gqa_must_divide():
    cfg = dict(HF_CONFIGS["llama3-8b"][1], num_key_value_heads=5)
    message = r"x.json: field 'num_key_value_heads' \(5\) must divide 'num_attention_heads'"  # the config's names
    with pytest.raises(InputError, match=message):
        spec_from_hf(cfg, "x", "x.json")
