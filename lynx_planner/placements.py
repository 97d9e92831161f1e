"""When each placement releases a layer's recomputation: the one table the simulator and the runtime both read.

A stage runs its schedule's actions in order (`schedule`): F(k) and B(k), the forward and backward of micro-batch k.
For micro-batch k, a recomputation placed
  on_demand     runs inside B(k), when backward reaches the layer
  layer_above   runs inside B(k), when backward enters the layer above; for the stage's top layer that is the wait
                for the gradient, so it is grad_wait there
  grad_wait     is released at the start of B(k), while the stage waits for micro-batch k's gradient
  prev_forward  is released at the start of the forward F(j) that immediately precedes B(k) in the stage's actions,
                j != k, whose TP collectives it hides in. Where B(k) follows a backward (1F1B cool-down) or its own
                forward (1F1B's last stage: F(k) B(k)), there is no such forward: it runs on demand.
So prev_forward fires on a stage only if it holds two or more micro-batches at its peak; a plan that puts it on a
stage where it never fires is illegal there (`legal_placements`, checked by `evaluate.check`).
"""

from __future__ import annotations

from functools import lru_cache

Action = tuple[str, int]  # ("F" | "B", micro-batch)
ON_DEMAND = "on_demand"


@lru_cache(maxsize=4096)
def schedule(kind: str, p: int, s: int, m: int) -> tuple[Action, ...]:
    """The order of actions on stage s: Megatron's 1F1B (p - s - 1 warm-up forwards; the same order as
    torch.distributed.pipelining's Schedule1F1B) or GPipe."""
    if kind == "gpipe":
        return tuple([("F", k) for k in range(m)] + [("B", k) for k in range(m)])
    warm = min(p - s - 1, m)
    order = [("F", k) for k in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return tuple(order + [("B", k) for k in range(m - warm, m)])


@lru_cache(maxsize=4096)
def prev_forward_releases(kind: str, p: int, s: int, m: int) -> dict[int, int]:
    """{j: k}: the start of F(j) releases micro-batch k's prev_forward recomputations (at most one k per j)."""
    order = schedule(kind, p, s, m)
    return {a[1]: b[1] for a, b in zip(order, order[1:]) if a[0] == "F" and b[0] == "B" and a[1] != b[1]}


def release(kind: str, p: int, s: int, m: int, k: int, at: str, top: bool) -> tuple[str, Action]:
    """(the trigger that actually fires, the action it fires in) for micro-batch k's recomputation placed `at` on a
    layer of stage s (`top`: the stage's top layer)."""
    if at == "layer_above" and top:
        at = "grad_wait"
    if at == "prev_forward":
        for j, kk in prev_forward_releases(kind, p, s, m).items():
            if kk == k:
                return at, ("F", j)
        return ON_DEMAND, ("B", k)
    return at, ("B", k)


def legal_placements(kind: str, p: int, s: int, m: int) -> tuple[str, ...]:
    """Placements that fire for at least one micro-batch on stage s (prev_forward needs a forward before a backward
    of another micro-batch)."""
    legal = ["on_demand", "layer_above", "grad_wait"]
    if prev_forward_releases(kind, p, s, m):
        legal.append("prev_forward")
    return tuple(legal)


def prev_forward_share(kind: str, p: int, s: int, m: int) -> float:
    """The fraction of micro-batches whose prev_forward recomputation fires (the others run on demand)."""
    return len(prev_forward_releases(kind, p, s, m)) / m
