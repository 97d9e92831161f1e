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

    Dynamic programme over (stage, first layer); stage_time returns inf when a stage cannot fit its memory.
    """
    longest = longest or n_layers
    inf = float("inf")
    # best[s][i]: least bottleneck of stages s..p-1 covering layers i..n-1; nxt: where stage s ends.
    best = [[inf] * (n_layers + 1) for _ in range(p + 1)]
    nxt = [[-1] * (n_layers + 1) for _ in range(p + 1)]
    best[p][n_layers] = 0.0
    for s in range(p - 1, -1, -1):
        # only the first layers stage s can start at: after s stages of 1 to `longest` layers, with the rest within
        # reach of the stages after it (any other state is never read, or stays unreachable)
        for i in range(max(s, n_layers - (p - s) * longest), min(s * longest, n_layers - (p - 1 - s) - 1) + 1):
            for j in range(i + 1, min(n_layers - (p - 1 - s), i + longest) + 1):
                t = stage_time(s, i, j)
                if t >= best[s][i]:
                    break  # a stage only gets slower as it takes more layers
                v = max(t, best[s + 1][j])
                if v < best[s][i]:
                    best[s][i], nxt[s][i] = v, j
    if best[0][0] == inf:
        return [], inf
    bounds, i = [0], 0
    for s in range(p):
        i = nxt[s][i]
        bounds.append(i)
    return bounds, best[0][0]
