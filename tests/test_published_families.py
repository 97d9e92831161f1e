"""Published config.json files of each family (tests/data/hf/, written from the models' published configs): lynx's
parameter count equals transformers' for the same config (the model built on the meta device), and each goes through
profile, plan, check and export without error."""

import json
from pathlib import Path

import pytest

from lynx_planner.models.hf_config import read_hf_config
from conftest import lynx

DATA = Path(__file__).resolve().parent / "data" / "hf"
CONFIGS = sorted(p.name for p in DATA.glob("*.json"))
# the layout each runs on (the MoE models with expert parallelism, so that their experts fit)
LAYOUT = {"gemma3-27b.json": ["--pp", 2]}
MOE = ["--pp", 4, "--dp", 8, "--ep", 8]
LAYOUT |= {name: MOE for name in ("glm4.5-air.json", "deepseek-v2-lite.json", "gpt-oss-120b.json",
                                  "llama4-scout.json", "qwen3-next-80b.json")}
LAYOUT |= {name: ["--pp", 16, "--dp", 8, "--ep", 8] for name in ("kimi-k2.json", "deepseek-v3.json")}
LAYOUT["gpt-oss-120b.json"] = MOE + ["--distributed-optimizer"]  # torchtitan draws its EP ranks from FSDP
TP = {"qwen3-next-80b.json": 2}  # TP 8 elsewhere; Qwen3-Next has 2 key/value heads
# (config, target) that export today; the others are refused, each naming what the target cannot build (post-norms,
# tanh GeGLU, chunked attention in Megatron; torchtitan 0.3 has configs of a few shapes only)
EXPORTS = {(name, "megatron") for name in ("kimi-k2.json", "deepseek-v3.json", "deepseek-v2-lite.json",
                                           "glm4.5-air.json", "gpt-oss-120b.json", "phi3-mini-4k.json",
                                           "qwen3-next-80b.json")} \
    | {("gpt-oss-120b.json", "torchtitan")}
_NOT_CONFIG = ("_name_or_path", "architectures", "auto_map", "transformers_version", "torch_dtype",
               "quantization_config")


def _text(cfg: dict) -> dict:
    """The language model's config (the text part of a multimodal one), as transformers builds it for causal LM."""
    wrappers = {"gemma3": "gemma3_text", "llama4": "llama4_text"}
    if cfg["model_type"] in wrappers:
        return {**cfg["text_config"], "model_type": wrappers[cfg["model_type"]]}
    return cfg


def _hf_count(cfg: dict) -> int:
    import torch
    import transformers

    cfg = _text(cfg)
    kw = {k: v for k, v in cfg.items() if k != "model_type" and k not in _NOT_CONFIG}
    mt = {"kimi_k2": "deepseek_v3"}.get(cfg["model_type"], cfg["model_type"])
    config = transformers.AutoConfig.for_model(mt, **kw)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", CONFIGS)
def test_params_equal_transformers(name):
    pytest.importorskip("transformers")
    spec = read_hf_config(str(DATA / name))
    cfg = json.loads((DATA / name).read_text())
    mtp = spec.mtp_layers * spec.mtp_params()  # transformers builds no multi-token-prediction module
    assert spec.params() - mtp == _hf_count(cfg)


@pytest.mark.parametrize("name", CONFIGS)
def test_profile_plan_check_export(name, tmp_path):
    prof, plan = tmp_path / "p.json", tmp_path / "plan.json"
    r = lynx("profile", DATA / name, "-o", prof, "--tp", TP.get(name, 8), *LAYOUT.get(name, ["--pp", 4]), "--seq-len", 4096,
             "--num-microbatches", 8, "--hardware", "h100-80g-nvlink")
    assert r.exit_code == 0, r.output
    # HEU on the small dense ones; Megatron's selective recomputation (every layer type) on the large ones, to keep
    # the suite short (HEU takes seconds per large model); Qwen3-Next's Gated DeltaNet layers keep more than
    # selective recomputation frees within the limit: HEU
    algo = "heu" if name in ("phi3-mini-4k.json", "olmo2-7b.json", "gemma3-27b.json", "qwen3-next-80b.json") \
        else "selective"
    r = lynx("plan", prof, "--algo", algo, "-o", plan)
    assert r.exit_code == 0, r.output
    r = lynx("check", plan)
    assert r.exit_code == 0, r.output
    for to in ("megatron", "torchtitan"):
        r = lynx("export", plan, "--to", to)
        if (name, to) in EXPORTS:
            assert r.exit_code == 0, r.output
        else:  # a feature the target's flags do not build: refused by name, never a different model
            assert r.exit_code == 2 and ("not exporting a different model" in r.output or "has no config" in r.output), \
                r.output
            assert len(r.output) < 600, r.output
