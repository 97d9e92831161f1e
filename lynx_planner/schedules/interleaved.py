"""Interleaved 1F1B (Narayanan et al. 2021; Megatron's virtual pipeline stages; torch's ScheduleInterleaved1F1B).

Each rank holds v chunks. Micro-batches go through a rank's chunks in groups of `per_round` (p when p divides m):
forward of chunk 0 for a group, then chunk 1, ...; backwards in the reverse chunk order. Warm-up: (v - 1) per_round +
2 (p - r - 1) forwards (Megatron's count), then one forward and one backward in turn, then the remaining backwards.
With m < p or m not a multiple of p, torch's flexible rounds: max(1, m // p) rounds of m / rounds micro-batches.
"""

from __future__ import annotations


def rounds(p: int, m: int) -> int:
    """Micro-batches per round (torch's `microbatches_per_round`)."""
    return m // max(1, m // p)


def looped(p: int, v: int, rank: int, m: int) -> tuple[list, list]:
    """The rank's forwards and backwards, each in its own order: forward step i runs chunk (i // per_round) % v,
    backward step j chunk v - 1 - (j // per_round) % v; micro-batches counted per chunk."""
    per_round = rounds(p, m)
    fwd_next: dict[int, int] = {}
    bwd_next: dict[int, int] = {}
    forwards, backwards = [], []
    for i in range(m * v):
        c = ((i // per_round) % v) * p + rank
        forwards.append(("F", c, fwd_next.setdefault(c, 0)))
        fwd_next[c] += 1
        c = (v - 1 - (i // per_round) % v) * p + rank
        backwards.append(("B", c, bwd_next.setdefault(c, 0)))
        bwd_next[c] += 1
    return forwards, backwards


def warmup(p: int, v: int, rank: int, m: int) -> int:
    """Forwards the rank runs before its first backward's turn (Megatron's num_warmup_microbatches)."""
    return min((v - 1) * rounds(p, m) + 2 * (p - 1 - rank), m * v)


def paired_sends(p: int, v: int, rank: int, m: int) -> frozenset[int]:
    """Positions in `order` of the steady state's forwards: Megatron's blocking p2p sends each one's output with the
    gradient of the backward after it. Warm-up forwards send alone, also the last one when every forward is warm-up
    (its all_warmup_microbatches: the backwards that follow wait for that output's round trip)."""
    warm = warmup(p, v, rank, m)
    return frozenset(warm + 2 * i for i in range(m * v - warm))


def order(p: int, v: int, rank: int, m: int) -> tuple[tuple[str, int, int], ...]:
    total = m * v
    warm = warmup(p, v, rank, m)
    forwards, backwards = looped(p, v, rank, m)
    items = forwards[:warm]
    for i in range(total - warm):
        items += [forwards[warm + i], backwards[i]]
    return tuple(items + backwards[total - warm:])
