"""Repeated sub-structures of a block (the experts of an MoE layer, looped over or as numbered modules) folded into
one copy, so that the candidate search decides them as a group instead of enumerating their combinations.

A repeat is a run of k >= MIN_COPIES consecutive copies of L ops: op q of every copy has the same kind, aten op and
module (digits ignored: `experts.3` and `experts.7` match), reads and saves the same ops outside the run, ops of its own
copy at the same positions, and (for copies after the first) ops of the copy before it at the same positions (a
running sum). The folded block has one op per position, with the copies' bytes and seconds summed; ops after the run
that read any copy read the folded op. A policy of the folded block keeps an op position in every copy or in none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..schema import Block, Op

MIN_COPIES = 3
MAX_PERIOD = 64  # ops per copy considered (an expert is a handful)


@dataclass(frozen=True)
class Folded:
    block: Block  # the block with each repeat folded into its first copy
    copies: dict[str, tuple[str, ...]]  # folded op id -> the ids it stands for (every copy's op at that position)
    rep: dict[str, str]  # op id of a copy -> the folded op standing for it
    groups: int  # repeats folded


def _signature(op: Op) -> tuple:
    module = op.module or op.id.split(":", 1)[0]
    aten = op.id.split(":", 1)[-1].rsplit("#", 1)[0]
    return (re.sub(r"\d+", "#", module), aten, op.kind, op.view, op.inplace, op.random, tuple(op.tags))


def _refs(refs: list[str], pos: dict[str, int], start: int, period: int, t: int) -> tuple:
    """Each reference of an op of copy t: ('in', q) its own copy's op q, ('prev', q) the previous copy's, ('ext', id)."""
    out = []
    for r in refs:
        j = pos.get(r, -1)
        here = start + t * period
        if j >= here:
            out.append(("in", j - here))
        elif t > 0 and j >= here - period:
            out.append(("prev", j - here + period))
        else:
            out.append(("ext", r))
    return tuple(out)


def _copy_key(ops: list[Op], sigs: list[tuple], pos: dict[str, int], start: int, period: int, t: int) -> tuple:
    base = start + t * period
    return tuple((sigs[i], _refs(ops[i].inputs, pos, start, period, t), _refs(ops[i].saves, pos, start, period, t))
                 for i in range(base, base + period))


def _first_matches(first: tuple, pattern: tuple) -> bool:
    """Copy 0 against copy 1's pattern: where copy 1 reads the copy before, copy 0 reads something outside."""
    for (sig0, in0, sv0), (sig1, in1, sv1) in zip(first, pattern):
        if sig0 != sig1 or len(in0) != len(in1) or len(sv0) != len(sv1):
            return False
        for a, b in zip(in0 + sv0, in1 + sv1):
            if a != b and not (b[0] == "prev" and a[0] == "ext"):
                return False
    return True


def _copies_at(ops, sigs, pos, start: int, period: int) -> int:
    """How many consecutive copies of `period` ops start at `start` (0 if fewer than two)."""
    n = len(ops)
    if start + 2 * period > n:
        return 0
    pattern = _copy_key(ops, sigs, pos, start, period, 1)
    if not _first_matches(_copy_key(ops, sigs, pos, start, period, 0), pattern):
        return 0
    k = 2
    while start + (k + 1) * period <= n and _copy_key(ops, sigs, pos, start, period, k) == pattern:
        k += 1
    return k


def find(block: Block) -> list[tuple[int, int, int]]:
    """Non-overlapping repeats (start, period, copies), most ops covered first."""
    ops = block.ops
    n = len(ops)
    sigs = [_signature(o) for o in ops]
    pos = {o.id: i for i, o in enumerate(ops)}
    found = []
    for period in range(1, min(MAX_PERIOD, n // MIN_COPIES) + 1):
        i = 0
        while i + period < n:  # runs where the signatures repeat with this period
            if sigs[i] != sigs[i + period]:
                i += 1
                continue
            a = i
            while i + period < n and sigs[i] == sigs[i + period]:
                i += 1
            if i - a + period < MIN_COPIES * period:
                continue
            best = max(((_copies_at(ops, sigs, pos, s, period), s) for s in range(a, a + period)),
                       key=lambda x: (x[0], -x[1]))
            if best[0] >= MIN_COPIES:
                found.append((best[1], period, best[0]))
    found.sort(key=lambda r: (-r[1] * r[2], r[0], r[1]))
    chosen: list[tuple[int, int, int]] = []
    for s, L, k in found:
        if all(s + L * k <= s2 or s2 + L2 * k2 <= s for s2, L2, k2 in chosen):
            chosen.append((s, L, k))
    return sorted(chosen)


def fold(block: Block) -> Folded | None:
    """The block with its repeats folded, or None if it has none (or folding would not give a valid block)."""
    runs = find(block)
    if not runs:
        return None
    ops = block.ops
    rep: dict[str, str] = {}  # op id -> the folded op standing for it
    copies: dict[str, list[str]] = {}
    for s, L, k in runs:
        for q in range(L):
            first = ops[s + q].id
            copies[first] = [ops[s + t * L + q].id for t in range(k)]
            for i in copies[first]:
                rep[i] = first
    by_id = {o.id: o for o in ops}
    merged: list[Op] = []
    for op in ops:
        r = rep.get(op.id, op.id)
        if r != op.id:
            continue  # a later copy: summed into the first
        group = [by_id[i] for i in copies.get(r, [r])]
        # a running sum reads the copy before it: the first copy's input from outside stands for that chain
        inputs = [i for i in dict.fromkeys(rep.get(i, i) for o in group for i in o.inputs) if i != r]
        saves = list(dict.fromkeys(rep.get(i, i) for o in group for i in o.saves))
        merged.append(op.model_copy(update={
            "inputs": inputs, "saves": saves,
            "fwd_s": sum(o.fwd_s for o in group), "bwd_s": sum(o.bwd_s for o in group),
            "recompute_s": None if all(o.recompute_s is None for o in group)
            else sum(o.fwd_s if o.recompute_s is None else o.recompute_s for o in group),
            "bwd_overlap_s": sum(o.bwd_overlap_s for o in group), "flops": sum(o.flops for o in group),
            "out_bytes": sum(o.out_bytes for o in group), "aux_bytes": sum(o.aux_bytes for o in group)}))
    try:
        folded = Block(name=block.name, input_bytes=block.input_bytes, output_bytes=block.output_bytes, ops=merged)
    except ValueError:
        return None
    return Folded(folded, {r: tuple(ids) for r, ids in copies.items()}, rep, len(runs))
