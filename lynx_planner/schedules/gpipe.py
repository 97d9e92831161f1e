"""GPipe: every forward, then every backward (torch.distributed.pipelining's ScheduleGPipe)."""

from __future__ import annotations


def order(p: int, v: int, rank: int, m: int) -> tuple[tuple[str, int, int], ...]:
    return tuple([("F", rank, k) for k in range(m)] + [("B", rank, k) for k in range(m)])
