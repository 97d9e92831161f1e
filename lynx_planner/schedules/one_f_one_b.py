"""1F1B (PipeDream-flush, Megatron's default): p - r - 1 warm-up forwards, then one forward and one backward in turn,
then the remaining backwards; the same order as torch.distributed.pipelining's Schedule1F1B."""

from __future__ import annotations


def order(p: int, v: int, rank: int, m: int) -> tuple[tuple[str, int, int], ...]:
    warm = min(p - rank - 1, m)
    items = [("F", rank, k) for k in range(warm)]
    for i in range(m - warm):
        items += [("F", rank, warm + i), ("B", rank, i)]
    return tuple(items + [("B", rank, k) for k in range(m - warm, m)])
