"""Each layer's role in Megatron's pipeline layout (E embedding, t decoder layer, m multi-token-prediction module, L
loss with the output layer; the final norm belongs to the loss stage) and the split flags built from the roles.

Megatron's layout validation (megatron/core/transformer/pipeline_parallel_layer_layout.py) wants the embedding first
and once, the loss last and once, and exactly num_layers decoder layers, every decoder layer a `t` whatever its MLP
(DeepSeek's dense first layers included). A stage string lists its tokens, joined by commas, `t*n` for n of them.
"""

from __future__ import annotations

import re

from ..layouts import CONVENTIONS, role
from ..schema import Profile

EMBEDDING, DECODER, MTP, NORM, LOSS, OTHER = "E", "t", "m", "norm", "L", "other"


def roles(profile: Profile) -> list[str]:
    """Each layer's role (_roles); a multi-token-prediction module (DeepSeek-V3's, after the decoder layers, named as
    one of them in Hugging Face's layout) is Megatron's `m`."""
    return [MTP if layer.block.endswith("MTPLayer") else r for layer, r in zip(profile.layers, _roles(profile))]


def _roles(profile: Profile) -> list[str]:
    """Each layer's role: by the naming convention its layer names follow (lynx, Hugging Face, torchtitan, ...),
    else by position: the decoder layers are those named like the most common block's layers (`prefix.N`), the
    layers before them the embedding (the first one), after them the final norm and the output layer (the last)."""
    names = [layer.name for layer in profile.layers]
    for conv in CONVENTIONS.values():
        got = [role(conv, n) for n in names]
        if all(r is not None for r in got) and any(r[0] == "block" for r in got):  # type: ignore[index]
            last_final = len(conv.final) - 1
            return [{"embedding": EMBEDDING, "block": DECODER, "other": OTHER}.get(r[0])  # type: ignore[index]
                    or (LOSS if r[1] == last_final else NORM) for r in got]  # type: ignore[index]
    from ..solvers.partition import repeated_block

    rep = repeated_block(profile)
    prefixes = {re.sub(r"\.\d+$", "", l.name) for l in profile.layers
                if l.block == rep and re.search(r"\.\d+$", l.name)}
    decoder = [(re.sub(r"\.\d+$", "", l.name) in prefixes and re.search(r"\.\d+$", l.name) is not None)
               if prefixes else l.block == rep for l in profile.layers]
    first, last = decoder.index(True), len(decoder) - 1 - decoder[::-1].index(True)
    out = []
    for i, is_decoder in enumerate(decoder):
        if first <= i <= last:
            out.append(DECODER if is_decoder else OTHER)
        elif i < first:
            out.append(EMBEDDING if i == 0 else OTHER)
        else:
            out.append(LOSS if i == len(decoder) - 1 else NORM)
    return out


def decoder_counts(profile: Profile, bounds: list[int]) -> list[int]:
    """Decoder layers on each (virtual) stage."""
    r = roles(profile)
    return [sum(r[i] == DECODER for i in range(bounds[s], bounds[s + 1])) for s in range(len(bounds) - 1)]


def ends_in_place(profile: Profile, bounds: list[int]) -> bool:
    """The embedding on the first stage and the MTP modules, final norm and loss on the last, as Megatron's own
    splits have them."""
    r = roles(profile)
    return all(r[i] != EMBEDDING for i in range(bounds[1], len(r))) and \
        all(r[i] not in (MTP, NORM, LOSS) for i in range(bounds[-2]))


def layout_flag(profile: Profile, bounds: list[int]) -> list[str]:
    """`--pipeline-model-parallel-layout`: each (virtual) stage's layers, E embedding, t decoder layer, m MTP
    module, L loss."""
    r = roles(profile)
    stages = []
    for s in range(len(bounds) - 1):
        runs: list[list] = []
        for i in range(bounds[s], bounds[s + 1]):
            tok = r[i]
            if tok not in (EMBEDDING, DECODER, MTP, LOSS):
                continue  # the final norm goes with the loss (layout_notes); other modules hold no layer
            if runs and runs[-1][0] == tok:
                runs[-1][1] += 1
            else:
                runs.append([tok, 1])
        stages.append(",".join(tok if n == 1 else f"{tok}*{n}" for tok, n in runs))
    return [f'--pipeline-model-parallel-layout "{"|".join(stages)}"']


def layout_notes(profile: Profile, bounds: list[int]) -> list[str]:
    """What Megatron places differently from the plan: its final norm runs on the stage of the loss."""
    r = roles(profile)
    stage_of = {i: s for s in range(len(bounds) - 1) for i in range(bounds[s], bounds[s + 1])}
    norms = [i for i, x in enumerate(r) if x == NORM]
    loss = r.index(LOSS) if LOSS in r else None
    if loss is not None and any(stage_of[i] != stage_of[loss] for i in norms):
        return [f"the plan puts the final norm ({profile.layers[norms[0]].name}) on stage {stage_of[norms[0]]} and "
                f"the output layer on stage {stage_of[loss]}; Megatron builds the final norm on the loss's stage"]
    return []


def split_flags(profile: Profile, bounds: list[int]) -> list[str]:
    """Megatron's flags for the plan's stage split (none for its own even split): the first and last stages' decoder
    layer counts when the stages between are equal, else the layout string (which also places a stage holding no
    decoder layer)."""
    p = len(bounds) - 1
    if p == 1:
        return []
    counts = decoder_counts(profile, bounds)
    if not ends_in_place(profile, bounds) or min(counts) == 0:
        return layout_flag(profile, bounds)
    if len(set(counts)) == 1:
        return []  # Megatron's even split
    middle = counts[1:-1]
    if p == 2:
        return [f"--decoder-first-pipeline-num-layers {counts[0]}"]
    if len(set(middle)) == 1:
        flags = []
        if counts[0] != middle[0]:
            flags.append(f"--decoder-first-pipeline-num-layers {counts[0]}")
        if counts[-1] != middle[0]:
            flags.append(f"--decoder-last-pipeline-num-layers {counts[-1]}")
        return flags
    return layout_flag(profile, bounds)


def virtual_flags(profile: Profile, bounds: list[int]) -> list[str]:
    """Megatron's flags for a split into virtual stages (interleaved): the decoder layers per virtual stage where
    every virtual stage holds as many and the embedding and loss sit at the ends, else the layout string of all
    p x v stages (from which Megatron derives the virtual pipeline size; it accepts only one of the two)."""
    counts = decoder_counts(profile, bounds)
    if len(set(counts)) == 1 and counts[0] > 0 and ends_in_place(profile, bounds):
        return [f"--num-layers-per-virtual-pipeline-stage {counts[0]}"]
    return layout_flag(profile, bounds)
