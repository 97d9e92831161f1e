"""Bad model descriptions refused at once (exit 2, nothing written), naming the file's own field: a config.json's
Hugging Face field (num_local_experts, not lynx's `experts`), a lynx model JSON's field; absurd sizes bounded."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from conftest import lynx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_families import CONFIGS  # noqa: E402


def _profile(tmp_path, cfg: dict, name: str = "config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    out = tmp_path / "p.json"
    t0 = time.process_time()
    r = lynx("profile", path, "-o", out)
    assert time.process_time() - t0 < 20  # refused before any building (10^9 layers never returned)
    assert r.exit_code == 2, r.output
    assert not out.exists()
    assert str(path) in r.output
    return r.output


@pytest.mark.parametrize("family,field,value,says", [
    ("llama", "num_hidden_layers", 10**9, "at most 1024"),
    ("llama", "num_hidden_layers", 10**5, "at most 1024"),
    ("llama", "vocab_size", 10**18, "at most"),
    ("llama", "intermediate_size", 10**30, "at most"),
    ("mixtral", "num_local_experts", 0, "at least 1"),
    ("qwen3_moe", "num_experts", 0, "at least 1"),
    ("deepseek_v3", "kv_lora_rank", 0, "at least 1"),
    ("mixtral", "num_experts_per_tok", 5, "exceeds 'num_local_experts'"),
    ("deepseek_v3", "num_experts_per_tok", 9, "exceeds 'n_routed_experts'"),
    ("llama", "mlp_bias", "yes", "true or false"),  # modelled (tests/test_families.py), but typed
    ("qwen3_moe", "decoder_sparse_step", 0, "at least 1"),
    ("llama", "made_up_field", 1, "not modelled"),  # never dropped silently
    # checks across fields, in the config's names (ModelSpec's own would say kv_heads, heads, moe.dense_layers)
    ("llama", "num_key_value_heads", 3, "(3) must divide 'num_attention_heads' (4)"),
    ("llama", "hidden_size", 66, "'num_attention_heads' (4) must divide 'hidden_size' (66)"),
    ("deepseek_v3", "first_k_dense_replace", 3, "(3) exceeds 'num_hidden_layers' (2)"),
    ("deepseek_v3", "n_group", 3, "(3) must divide the experts (4)"),  # transformers' view(-1, n_group, e // n_group)
    ("deepseek_v3", "topk_group", 2, "(2) exceeds 'n_group' (1)"),  # transformers' topk(k=topk_group) of n_group
])
def test_config_json_field_is_named(tmp_path, family, field, value, says):
    out = _profile(tmp_path, {**CONFIGS[family], field: value})
    assert f"'{field}'" in out and says in out
    lynx_names = ("experts:", "top_k", "num_layers", "kv_heads", "dense_layers", "heads (")
    assert not any(n in out for n in lynx_names), out  # lynx's names, not the file's


def test_lynx_model_json_sizes_are_bounded(tmp_path):
    spec = {"name": "x", "family": "llama", "num_layers": 10**9, "hidden": 64, "heads": 4, "ffn_hidden": 128,
            "vocab": 10**18}
    out = _profile(tmp_path, spec, "model.json")
    assert "num_layers" in out and "vocab" in out and "1024" in out


def test_model_spec_refuses_more_layers_than_it_can_build_at_once():
    """The bound is on ModelSpec itself, so a config, a model JSON and the catalog all meet it before anything is
    built (10^9 layers never returned, 10^5 took minutes and 1.7 GB)."""
    from pydantic import ValidationError

    from lynx_planner.models.spec import ModelSpec

    small = dict(name="x", family="llama", hidden=64, heads=4, ffn_hidden=128, vocab=128)
    assert ModelSpec(num_layers=1024, **small).num_layers == 1024  # Llama 3 405B has 126; the bound is far above
    with pytest.raises(ValidationError, match="1024"):
        ModelSpec(num_layers=1025, **small)
