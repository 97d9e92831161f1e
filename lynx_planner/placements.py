"""When each placement releases a layer's recomputation: the one table the simulator and the runtime both read.

A rank runs its schedule's work items in order (lynx_planner/schedules): F(c, k), B(c, k) and, where the backward is
split, W(c, k): the forward, backward (input gradient) and weight gradient of micro-batch k on virtual stage c. For
micro-batch k of a layer of virtual stage c, a recomputation placed
  on_demand     runs inside B(c, k), when backward reaches the layer
  layer_above   runs inside B(c, k), when backward enters the layer above; for the chunk's top layer that is the wait
                for the gradient, so it is grad_wait there
  grad_wait     is released at the start of B(c, k), while the rank waits for micro-batch k's gradient
  prev_forward  is released at the start of the forward F(c', j) that immediately precedes B(c, k) in the rank's
                items, (c', j) != (c, k), whose TP collectives it hides in. Where B(c, k) follows a backward or a W
                (1F1B cool-down, zero bubble's steady state) or its own forward (1F1B's last stage: F(k) B(k)), there
                is no such forward: it runs on demand.
So prev_forward fires on a virtual stage only where some forward of another micro-batch or chunk directly precedes one
of its backwards; a plan that puts it where it never fires is illegal there (`legal_placements`, checked by
`evaluate.check`).
"""

from __future__ import annotations

from functools import lru_cache

from . import schedules

Action = tuple[str, int]  # ("F" | "B", micro-batch)
ON_DEMAND = "on_demand"


@lru_cache(maxsize=4096)
def schedule(kind: str, p: int, s: int, m: int, v: int = 1) -> tuple[Action, ...]:
    """The order of actions on stage s of a one-chunk-per-rank schedule (1F1B: Megatron's, p - s - 1 warm-up
    forwards, the same order as torch.distributed.pipelining's Schedule1F1B; GPipe), as (kind, micro-batch); for
    several chunks per rank, the rank's items without their chunk."""
    return tuple((a, k) for a, _, k in schedules.order(kind, p, v, schedules.rank_of(p, s), m))


@lru_cache(maxsize=4096)
def prev_forward_fires(kind: str, p: int, v: int, rank: int, m: int) -> dict[tuple[int, int], tuple[int, int]]:
    """{(c', j): (c, k)}: on this rank, the start of F(c', j) releases chunk c's micro-batch k's prev_forward
    recomputations (at most one (c, k) per forward)."""
    order = schedules.order(kind, p, v, rank, m)
    return {(a[1], a[2]): (b[1], b[2]) for a, b in zip(order, order[1:])
            if a[0] == "F" and b[0] == "B" and a[1:] != b[1:]}


def prev_forward_releases(kind: str, p: int, s: int, m: int, v: int = 1) -> dict[int, int]:
    """{j: k}: the start of a forward of micro-batch j releases micro-batch k's prev_forward recomputations on
    virtual stage s (for one chunk per rank, F(j) of that chunk)."""
    return {j: k for (_, j), (c, k) in prev_forward_fires(kind, p, v, schedules.rank_of(p, s), m).items() if c == s}


def release(kind: str, p: int, s: int, m: int, k: int, at: str, top: bool, v: int = 1) -> tuple[str, Action]:
    """(the trigger that actually fires, the action it fires in) for micro-batch k's recomputation placed `at` on a
    layer of virtual stage s (`top`: the chunk's top layer)."""
    if at == "layer_above" and top:
        at = "grad_wait"
    if at == "prev_forward":
        for (_, j), (c, kk) in prev_forward_fires(kind, p, v, schedules.rank_of(p, s), m).items():
            if (c, kk) == (s, k):
                return at, ("F", j)
        return ON_DEMAND, ("B", k)
    return at, ("B", k)


def legal_placements(kind: str, p: int, s: int, m: int, v: int = 1) -> tuple[str, ...]:
    """Placements that fire for at least one micro-batch on virtual stage s (prev_forward needs a forward right before
    one of its backwards, of another micro-batch or chunk)."""
    legal = ["on_demand", "layer_above", "grad_wait"]
    if prev_forward_share(kind, p, s, m, v) > 0:
        legal.append("prev_forward")
    return tuple(legal)


@lru_cache(maxsize=4096)  # read per stage by every search's stage model
def prev_forward_share(kind: str, p: int, s: int, m: int, v: int = 1) -> float:
    """The fraction of micro-batches whose prev_forward recomputation fires on virtual stage s (the others run on
    demand)."""
    fires = prev_forward_fires(kind, p, v, schedules.rank_of(p, s), m)
    return sum(1 for c, _ in fires.values() if c == s) / m
