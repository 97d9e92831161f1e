"""The Hugging Face model families lynx reads, one module each, and their registry.

A family module names the `model_type`s it reads (MODEL_TYPES), the HF class prefix its modules carry
(CLASS_PREFIX, e.g. 'Llama' for LlamaDecoderLayer), the config fields it knows to be irrelevant to memory and time
(IGNORED: token ids, rope details, ...), and `read(f, model_type)`, which returns the ModelSpec fields of a config
through `f` (a Fields: every field it reads is marked used). A field of the config neither read nor ignored is refused
(exit 2 naming it): lynx never drops a field silently. A family may also give its own analytic op graph pieces
(GRAPH: a dict of hooks the analytic decoder consults, see analytic/decoder.py); the defaults are the Llama block's.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from ...io import InputError
from ..spec import MAX_EXPERTS, MAX_LAYERS, MAX_VOCAB, MAX_WIDTH

# The most each integer field may be (spec.py says why); widths (hidden, FFN, head and low-rank dimensions, heads)
# otherwise. Fields that may be 0: counts of optional parts.
_MOST = {"num_hidden_layers": MAX_LAYERS, "first_k_dense_replace": MAX_LAYERS, "vocab_size": MAX_VOCAB,
         "num_local_experts": MAX_EXPERTS, "num_experts": MAX_EXPERTS, "n_routed_experts": MAX_EXPERTS,
         "num_experts_per_tok": MAX_EXPERTS, "n_shared_experts": MAX_EXPERTS, "decoder_sparse_step": MAX_LAYERS,
         "interleave_moe_layer_step": MAX_LAYERS, "num_nextn_predict_layers": MAX_LAYERS,
         "sliding_window": 1 << 30, "attention_chunk_size": 1 << 30, "max_window_layers": MAX_LAYERS}
_MAY_BE_ZERO = {"n_shared_experts", "first_k_dense_replace", "shared_expert_intermediate_size", "q_lora_rank",
                "num_nextn_predict_layers", "max_window_layers", "num_shared_experts",
                "n_group", "topk_group"}

# every config.json carries these; none changes what a training step keeps or how long it runs
COMMON_IGNORED = frozenset({
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "_name_or_path", "auto_map",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "rms_norm_eps", "layer_norm_eps",
    "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings", "use_cache", "tokenizer_class",
    "return_dict", "output_attentions", "output_hidden_states", "torchscript", "output_router_logits",
    "router_aux_loss_coef", "pretraining_tp", "original_max_position_embeddings", "chat_template", "generation_config",
})

_MODULES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen_moe", "deepseek", "deepseek_v2", "phi3", "olmo2",
            "gemma3", "glm4_moe", "gpt_oss", "llama4", "qwen3_next")


def _load() -> tuple[dict[str, ModuleType], dict[str, ModuleType]]:
    by_type, by_family = {}, {}
    for name in _MODULES:
        mod = import_module(f"{__name__}.{name}")
        for mt in mod.MODEL_TYPES:
            by_type[mt] = mod
        by_family[mod.FAMILY if hasattr(mod, "FAMILY") else mod.MODEL_TYPES[0]] = mod
        for fam in getattr(mod, "FAMILIES", ()):
            by_family[fam] = mod
    return by_type, by_family




def family_module(family: str) -> ModuleType:
    """The module of a ModelSpec family (its op-graph hooks and class prefix)."""
    return BY_FAMILY[family]


def class_prefix(family: str) -> str:
    """The Hugging Face class prefix of a family's modules ('Llama' for LlamaDecoderLayer)."""
    p = BY_FAMILY[family].CLASS_PREFIX
    return p[family] if isinstance(p, dict) else p


class Fields:
    """A config dict read field by field: `used` records what was read, so what remains can be named."""

    def __init__(self, cfg: dict, where: str):
        self.cfg, self.where, self.used = cfg, where, set()
        self.notes: list[str] = []

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def get(self, key: str, default=None, kind=int, required: bool = True):
        self.used.add(key)
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
        if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise InputError(f"{self.where}: field {key!r} must be a number, not {v!r}")
        if kind is str and not isinstance(v, str):
            raise InputError(f"{self.where}: field {key!r} must be a string, not {v!r}")
        if kind is dict and not isinstance(v, dict):
            raise InputError(f"{self.where}: field {key!r} must be an object, not {v!r}")
        if kind is list and not isinstance(v, list):
            raise InputError(f"{self.where}: field {key!r} must be a list, not {v!r}")
        return v

    def expect(self, key: str, allowed, default, why: str):
        """A field lynx models only at the given values (e.g. dropout 0): anything else is refused."""
        v = self.get(key, default, kind=type(default) if default is not None else int, required=False)
        ok = v in allowed if isinstance(allowed, (tuple, list, set, frozenset)) else v == allowed
        if not ok:
            raise InputError(f"{self.where}: field {key!r}: {v!r} is not supported ({why})")
        return v

    def zero(self, key: str, what: str = "dropout"):
        """A rate lynx prices only at 0 (the HF families train without dropout)."""
        v = self.get(key, 0.0, kind=float, required=False)
        if v:
            raise InputError(f"{self.where}: field {key!r}: {v!r} is not supported (lynx prices these families "
                             f"without {what}; set it to 0)")
        return v

    def ints(self, key: str) -> list[int]:
        v = self.get(key, [], kind=list, required=False)
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
            raise InputError(f"{self.where}: field {key!r} must be a list of non-negative integers")
        return v

    def note(self, text: str) -> None:
        self.notes.append(text)

    def unread(self, ignored: frozenset[str]) -> list[str]:
        return sorted(k for k in self.cfg if k not in self.used and k not in ignored and k not in COMMON_IGNORED)


def check_all_read(f: Fields, mod: ModuleType) -> None:
    left = f.unread(frozenset(getattr(mod, "IGNORED", ())))
    if left:
        raise InputError(f"{f.where}: field{'s' if len(left) > 1 else ''} {', '.join(repr(k) for k in left)}: not "
                         f"modelled by lynx for model_type {f.cfg.get('model_type')!r} (remove "
                         f"{'them' if len(left) > 1 else 'it'} if it does not change the model, or ask for support)")


BY_MODEL_TYPE, BY_FAMILY = _load()  # last: the family modules import Fields from here
MODEL_TYPES = tuple(BY_MODEL_TYPE)
