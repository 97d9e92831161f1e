"""Zero bubble, ZB1P (Qi et al. 2024), as torch's ScheduleInterleavedZeroBubble runs it (v chunks per rank, v >= 1).

The backward is split into B (input gradient: the next rank down waits for it) and W (weight gradient: nobody
waits). Warm-up: (v - 1) per_round + (p - r - 1) forwards; then per step a forward and a B, and, from step r on, the W
of the oldest B not yet followed by one (rank r defers r of them into the bubble); cool-down: B then W; the deferred
Ws close the iteration. Chunks and micro-batches per step as in interleaved 1F1B.
"""

from __future__ import annotations

from .interleaved import looped, rounds


def order(p: int, v: int, rank: int, m: int) -> tuple[tuple[str, int, int], ...]:
    total = m * v
    warm = min((v - 1) * rounds(p, m) + (p - 1 - rank), total)
    forwards, backwards = looped(p, v, rank, m)
    items = forwards[:warm]
    done_w = 0
    for j in range(total):  # the j-th B: with a forward in the steady state, alone in the cool-down
        if warm + j < total:
            items.append(forwards[warm + j])
        items.append(backwards[j])
        if j >= rank:
            items.append(("W",) + backwards[done_w][1:])
            done_w += 1
    return tuple(items + [("W",) + b[1:] for b in backwards[done_w:]])
