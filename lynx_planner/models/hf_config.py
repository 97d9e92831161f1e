"""A Hugging Face `config.json` → ModelSpec, per `model_type` (read as JSON: nothing is downloaded or imported).

Fields transformers defaults are defaulted the same way (num_key_value_heads = heads, tied embeddings off, no
attention bias); the sizes must be present. An unknown model_type or a missing or wrong field is an InputError naming
the file and the field.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..io import InputError
from .spec import MAX_EXPERTS, MAX_LAYERS, MAX_VOCAB, MAX_WIDTH, MLASpec, ModelSpec, MoESpec

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")
_HEAD_DIM_DEFAULT = {"qwen3": 128, "qwen3_moe": 128}  # transformers' defaults where head_dim is its own field


# The most each integer field may be (spec.py says why); widths (hidden, FFN, head and low-rank dimensions, heads)
# otherwise. Fields that may be 0: counts of optional parts.
_MOST = {"num_hidden_layers": MAX_LAYERS, "first_k_dense_replace": MAX_LAYERS, "vocab_size": MAX_VOCAB,
         "num_local_experts": MAX_EXPERTS, "num_experts": MAX_EXPERTS, "n_routed_experts": MAX_EXPERTS,
         "num_experts_per_tok": MAX_EXPERTS, "n_shared_experts": MAX_EXPERTS, "decoder_sparse_step": MAX_LAYERS}
_MAY_BE_ZERO = {"n_shared_experts", "first_k_dense_replace", "shared_expert_intermediate_size", "q_lora_rank"}


class _Fields:
    def __init__(self, cfg: dict, where: str):
        self.cfg, self.where = cfg, where

    def get(self, key: str, default=None, kind=int, required: bool = True):
        if key not in self.cfg or self.cfg[key] is None:
            if required and default is None:
                raise InputError(f"{self.where}: field {key!r} is missing")
            return default
        v = self.cfg[key]
        if kind is int and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise InputError(f"{self.where}: field {key!r} must be a non-negative integer, not {v!r}")
        if kind is int and v == 0 and key not in _MAY_BE_ZERO:
            raise InputError(f"{self.where}: field {key!r} must be at least 1, not 0")
        if kind is int and v > _MOST.get(key, MAX_WIDTH):
            raise InputError(f"{self.where}: field {key!r} is {v}: lynx takes at most {_MOST.get(key, MAX_WIDTH)} "
                             "(far above any real model's; a typo?)")
        if kind is bool and not isinstance(v, bool):
            raise InputError(f"{self.where}: field {key!r} must be true or false, not {v!r}")
        return v


def spec_from_hf(cfg: dict, name: str, where: str, source: str | None = None) -> ModelSpec:
    """The ModelSpec of a Hugging Face config dict; `where` names it in errors (a file path or a catalog entry)."""
    if not isinstance(cfg, dict):
        raise InputError(f"{where}: expected a JSON object (a Hugging Face config.json)")
    mt = cfg.get("model_type")
    if mt not in MODEL_TYPES:
        raise InputError(f"{where}: field 'model_type': {mt!r} is not supported (expected one of "
                         f"{', '.join(MODEL_TYPES)})")
    f = _Fields(cfg, where)
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise InputError(f"{where}: field 'hidden_act': {act!r} is not supported (SwiGLU with 'silu' expected)")
    heads = f.get("num_attention_heads")
    hidden = f.get("hidden_size")
    kw: dict = dict(
        name=name, source=source or f"{where} (model_type {mt})", family=mt, num_layers=f.get("num_hidden_layers"),
        hidden=hidden, heads=heads, kv_heads=f.get("num_key_value_heads", heads),
        head_dim=f.get("head_dim", _HEAD_DIM_DEFAULT.get(mt), required=False), ffn_hidden=f.get("intermediate_size"),
        vocab=f.get("vocab_size"), tie_embeddings=f.get("tie_word_embeddings", False, bool),
        qkv_bias=mt in ("qwen2", "qwen2_moe") or f.get("attention_bias", False, bool),
        qk_norm=mt in ("qwen3", "qwen3_moe"),
    )
    if mt in ("llama", "mistral") and f.get("mlp_bias", False, bool):
        raise InputError(f"{where}: field 'mlp_bias': true is not supported")
    if kw["qkv_bias"] and mt not in ("qwen2", "qwen2_moe"):
        raise InputError(f"{where}: field 'attention_bias': true is not supported for model_type {mt!r}")
    experts_key = {"mixtral": "num_local_experts", "qwen2_moe": "num_experts", "qwen3_moe": "num_experts",
                   "deepseek_v3": "n_routed_experts"}.get(mt)
    if experts_key is not None and f.get("num_experts_per_tok") > f.get(experts_key):
        raise InputError(f"{where}: field 'num_experts_per_tok' ({cfg['num_experts_per_tok']}) exceeds "
                         f"{experts_key!r} ({cfg[experts_key]}): a token cannot go to more experts than there are")
    if mt == "mixtral":
        kw["moe"] = MoESpec(experts=f.get("num_local_experts"), top_k=f.get("num_experts_per_tok"),
                            expert_ffn=kw["ffn_hidden"])
    elif mt in ("qwen2_moe", "qwen3_moe"):
        if f.get("decoder_sparse_step", 1) != 1 or cfg.get("mlp_only_layers"):
            raise InputError(f"{where}: fields 'decoder_sparse_step'/'mlp_only_layers': only every layer MoE "
                             "(step 1, no MLP-only layers) is supported")
        shared = f.get("shared_expert_intermediate_size") if mt == "qwen2_moe" else 0
        kw["moe"] = MoESpec(experts=f.get("num_experts"), top_k=f.get("num_experts_per_tok"),
                            expert_ffn=f.get("moe_intermediate_size"), shared_experts=1 if shared else 0,
                            shared_ffn=shared, shared_gate=bool(shared),
                            norm_topk_prob=f.get("norm_topk_prob", False, bool))
    elif mt == "deepseek_v3":
        n_shared = f.get("n_shared_experts", 0)
        expert_ffn = f.get("moe_intermediate_size")
        kw["moe"] = MoESpec(experts=f.get("n_routed_experts"), top_k=f.get("num_experts_per_tok"),
                            expert_ffn=expert_ffn, shared_experts=n_shared, shared_ffn=n_shared * expert_ffn,
                            dense_layers=f.get("first_k_dense_replace", 0),
                            norm_topk_prob=f.get("norm_topk_prob", True, bool))
        kw["mla"] = MLASpec(q_lora_rank=f.get("q_lora_rank", required=False) or None,
                            kv_lora_rank=f.get("kv_lora_rank"), qk_rope_head_dim=f.get("qk_rope_head_dim"),
                            qk_nope_head_dim=f.get("qk_nope_head_dim"), v_head_dim=f.get("v_head_dim"))
        kw["head_dim"] = None
    from pydantic import ValidationError

    try:
        return ModelSpec(**kw)
    except ValidationError as e:
        raise InputError(f"{where}: " + "; ".join(
            f"{'.'.join(map(str, x['loc']))}: {x['msg'].removeprefix('Value error, ')}" if x["loc"]
            else x["msg"].removeprefix("Value error, ") for x in e.errors())) from None


def read_hf_config(path: str) -> ModelSpec:
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: cannot read the JSON ({e})") from None
    return spec_from_hf(cfg, Path(path).parent.name or Path(path).stem, path)
