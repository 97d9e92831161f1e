"""Layer-name conventions of the training stacks a plan is applied in or exported to (lynx's catalog, torchtitan,
Megatron, Hugging Face, the reference GPT): each layer's role (embedding, block N, final layers) and its path, so
that a plan's layer names can be renamed from one stack's layout to another's (runtime/names.py, export.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .schema import Plan


@dataclass(frozen=True)
class Convention:
    name: str
    embedding: str  # the token embedding (the first layer)
    blocks: str  # blocks are f"{blocks}.{i}"
    final: tuple[str, ...]  # the layers after the blocks, in order (final norm, output head)
    other: tuple[str, ...] = ()  # further layers a profile may list (HF's rotary embedding module)


CONVENTIONS: dict[str, Convention] = {c.name: c for c in (
    Convention("lynx", "embedding", "layers", ("lm_head",)),
    Convention("torchtitan", "tok_embeddings", "layers", ("norm", "lm_head")),
    Convention("torchtitan-0.2", "tok_embeddings", "layers", ("norm", "output")),
    Convention("megatron", "embedding", "decoder.layers", ("decoder.final_layernorm", "output_layer")),
    Convention("hf", "model.embed_tokens", "model.layers", ("model.norm", "lm_head"), ("model.rotary_emb",)),
    Convention("hf-gpt2", "transformer.wte", "transformer.h", ("transformer.ln_f", "lm_head"),
               ("transformer.wpe", "transformer.drop")),
    Convention("reference-gpt", "embed", "layers", ("norm", "head")),
)}


def role(conv: Convention, path: str) -> tuple[str, int] | None:
    """('embedding', 0), ('block', i), ('final', k), ('other', k), or None where the path is not of `conv`."""
    m = re.fullmatch(re.escape(conv.blocks) + r"\.(\d+)", path)
    if m:
        return "block", int(m.group(1))
    if path == conv.embedding:
        return "embedding", 0
    if path in conv.final:
        return "final", conv.final.index(path)
    if path in conv.other:
        return "other", conv.other.index(path)
    return None


def plan_convention(plan: Plan) -> Convention | None:
    """The convention whose paths name every layer of the plan (all stages), most specific first."""
    paths = [p for st in plan.stages for p in st.layer_names]
    fits = [c for c in CONVENTIONS.values() if paths and all(role(c, p) is not None for p in paths)]
    # Conventions sharing `layers.N` are told apart by the embedding or final layers the plan names.
    fits.sort(key=lambda c: -sum(role(c, p)[0] != "block" for p in paths))  # type: ignore[index]
    return fits[0] if fits else None




def rename(paths: list[str], source: Convention, target: Convention) -> list[str]:
    """The paths in `target`'s layout, in order; layers without counterpart there (HF's rotary module) are dropped,
    and a final layer stands for all of the target's final layers when the counts differ (lynx's `lm_head` holds the
    final norm and the head)."""
    out: list[str] = []
    for path in paths:
        kind, k = role(source, path)  # type: ignore[misc]
        if kind == "block":
            out.append(f"{target.blocks}.{k}")
        elif kind == "embedding":
            out.append(target.embedding)
        elif kind == "final":
            out += [target.final[k]] if len(source.final) == len(target.final) else \
                [f for f in target.final if f not in out]
    return out
