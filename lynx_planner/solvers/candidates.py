"""The Pareto set of one block's keep/recompute policies: no other policy keeps fewer bytes, recomputes in less time,
regenerates fewer bytes and is at least as free to be placed (no replayed collective).

Exhaustive, by a depth-first search over the ops in reverse order: a saved unit is kept or recomputed; a recomputed
op makes its inputs required; a required forward collective is kept (its output) or replayed; any other required op
is recomputed. The search visits 2^(units) leaves at most (about 2 000 for a GPT layer).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import policy, simulator
from ..memo import per_object
from ..schema import BLOCK_INPUT, Block


@dataclass(frozen=True)
class Candidate:
    keep: frozenset[str]
    recompute: tuple[str, ...]
    kept_bytes: int  # per micro-batch, block input included
    rec_bytes: int
    rec_s: float
    replays_collective: bool


@per_object
def pareto(block: Block) -> tuple[Candidate, ...]:
    """Sorted by kept bytes, ascending; the last one keeps everything (no recomputation)."""
    info = policy.analyse(block)
    ops = [o for o in info.block.ops if not o.view]
    units = set(info.units)
    holds = {o.id for o in ops if o.id in info.needed_out or o.id in info.collective}
    leaves: dict[tuple, Candidate] = {}

    def visit(i: int, keep: list[str], rec: list[str], required: frozenset[str]) -> None:
        if i < 0:
            c = _candidate(info, keep, rec)
            key = (c.kept_bytes, c.rec_s, c.rec_bytes, c.replays_collective)
            if key not in leaves:
                leaves[key] = c
            return
        op = ops[i]
        o = op.id
        needed = o in required
        recompute_inputs = required | {x for x in info.inputs[o] if x != BLOCK_INPUT}
        if o in units or (needed and o in info.collective and op.fwd_s > 0):
            if not needed or o in holds:
                visit(i - 1, keep + [o], rec, required)
            visit(i - 1, keep, rec + [o], recompute_inputs)
        elif needed:
            visit(i - 1, keep, rec + [o], recompute_inputs)
        else:
            visit(i - 1, keep, rec, required)

    visit(len(ops) - 1, [], [], frozenset())
    return _frontier(list(leaves.values()))


def _candidate(info: policy.BlockInfo, keep: list[str], rec: list[str]) -> Candidate:
    k = frozenset(keep)
    r = tuple(sorted(rec, key=info.order.__getitem__))
    c = policy.cost(info, k, r)
    return Candidate(k, r, c.kept_bytes, c.recomputed_bytes, c.recompute_s, c.replays_collective)


def _frontier(cands: list[Candidate]) -> tuple[Candidate, ...]:
    cands.sort(key=lambda c: (c.kept_bytes, c.rec_s, c.rec_bytes, c.replays_collective, sorted(c.keep)))
    out: list[Candidate] = []
    for c in cands:
        if not any(d.rec_s <= c.rec_s and d.rec_bytes <= c.rec_bytes and d.replays_collective <= c.replays_collective
                   for d in out):
            out.append(c)
    return tuple(out)


def reset_caches() -> None:
    """Forget derived block facts (so that a timed search pays for them, as a fresh process would)."""
    from ..evaluate import _ideal_times

    for fn in (pareto, policy.analyse, simulator.block_segments, _ideal_times):
        fn.cache_clear()
