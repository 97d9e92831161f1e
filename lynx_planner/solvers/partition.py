"""Stage splits: Megatron's even split of the repeated layers, and the contiguous split minimising the bottleneck
stage for a given stage-time function (recomputation-aware partitioning)."""

from __future__ import annotations

from collections import Counter
from typing import Callable

from ..schema import Profile


def repeated_block(profile: Profile) -> str:
    """The block type most layers are instances of (the transformer layer)."""
    counts = Counter(l.block for l in profile.layers)
    return max(counts, key=lambda b: (counts[b], -min(i for i, l in enumerate(profile.layers) if l.block == b)))


def even_bounds(profile: Profile, p: int) -> list[int]:
    """Megatron: the repeated layers split evenly (any remainder to the last stages); layers before the first
    repeated one (embedding) join stage 0, layers after the last (head) join the last stage."""
    block = repeated_block(profile)
    rep = [i for i, l in enumerate(profile.layers) if l.block == block]
    if len(rep) < p:
        rep = list(range(len(profile.layers)))
    base, extra = divmod(len(rep), p)
    sizes = [base + (1 if s >= p - extra else 0) for s in range(p)]
    bounds, pos = [0], 0
    for size in sizes[:-1]:
        pos += size
        bounds.append(rep[pos])
    return bounds + [len(profile.layers)]


def best_bounds(n_layers: int, p: int, stage_time: Callable[[int, int, int], float],
                longest: int | None = None) -> tuple[list[int], float]:
    """Contiguous split of n layers into p non-empty stages of at most `longest` layers minimising
    max_s stage_time(s, first, end).

    Dynamic programme over (stage, first layer), from the first stage down: a state is solved only when a stage
    before it can end there faster than the best split found so far for it (stage_time, the costly part, is asked
    for no other); stage_time returns inf when a stage cannot fit its memory.
    """
    longest = longest or n_layers
    # (s, i) -> (least bottleneck of stages s..p-1 covering layers i..n-1, where stage s then ends)
    solved: dict[tuple[int, int], tuple[float, int]] = {(p, n_layers): (0.0, -1)}
    if _least(0, 0, n_layers, p, longest, stage_time, solved) == float("inf"):
        return [], float("inf")
    bounds, i = [0], 0
    for s in range(p):
        i = solved[(s, i)][1]
        bounds.append(i)
    return bounds, solved[(0, 0)][0]


def _least(s: int, i: int, n_layers: int, p: int, longest: int, stage_time: Callable[[int, int, int], float],
           solved: dict[tuple[int, int], tuple[float, int]]) -> float:
    """best_bounds's state (s, i), solved into `solved` once (recursion depth: p)."""
    got = solved.get((s, i))
    if got is not None:
        return got[0]
    least, end = float("inf"), -1
    if s < p and i >= n_layers - (p - s) * longest:  # (else the layers left are too many for the stages left)
        # the last stage takes every layer left: no shorter one is a split (nor its time, or its not fitting)
        for j in range(n_layers if s == p - 1 else i + 1, min(n_layers - (p - 1 - s), i + longest) + 1):
            t = stage_time(s, i, j)
            if t >= least:
                break  # a stage only gets slower as it takes more layers
            v = max(t, _least(s + 1, j, n_layers, p, longest, stage_time, solved))
            if v < least:
                least, end = v, j
    solved[(s, i)] = (least, end)
    return least
