"""The pipeline schedules, by name: each module gives, per rank, the ordered work items; everything else reads them.

A work item is (kind, virtual stage, micro-batch) with kind F (forward), B (backward: the whole backward, or only the
input gradient where the schedule splits it) or W (the weight gradient of a split backward). The model is cut into
p * v virtual stages (chunks); rank r holds chunks r, r + p, ..., r + (v - 1) p (Megatron's and torch's layout), and
a micro-batch runs through the chunks in order. The simulator executes these orders, placements.py derives where each
recomputation placement fires from them, and the runtime's release table (runtime/pipelining.py) reads the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from . import gpipe, interleaved, one_f_one_b, zero_bubble

Item = tuple[str, int, int]  # ("F" | "B" | "W", virtual stage, micro-batch)


@dataclass(frozen=True)
class Schedule:
    name: str
    order: Callable[[int, int, int, int], tuple[Item, ...]]  # (p, v, rank, m) -> the rank's items in order
    splits_backward: bool  # B computes the input gradient only; W, later, the weight gradient
    virtual: tuple[int, int | None]  # (least, most) virtual stages per rank; None: no upper bound
    torch_class: str  # torch.distributed.pipelining's class running this order
    torchtitan: str  # torchtitan's parallelism.pipeline_parallel_schedule value
    rounds: bool = False  # the micro-batches must split into rounds of at most p (torch's flexible interleaving)
    # Megatron without --overlap-p2p-communication: (p, v, rank, m) -> the positions in the rank's order of the
    # forwards whose output is sent together with the gradient of the backward after them, after both (its
    # interleaved steady state: send_forward_backward_recv_forward_backward); None: every item sends alone
    paired_sends: Callable[[int, int, int, int], frozenset[int]] | None = None


SCHEDULES: dict[str, Schedule] = {s.name: s for s in (
    Schedule("1f1b", one_f_one_b.order, False, (1, 1), "Schedule1F1B", "1F1B"),
    Schedule("gpipe", gpipe.order, False, (1, 1), "ScheduleGPipe", "GPipe"),
    Schedule("interleaved-1f1b", interleaved.order, False, (2, None), "ScheduleInterleaved1F1B", "Interleaved1F1B",
             rounds=True, paired_sends=interleaved.paired_sends),
    Schedule("zero-bubble", zero_bubble.order, True, (1, None), "ScheduleInterleavedZeroBubble",
             "InterleavedZeroBubble", rounds=True),
)}
NAMES: tuple[str, ...] = tuple(SCHEDULES)


def get(name: str) -> Schedule:
    return SCHEDULES[name]


def problem(name: str, p: int, v: int, m: int) -> str | None:
    """Why (p, v, m) cannot run this schedule, or None."""
    s = SCHEDULES[name]
    lo, hi = s.virtual
    if v < lo or (hi is not None and v > hi):
        need = f"exactly {lo}" if lo == hi else f"at least {lo}" if hi is None else f"{lo} to {hi}"
        return f"schedule {name!r} needs {need} virtual stages per rank (--virtual-stages), not {v}"
    if s.rounds and m % max(1, m // p) != 0:
        return (f"schedule {name!r} runs the micro-batches in rounds of the pipeline depth: {m} micro-batches do not "
                f"split into {max(1, m // p)} equal rounds for {p} stages (use a multiple of {p})")
    return None


def chunks_of(p: int, v: int, rank: int) -> tuple[int, ...]:
    """The virtual stages rank holds, in model order."""
    return tuple(rank + i * p for i in range(v))


def rank_of(p: int, chunk: int) -> int:
    return chunk % p


@lru_cache(maxsize=4096)
def order(name: str, p: int, v: int, rank: int, m: int) -> tuple[Item, ...]:
    return SCHEDULES[name].order(p, v, rank, m)


@lru_cache(maxsize=4096)
def awaiting_weight_pass(name: str, p: int, v: int, chunk: int, m: int) -> int:
    """The most micro-batches whose B chunk has run and whose W has not (0 unless the backward is split): their graphs,
    kept and recomputed tensors included, are held meanwhile."""
    if not SCHEDULES[name].splits_backward:
        return 0
    held = most = 0
    for kind, c, _ in order(name, p, v, rank_of(p, chunk), m):
        if c == chunk and kind != "F":
            held += 1 if kind == "B" else -1
            most = held if held > most else most
    return most


@lru_cache(maxsize=4096)
def in_flight(name: str, p: int, v: int, chunk: int, m: int) -> int:
    """The most micro-batches whose forward chunk has run and whose backward (B) has not: those whose activations it
    holds at once."""
    held = most = 0
    for kind, c, _ in order(name, p, v, rank_of(p, chunk), m):  # (plain branches: a deep pipeline has 10^4 items)
        if c == chunk and kind != "W":
            held += 1 if kind == "F" else -1
            most = held if held > most else most
    return most


@lru_cache(maxsize=4096)
def peak_graphs(name: str, p: int, v: int, chunk: int, m: int) -> tuple[int, int]:
    """(in flight, awaiting W) at the start of the chunk's backward that holds the most micro-batches' graphs: those
    whose forward has run and whose B has not (the one starting included), and, under a split backward, those whose
    B has run and whose W has not (more of those on a tie: each holds its recomputed tensors too). The two maxima
    (`in_flight`, `awaiting_weight_pass`) need not coincide: the zero-bubble last stage holds one in flight while
    three await W, and four await W only once none is in flight, so their sum counts a graph twice."""
    if not SCHEDULES[name].splits_backward:
        return in_flight(name, p, v, chunk, m), 0
    flying = waiting = 0
    best = (0, 0)  # (graphs, awaiting W)
    for kind, c, _ in order(name, p, v, rank_of(p, chunk), m):
        if c != chunk:
            continue
        if kind == "F":
            flying += 1
        elif kind == "B":
            best = max(best, (flying + waiting, waiting))
            flying, waiting = flying - 1, waiting + 1
        else:
            waiting -= 1
    return best[0] - best[1], best[1]


@lru_cache(maxsize=4096)
def peak_counts(name: str, p: int, v: int, rank: int, m: int) -> tuple[tuple[int, ...], ...]:
    """The rank's in-flight counts per chunk (chunks_of order) at the start of each of its backwards, counting a
    micro-batch from its forward to its W (its B where the backward is not split): the moments its activation memory
    peaks. Only the counts no other one dominates (the chunks' maxima of `in_flight` do not coincide: interleaved
    rank 0 of p 4, v 2, m 16 holds (7, 4) or (8, 3), never (8, 4))."""
    mine = chunks_of(p, v, rank)
    held = dict.fromkeys(mine, 0)
    seen = set()
    for kind, c, _ in order(name, p, v, rank, m):
        if kind == "F":
            held[c] += 1
        elif kind == "B":
            seen.add(tuple(held[d] for d in mine))
            if not SCHEDULES[name].splits_backward:
                held[c] -= 1
        else:
            held[c] -= 1
    return tuple(sorted(a for a in seen
                        if not any(b != a and all(x <= y for x, y in zip(a, b)) for b in seen)))
