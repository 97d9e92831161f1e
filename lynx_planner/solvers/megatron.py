"""Megatron-LM's recomputation methods, on its even stage split, all recomputation on demand. Each applies to every
transformer layer (`transformer_layers`: DeepSeek's dense first layers and the MoE ones alike, as Megatron's
TransformerBlock recomputes whatever layers it holds), never to the embedding, final norm or head:

none       keep everything
full       recompute every transformer layer from its input (the whole forward is replayed, collectives included)
selective  recompute the core attention (`--recompute-granularity selective`, core_attn)
uniform    recompute chunks of N layers from the chunk input (`--recompute-method uniform --recompute-num-layers N`)
block      recompute the first N layers of each stage fully (`--recompute-method block`)

For uniform and block, N is the smallest that fits the memory limit.
"""

from __future__ import annotations

from .. import policy
from ..evaluate import evaluate, layer_policy, none_policy, stage_plans
from ..schema import LayerPolicy, Profile
from . import Infeasible, Problem, Strategy
from .partition import even_bounds, repeated_block
from .stage_model import n_chunks


def _full(profile: Profile, i: int, recompute_with: int | None = None) -> LayerPolicy:
    info = policy.analyse(profile.blocks[profile.layers[i].block])
    return layer_policy(profile, i, frozenset(), policy.full_recompute(info), recompute_with=recompute_with)


def _selective(profile: Profile, i: int) -> LayerPolicy:
    return layer_policy(profile, i, policy.selective_keep(policy.analyse(profile.blocks[profile.layers[i].block])))


def transformer_layers(profile: Profile) -> list[int]:
    """Indices of the transformer layers: every layer whose block maps an activation of the repeated block's size
    to one of the same size through at least one GEMM or attention (op flops) — dense, MoE, sliding-window or
    linear-attention layers alike; not the embedding (token ids in), final norm (no GEMM), rotary tables or head."""
    size = profile.blocks[repeated_block(profile)].input_bytes
    return [i for i, l in enumerate(profile.layers)
            if (b := profile.blocks[l.block]).input_bytes == size == b.output_bytes and any(op.flops for op in b.ops)]


def _stage_repeated(profile: Profile, bounds: list[int]) -> list[list[int]]:
    layers = transformer_layers(profile)
    return [[i for i in layers if bounds[s] <= i < bounds[s + 1]] for s in range(len(bounds) - 1)]


def _uniform(profile: Profile, bounds: list[int], n: int) -> list[LayerPolicy]:
    pols = [none_policy(profile, i) for i in range(len(profile.layers))]
    for layers in _stage_repeated(profile, bounds):
        for c in range(0, len(layers), n):
            chunk = layers[c:c + n]
            top = chunk[-1]
            for i in chunk:
                pols[i] = _full(profile, i, recompute_with=top if len(chunk) > 1 else None)
    return pols


def _block(profile: Profile, bounds: list[int], n: int) -> list[LayerPolicy]:
    pols = [none_policy(profile, i) for i in range(len(profile.layers))]
    for layers in _stage_repeated(profile, bounds):
        for i in layers[:n]:
            pols[i] = _full(profile, i)
    return pols


def _smallest_fitting(problem: Problem, bounds: list[int], make, algo: str) -> list[LayerPolicy]:
    most = max(len(l) for l in _stage_repeated(problem.profile, bounds))
    first = 0 if algo == "block" else 1
    for n in range(first, most + 1):
        pols = make(problem.profile, bounds, n)
        stages = stage_plans(problem.profile, bounds, pols)
        if evaluate(problem.profile, stages, ideal=False).fits(problem.memory_limit):
            return pols
    return pols  # the most memory-frugal choice; solve() reports what it needs


def search(problem: Problem, algo: str) -> Strategy:
    profile = problem.profile
    bounds = even_bounds(profile, n_chunks(profile))  # interleaved: Megatron's even split over the virtual stages
    layers = set(transformer_layers(profile))
    n = len(profile.layers)
    if algo == "none":
        pols = [none_policy(profile, i) for i in range(n)]
    elif algo == "full":
        pols = [_full(profile, i) if i in layers else none_policy(profile, i) for i in range(n)]
    elif algo == "selective":
        pols = [_selective(profile, i) if i in layers else none_policy(profile, i) for i in range(n)]
    elif algo == "uniform":
        pols = _smallest_fitting(problem, bounds, _uniform, algo)
    elif algo == "block":
        pols = _smallest_fitting(problem, bounds, _block, algo)
    else:
        raise Infeasible(f"unknown Megatron method {algo!r}")
    return Strategy(bounds, pols, status="heuristic")
