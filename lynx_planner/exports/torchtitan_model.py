"""torchtitan 0.3's models: which `--module M --config C` builds the profiled model, by its shape, and how its
parallel settings name expert parallelism. A model torchtitan has no config of is refused (an InputError), as is a
plan whose layers are not the config's (torchtitan's pipeline split, `_split_module`, keeps only the modules a part
lists: it would drop the others without a word).

FLAVORS: torchtitan 0.3.0's config_registry functions of real models and the shape of the model each builds
(tests/test_torchtitan_export.py rebuilds every one from torchtitan's own configs and compares).
"""

from __future__ import annotations

from ..io import InputError
from ..models.spec import ModelSpec

# (module, config function, flavor): shape (tests/torchtitan_shapes.py; rope scaling is not part of lynx's model)
FLAVORS: dict[tuple[str, str, str], dict] = {
    ("llama3", "llama3_8b", "8B"): {
        "layers": 32, "hidden": 4096, "vocab": 128256, "heads": 32, "rope_theta": 500000.0, "rope_scaling": "llama",
        "tied": False, "kv_heads": 8, "head_dim": 128, "qk_norm": False, "ffn": 14336,
    },
    ("llama3", "llama3_70b", "70B"): {
        "layers": 80, "hidden": 8192, "vocab": 128256, "heads": 64, "rope_theta": 500000.0, "rope_scaling": "llama",
        "tied": False, "kv_heads": 8, "head_dim": 128, "qk_norm": False, "ffn": 28672,
    },
    ("llama3", "llama3_405b", "405B"): {
        "layers": 126, "hidden": 16384, "vocab": 128256, "heads": 128, "rope_theta": 500000.0,
        "rope_scaling": "llama", "tied": False, "kv_heads": 8, "head_dim": 128, "qk_norm": False, "ffn": 53248,
    },
    ("qwen3", "qwen3_0_6b", "0.6B"): {
        "layers": 28, "hidden": 1024, "vocab": 151936, "heads": 16, "rope_theta": 1000000.0, "rope_scaling": "none",
        "tied": True, "kv_heads": 8, "head_dim": 128, "qk_norm": True, "ffn": 3072,
    },
    ("qwen3", "qwen3_1_7b", "1.7B"): {
        "layers": 28, "hidden": 2048, "vocab": 151936, "heads": 16, "rope_theta": 1000000.0, "rope_scaling": "none",
        "tied": True, "kv_heads": 8, "head_dim": 128, "qk_norm": True, "ffn": 6144,
    },
    ("qwen3", "qwen3_14b", "14B"): {
        "layers": 40, "hidden": 5120, "vocab": 151936, "heads": 40, "rope_theta": 1000000.0, "rope_scaling": "none",
        "tied": False, "kv_heads": 8, "head_dim": 128, "qk_norm": True, "ffn": 17408,
    },
    ("qwen3", "qwen3_32b", "32B"): {
        "layers": 64, "hidden": 5120, "vocab": 151936, "heads": 64, "rope_theta": 1000000.0, "rope_scaling": "none",
        "tied": False, "kv_heads": 8, "head_dim": 128, "qk_norm": True, "ffn": 25600,
    },
    ("qwen3", "qwen3_30b_a3b", "30B-A3B"): {
        "layers": 48, "hidden": 2048, "vocab": 151936, "heads": 32, "rope_theta": 1000000.0, "rope_scaling": "none",
        "tied": False, "kv_heads": 4, "head_dim": 128, "qk_norm": True,
        "moe": (128, 8, 768, 0, 0, "softmax", True, 1.0, 1, 1),
    },
    ("deepseek_v3", "deepseek_v3_16b", "16B"): {
        "layers": 27, "hidden": 2048, "vocab": 102400, "heads": 16, "rope_theta": 10000.0, "rope_scaling": "yarn",
        "tied": False, "mla": (None, 512, 128, 64, 128), "ffn": 10944,
        "moe": (64, 6, 1408, 2816, 1, "softmax", False, 1.0, 1, 1),
    },
    ("deepseek_v3", "deepseek_v3_671b", "671B"): {
        "layers": 61, "hidden": 7168, "vocab": 129280, "heads": 128, "rope_theta": 10000.0, "rope_scaling": "yarn",
        "tied": False, "mla": (1536, 512, 128, 64, 128), "ffn": 18432,
        "moe": (256, 8, 2048, 2048, 3, "sigmoid", True, 2.5, 8, 4),
    },
    ("gpt_oss", "gpt_oss_20b", "20b"): {
        "layers": 24, "hidden": 2880, "vocab": 201088, "heads": 64, "rope_theta": 150000.0, "rope_scaling": "yarn",
        "tied": False, "kv_heads": 8, "head_dim": 64, "qk_norm": False,
        "moe": (32, 4, 2880, 0, 0, "softmax", True, 1.0, 1, 1), "windows": (128, None) * 12, "sinks": True,
        "attention_bias": (True, True), "expert_bias": True, "swiglu_limit": 7.0,
    },
    ("gpt_oss", "gpt_oss_120b", "120b"): {
        "layers": 36, "hidden": 2880, "vocab": 201088, "heads": 64, "rope_theta": 150000.0, "rope_scaling": "yarn",
        "tied": False, "kv_heads": 8, "head_dim": 64, "qk_norm": False,
        "moe": (128, 4, 2880, 0, 0, "softmax", True, 1.0, 1, 1), "windows": (128, None) * 18, "sinks": True,
        "attention_bias": (True, True), "expert_bias": True, "swiglu_limit": 7.0,
    },
}
# ModelSpec fields torchtitan's configs are matched on (shape below); any other field set in a profile's
# architecture is refused (a feature such as a sliding window or MTP module no config here builds).
HANDLED = {"schema_version", "name", "source", "family", "num_layers", "hidden", "heads", "kv_heads", "head_dim",
           "ffn_hidden", "vocab", "norm", "mlp", "positions", "tie_embeddings", "qkv_bias", "qk_norm", "mla", "moe",
           "rope_theta", "norm_eps", "layer_types", "window", "chunk", "attention_sinks", "o_bias", "swiglu_limit",
           "notes"}  # notes: what lynx approximated, not a model field
MOE_HANDLED = {"experts", "top_k", "expert_ffn", "shared_experts", "shared_ffn", "shared_gate", "dense_layers",
               "norm_topk_prob", "scoring", "n_group", "topk_group", "scaling", "bias"}
# The families each torchtitan module builds (its attention, norms and MLP are theirs).
MODULE_FAMILIES = {"llama3": ("llama",), "qwen3": ("qwen3", "qwen3_moe"), "deepseek_v3": ("deepseek_v3",),
                   "gpt_oss": ("gpt_oss",)}
# A measured profile's model is not known: the export names torchtitan's Llama 3 debug model, 6 layers deep.
DEBUG = ("llama3", "llama3_debugmodel")
DEBUG_LAYERS = 6


def shape(spec: ModelSpec) -> dict:
    """`spec`'s model in the terms of FLAVORS (rope_theta: transformers' default 10000 where the config has none)."""
    out: dict = {"layers": spec.num_layers, "hidden": spec.hidden, "vocab": spec.vocab, "heads": spec.heads,
                 "rope_theta": float(spec.rope_theta or 10000.0), "tied": spec.tie_embeddings}
    if spec.mla is not None:
        m = spec.mla
        out["mla"] = (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim)
    else:
        out |= {"kv_heads": spec.kv, "head_dim": spec.dim, "qk_norm": spec.qk_norm}
    moe = spec.moe
    if moe is None or moe.dense_layers:
        out["ffn"] = spec.ffn_hidden
    if moe is not None:
        out["moe"] = (moe.experts, moe.top_k, moe.expert_ffn, moe.shared_ffn, moe.dense_layers, moe.scoring,
                      moe.norm_topk_prob, float(moe.scaling), moe.groups, moe.group_topk)
    # the features of gpt-oss's module, present only where set (the other flavors' shapes stay as they were)
    if spec.layer_types is not None:  # each layer's window (keys a query sees, itself included), None: full
        out["windows"] = tuple({"full": None, "sliding": spec.window}.get(k, f"{k} {spec.chunk}")
                               for k in spec.layer_types)
    if spec.attention_sinks:
        out["sinks"] = True
    if spec.qkv_bias or spec.o_bias:
        out["attention_bias"] = (spec.qkv_bias, spec.o_bias)
    if moe is not None and moe.bias:
        out["expert_bias"] = True  # the router's and every expert projection's
    if spec.swiglu_limit is not None:
        out["swiglu_limit"] = spec.swiglu_limit
    return out


def config_of(spec: ModelSpec, where: str) -> tuple[str, str, list[str]]:
    """(module, config function, notes) of the torchtitan config that builds `spec`'s model, or an InputError."""
    want = shape(spec)
    for (module, config, flavor), got in FLAVORS.items():
        if spec.family in MODULE_FAMILIES[module] and {k: v for k, v in got.items() if k != "rope_scaling"} == want:
            notes = []
            if got["rope_scaling"] != "none":
                notes.append(f"torchtitan's {config} ({flavor}) scales its rotary frequencies ({got['rope_scaling']} "
                             "scaling), which the profile does not record: the same shapes and bytes")
            return module, config, notes
    raise InputError(f"{where}: field model.architecture: torchtitan 0.3 has no config of this {spec.family} model "
                     f"({spec.num_layers} layers, hidden {spec.hidden}, {spec.heads} heads"
                     + (f", {spec.moe.experts} experts" if spec.moe else "") + "); its configs: "
                     + ", ".join(c for _, c, _ in FLAVORS) + ". Write a config_registry function of this model and "
                     "pass it to torchtitan yourself; not exporting a different model")


def expert_parallel(spec: ModelSpec | None, tp: int, ep: int, dp_shard: int, where: str) -> tuple[dict, list[str]]:
    """torchtitan's expert_parallel_degree: EP borrows its ranks from dp_shard x tp (dp_shard*cp*tp == efsdp*ep,
    torchtitan/config/configs.py), every expert whole; lynx's EP (Megatron's) shards experts over ep DP ranks with
    expert TP inside each: the same expert bytes per rank over ep x tp ranks."""
    if ep == 1:
        return {}, []
    degree = ep * tp
    if (dp_shard * tp) % degree:
        raise InputError(f"{where}: field parallel.ep: torchtitan draws expert parallelism from FSDP (dp_shard) and "
                         f"TP ranks; dp_shard {dp_shard} x tp {tp} has no {degree} (ep x tp) of them: profile with "
                         "--distributed-optimizer")
    notes = [f"torchtitan shards each expert whole over expert_parallel_degree {degree} = ep {ep} x tp {tp} ranks "
             "(no expert TP): the same expert bytes per rank; its all-to-all spans the TP ranks too"] if tp > 1 else []
    return {"expert_parallel_degree": degree}, notes
