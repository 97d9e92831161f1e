"""Readers shared by the family modules: the sizes every decoder config has, and its attention pattern."""

from __future__ import annotations

from ...io import InputError
from . import Fields

_KINDS = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked"}


def decoder(f: Fields, family: str, *, tie: bool = False, head_dim: int | None = None, act: str = "silu",
            act_field: str = "hidden_act", vocab: int | None = None) -> dict:
    """ModelSpec fields of the decoder's sizes; `tie` is the model_type's tie_word_embeddings default, `head_dim`
    its head_dim default where transformers has one, `act` the activation the family's MLP is priced with."""
    f.zero("attention_dropout")
    got = f.get(act_field, act, kind=str, required=False)
    if got != act:
        raise InputError(f"{f.where}: field {act_field!r}: {got!r} is not supported ({act!r} expected for model_type "
                         f"{f.cfg.get('model_type')!r})")
    heads = f.get("num_attention_heads")
    if "quantization_config" in f.cfg:
        f.get("quantization_config", kind=dict, required=False)
        f.note("quantization_config: the checkpoint's storage format; lynx prices training with bf16 weights "
               "(18 bytes per parameter with Adam)")
    return dict(family=family, num_layers=f.get("num_hidden_layers"), hidden=f.get("hidden_size"), heads=heads,
                kv_heads=f.get("num_key_value_heads", heads), head_dim=f.get("head_dim", head_dim, required=False),
                ffn_hidden=f.get("intermediate_size"), vocab=f.get("vocab_size", vocab),
                tie_embeddings=f.get("tie_word_embeddings", tie, bool))


def layer_types(f: Fields, n: int, default: str = "full") -> tuple[str, ...] | None:
    """The per-layer attention pattern of `layer_types` (transformers' names), else `default` for every layer;
    None when all layers are full attention."""
    given = f.get("layer_types", [], kind=list, required=False)
    if given:
        bad = [t for t in given if t not in _KINDS]
        if bad or len(given) != n:
            raise InputError(f"{f.where}: field 'layer_types': expected {n} entries among {', '.join(_KINDS)}"
                             + (f", not {bad[0]!r}" if bad else f", not {len(given)}"))
        kinds = tuple(_KINDS[t] for t in given)
    else:
        kinds = (default,) * n
    return None if all(k == "full" for k in kinds) else kinds


def qwen_sliding(f: Fields, n: int) -> dict:
    """Qwen2/Qwen3's sliding window: only with use_sliding_window, on the layers from max_window_layers on."""
    use = f.get("use_sliding_window", False, bool)
    window = f.get("sliding_window", required=False)
    first = f.get("max_window_layers", n, required=False)
    if f.has("layer_types"):
        kinds = layer_types(f, n)
    else:
        kinds = tuple("sliding" if use and i >= first else "full" for i in range(n))
        kinds = None if all(k == "full" for k in kinds) else kinds
    return dict(layer_types=kinds, window=window if kinds and "sliding" in kinds else None)


def one_of(f: Fields, key: str, allowed: tuple, default):
    v = f.get(key, default, kind=type(default), required=False)
    if v not in allowed:
        raise InputError(f"{f.where}: field {key!r}: {v!r} is not supported (expected one of "
                         f"{', '.join(map(repr, allowed))})")
    return v
