"""A Hugging Face `config.json` → ModelSpec, per `model_type` (read as JSON: nothing is downloaded or imported).

Each model family has its own reader (models/families/<family>.py); this module picks it by `model_type`, reads the
text part of a multimodal config (`text_config`), and refuses any field the family neither models nor names as
irrelevant. Fields transformers defaults are defaulted the same way (num_key_value_heads = heads, each model_type's
tie_word_embeddings default, no attention bias); the sizes must be present. An unknown model_type or a missing, wrong
or unmodelled field is an InputError naming the file and the field.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..io import InputError
from .families import BY_MODEL_TYPE, MODEL_TYPES, Fields, check_all_read
from .spec import ModelSpec

# multimodal wrappers whose text model lynx reads: the wrapper's own fields (vision tower, projector, token ids)
# are not part of the language model a text-only training run builds
_MULTIMODAL_TEXT = {"gemma3": "gemma3_text", "llama4": "llama4_text"}

__all__ = ["MODEL_TYPES", "spec_from_hf", "read_hf_config"]


def _number(f: Fields, key: str) -> float | None:
    v = f.get(key, kind=float, required=False)
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
        raise InputError(f"{f.where}: field {key!r} must be a positive number, not {v!r}")
    return None if v is None else float(v)


def spec_from_hf(cfg: dict, name: str, where: str, source: str | None = None) -> ModelSpec:
    """The ModelSpec of a Hugging Face config dict; `where` names it in errors (a file path or a catalog entry)."""
    if not isinstance(cfg, dict):
        raise InputError(f"{where}: expected a JSON object (a Hugging Face config.json)")
    mt = cfg.get("model_type")
    notes: list[str] = []
    if mt in _MULTIMODAL_TEXT and _MULTIMODAL_TEXT[mt] in BY_MODEL_TYPE:
        text = cfg.get("text_config")
        if not isinstance(text, dict):
            raise InputError(f"{where}: field 'text_config': expected the language model's config (an object)")
        notes.append(f"model_type {mt!r}: the language model (text_config) only; the vision encoder and projector "
                     "are not priced")
        cfg, where, mt = {**text, "model_type": _MULTIMODAL_TEXT[mt]}, f"{where} (text_config)", _MULTIMODAL_TEXT[mt]
    if mt not in BY_MODEL_TYPE:
        raise InputError(f"{where}: field 'model_type': {mt!r} is not supported (expected one of "
                         f"{', '.join(MODEL_TYPES + tuple(_MULTIMODAL_TEXT))})")
    mod = BY_MODEL_TYPE[mt]
    for experts_key in ("num_local_experts", "num_experts", "n_routed_experts"):
        k, e = cfg.get("num_experts_per_tok"), cfg.get(experts_key)
        if isinstance(k, int) and isinstance(e, int) and 0 < e < k:
            raise InputError(f"{where}: field 'num_experts_per_tok' ({k}) exceeds {experts_key!r} ({e}): a token "
                             "cannot go to more experts than there are")
    f = Fields(cfg, where)
    kw = mod.read(f, mt)
    # not sizes, but part of the model an export must build
    kw |= {k: v for k, v in (("rope_theta", _number(f, "rope_theta")), ("norm_eps", _number(f, "rms_norm_eps")))
           if v is not None and k not in kw}
    check_all_read(f, mod)
    _check_together(kw, where)
    kw = dict(name=name, source=source or f"{where} (model_type {cfg.get('model_type')})", **kw)
    notes += f.notes
    if notes:
        kw["notes"] = tuple(notes)
    from pydantic import ValidationError

    try:
        return ModelSpec(**kw)
    except ValidationError as e:
        raise InputError(f"{where}: " + "; ".join(
            f"{'.'.join(map(str, x['loc']))}: {x['msg'].removeprefix('Value error, ')}" if x["loc"]
            else x["msg"].removeprefix("Value error, ") for x in e.errors())) from None


def _check_together(kw: dict, where: str) -> None:
    """The checks across fields ModelSpec makes, in the config's own names (its message would name lynx's fields:
    kv_heads, moe.dense_layers). `kw`: the ModelSpec fields the family read (models/families/_common.decoder)."""
    heads, kv, hidden, layers = kw["heads"], kw["kv_heads"], kw["hidden"], kw["num_layers"]
    if heads % kv:
        raise InputError(f"{where}: field 'num_key_value_heads' ({kv}) must divide 'num_attention_heads' ({heads})")
    if kw.get("head_dim") is None and kw.get("mla") is None and hidden % heads:
        raise InputError(f"{where}: field 'num_attention_heads' ({heads}) must divide 'hidden_size' ({hidden}) "
                         "where 'head_dim' is not given")
    moe = kw.get("moe")
    if moe is not None and moe.dense_layers > layers:
        raise InputError(f"{where}: field 'first_k_dense_replace' ({moe.dense_layers}) exceeds 'num_hidden_layers' "
                         f"({layers})")
    if moe is not None and moe.scoring == "sigmoid" and (moe.n_group or moe.topk_group):
        if moe.experts % moe.groups:
            raise InputError(f"{where}: field 'n_group' ({moe.groups}) must divide the experts ({moe.experts}): "
                             "group-limited routing splits them into equal groups")
        if moe.group_topk > moe.groups:
            raise InputError(f"{where}: field 'topk_group' ({moe.group_topk}) exceeds 'n_group' ({moe.groups})")


def read_hf_config(path: str) -> ModelSpec:
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: cannot read the JSON ({e})") from None
    return spec_from_hf(cfg, Path(path).parent.name or Path(path).stem, path)
