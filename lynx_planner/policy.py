"""The keep/recompute algebra of one block: what a keep set holds, what must then be recomputed, and its cost.

A *saved unit* is an op whose tensors some backward needs: its output (when another op's backward saves it) and its
`aux_bytes` (masks, statistics). Keeping a unit holds those tensors from forward to backward; a unit that is not kept
is recomputed, and so, transitively, is every op whose output a recomputed op reads and that is not kept (the
recompute stops early there, as PyTorch's non-reentrant checkpoint does). The block input is always kept. Forward
collectives may also be kept (their output), so that recomputation never repeats a TP collective. View ops are
transparent: they stand for the op that produced their storage. An op tagged OUTSIDE runs after the layer's module,
in the training stack's own code (the loss after the output head): no plan keeps or recomputes it (the runtime cannot
act on it), and what it saves is held from forward to backward whatever the plan, like the block input.
"""

from __future__ import annotations

from dataclasses import dataclass

from .memo import per_object
from .schema import BLOCK_INPUT, Block

OUTSIDE = "outside"  # Op tag: the op runs outside the layer's module (see the module docstring)


@dataclass(frozen=True)
class BlockInfo:
    block: Block
    order: dict[str, int]  # op id -> position
    base: dict[str, str]  # op id -> id of the op owning its storage (itself unless a view)
    inputs: dict[str, tuple[str, ...]]  # resolved through views
    needed_out: frozenset[str]  # ops whose output some backward saves
    units: tuple[str, ...]  # saved units, in op order
    keepable: tuple[str, ...]  # saved units and forward collectives, in op order
    unit_bytes: dict[str, int]  # bytes held when an op is kept
    fwd_s: dict[str, float]  # op id -> its recomputation seconds (recompute_s, else fwd_s)
    collective: frozenset[str]
    held_bytes: int = 0  # what OUTSIDE ops save: held whatever the plan


@per_object
def analyse(block: Block) -> BlockInfo:
    """Derived facts of a block (cached; blocks are not mutated once loaded)."""
    base: dict[str, str] = {BLOCK_INPUT: BLOCK_INPUT}
    for op in block.ops:
        base[op.id] = base[op.inputs[0]] if op.view and op.inputs else op.id
    needed: set[str] = set()
    for op in block.ops:
        needed.update(base[ref] for ref in op.saves)
    needed.discard(BLOCK_INPUT)
    outside = {op.id for op in block.ops if OUTSIDE in op.tags}
    real = [op for op in block.ops if not op.view]
    units = tuple(op.id for op in real if op.id not in outside and (op.id in needed or op.aux_bytes > 0))
    collective = frozenset(op.id for op in real if op.kind == "collective" and op.id not in outside)
    fwd_coll = tuple(op.id for op in real if op.id in collective and op.fwd_s > 0 and op.out_bytes > 0)
    keepable = tuple(op.id for op in real if op.id in units or op.id in fwd_coll)
    unit_bytes = {
        op.id: (op.out_bytes if (op.id in needed or op.id in collective) else 0) + op.aux_bytes for op in real
    }
    return BlockInfo(
        block=block,
        order={op.id: i for i, op in enumerate(block.ops)},
        base=base,
        inputs={op.id: tuple(dict.fromkeys(base[i] for i in op.inputs)) for op in real},
        needed_out=frozenset(needed),
        units=units,
        keepable=keepable,
        unit_bytes=unit_bytes,
        fwd_s={op.id: op.fwd_s if op.recompute_s is None else op.recompute_s for op in real},
        collective=collective,
        held_bytes=sum(unit_bytes[o] for o in outside if o in unit_bytes),
    )


def _holds_output(info: BlockInfo, op: str, keep: frozenset[str]) -> bool:
    return op == BLOCK_INPUT or (op in keep and (op in info.needed_out or op in info.collective))


def closure(info: BlockInfo, keep: frozenset[str]) -> tuple[str, ...]:
    """The ops to recompute when only `keep` is held: unkept units and what they need, in op order."""
    todo = [u for u in info.units if u not in keep]
    rec: set[str] = set()
    while todo:
        op = todo.pop()
        if op in rec:
            continue
        rec.add(op)
        todo.extend(i for i in info.inputs[op] if not _holds_output(info, i, keep) and i not in rec)
    return tuple(sorted(rec, key=info.order.__getitem__))


@dataclass(frozen=True)
class PolicyCost:
    kept_bytes: int  # per micro-batch, block input included
    recomputed_bytes: int  # saved tensors regenerated before the backward
    recompute_s: float
    replays_collective: bool  # recomputation repeats a TP collective: it can only run on demand


def cost(info: BlockInfo, keep: frozenset[str], recompute: tuple[str, ...]) -> PolicyCost:
    return PolicyCost(
        kept_bytes=info.block.input_bytes + info.held_bytes + sum(info.unit_bytes[o] for o in keep),
        recomputed_bytes=sum(info.unit_bytes[o] for o in recompute if o in info.units),
        recompute_s=sum(info.fwd_s[o] for o in recompute),
        replays_collective=any(o in info.collective and info.fwd_s[o] > 0 for o in recompute),
    )


def validate(info: BlockInfo, keep: list[str], recompute: list[str]) -> str | None:
    """Why a (keep, recompute) pair is not executable, or None."""
    known = set(info.order)
    for name, ops in (("keep", keep), ("recompute", recompute)):
        unknown = [o for o in ops if o not in known]
        if unknown:
            return f"{name} names ops that block {info.block.name!r} does not have: {', '.join(unknown[:3])}"
    outside = [o for o in (*keep, *recompute) if OUTSIDE in info.block.ops[info.order[o]].tags]
    if outside:
        return (f"names ops that run outside the layer, in the training stack (a loss): {', '.join(outside[:3])}; "
                "no plan keeps or recomputes them")
    bad = [o for o in keep if o not in info.keepable]
    if bad:
        return f"keep names ops whose tensors no backward needs: {', '.join(bad[:3])}"
    both = set(keep) & set(recompute)
    need = set(closure(info, frozenset(keep)))
    missing = sorted(need - set(recompute), key=info.order.__getitem__)
    if missing:
        return f"tensors neither kept nor recomputed: {', '.join(missing[:3])}"
    kept = frozenset(keep) - both
    for op in recompute:
        for i in info.inputs.get(op, ()):
            if not _holds_output(info, i, kept) and i not in recompute:
                return f"recomputed op {op!r} reads {i!r}, which is neither kept nor recomputed"
    return None


def none_keep(info: BlockInfo) -> frozenset[str]:
    return frozenset(info.units)


def full_recompute(info: BlockInfo) -> tuple[str, ...]:
    """Megatron's full recomputation replays the whole layer forward, collectives included."""
    return tuple(op.id for op in info.block.ops if not op.view and OUTSIDE not in op.tags)


def selective_keep(info: BlockInfo) -> frozenset[str]:
    """Megatron's selective recomputation: everything but the core-attention internals."""
    tagged = {op.id for op in info.block.ops if "core_attn" in op.tags}
    return frozenset(u for u in info.units if u not in tagged)


def records_every_forward(mode: str, offload: list[str] | tuple[str, ...], collective: bool = False) -> bool:
    """Whether the torch runtime records a layer whose ops follow the MoE routing op by op at every forward under a
    policy of this mode: keeping some ops and recomputing others, or offloading, its decisions follow each forward's
    ops; recomputed in full, it keeps what the forward did not make, unrecorded, unless the forward runs a
    `collective` (the replay reads its captured output; the runtime finds it at its first forward: region.py)."""
    return mode == "selective" or bool(offload) or mode == "full" and collective


def mode_of(info: BlockInfo, keep: frozenset[str], recompute: tuple[str, ...]) -> str:
    if not recompute:
        return "none"
    return "full" if not keep else "selective"
