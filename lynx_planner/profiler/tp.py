"""Megatron tensor parallelism applied to a block traced without it (`--tp N` on a plain model).

Rule, by dataflow within a block: a GEMM that reads a weight (Linear, HF Conv1D) is *column* parallel when its input
is replicated and *row* parallel when its input is already split. So the q/k/v or fused qkv projections and the
up/gate projections (they read the replicated LayerNorm output) are column parallel, and the attention output and
down projections (they read data derived from column outputs) are row parallel. Every op reading split data is split
too (attention heads, activation functions), so its bytes and time are divided by N — which divides the head count.
Embedding lookups are vocabulary parallel (split weight, all-reduced output), like row-parallel GEMMs.
Collectives are those of `analytic._TP`, with the same ids: before the first column GEMM reading a tensor a backward
all-reduce (sequence parallel: an all-gather), after each row GEMM an all-reduce (sequence parallel: a
reduce-scatter). With sequence parallelism the ops outside the split regions (norms, dropout, residuals) work on
1/N of the sequence. Times of split ops are divided by N, measured ones too.
"""

from __future__ import annotations

from torch import nn

from .. import costs
from ..io import InputError, LayoutError
from ..schema import BLOCK_INPUT, Block, Hardware, Op, ParallelConfig
from .recorder import GEMM
from .tracing import BlockTrace

COLUMN, ROW = "column", "row"


def roles(traced: BlockTrace) -> tuple[dict[str, str], dict[str, str], set[str]]:
    """COLUMN/ROW by module path and by op id (weight GEMMs, embeddings), and the ids of ops whose output is split."""
    role: dict[str, str] = {}
    op_role: dict[str, str] = {}
    split: set[str] = set()
    for op in traced.ops:
        reads_split = any(i in split for i in op.inputs)
        if op.reads_param and op.name == "embedding":
            role[op.module] = op_role[op.id] = ROW
        elif op.reads_param and op.kind == GEMM:
            op_role[op.id] = role.setdefault(op.module, ROW if reads_split else COLUMN)
            if op_role[op.id] == COLUMN:
                split.add(op.id)
        elif reads_split:
            split.add(op.id)
    return role, op_role, split


def rank_params(layer: nn.Module, role: dict[str, str], tp: int, seen: set[int]) -> int:
    """Parameters of `layer` on one TP rank; `seen` skips parameters shared with earlier layers (tied weights)."""
    total = 0
    for module_path, module in layer.named_modules():
        kind = role.get(module_path)
        for name, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if kind is None or (kind == ROW and name == "bias"):
                total += p.numel()
            elif p.numel() % tp:
                raise LayoutError(f"--tp {tp} does not divide {module_path}.{name} ({tuple(p.shape)})")
            else:
                total += p.numel() // tp
    return total


def _scaled(op: Op, t: int, out_too: bool) -> Op:
    update = {"fwd_s": op.fwd_s / t, "bwd_s": op.bwd_s / t, "flops": op.flops / t}
    if out_too:
        update |= {"out_bytes": op.out_bytes // t, "aux_bytes": op.aux_bytes // t}
    return op.model_copy(update=update)


def _collective(op_id: str, fwd: float, bwd: float, out_bytes: int, inputs: list[str], overlap: float = 0.0) -> Op:
    return Op(id=op_id, kind="collective", fwd_s=fwd, bwd_s=bwd, bwd_overlap_s=overlap, out_bytes=out_bytes,
              inputs=inputs, module=op_id.split(":")[0])


def shard(block: Block, traced: BlockTrace, par: ParallelConfig, hw: Hardware) -> Block:
    """`block` (traced on one device, with times) as seen by one of `par.tp` Megatron tensor-parallel ranks."""
    t, sp = par.tp, par.sequence_parallel
    if t == 1:
        return block
    _, op_role, split = roles(traced)
    full = {BLOCK_INPUT: block.input_bytes} | {op.id: op.out_bytes for op in block.ops}
    bus = costs.link(hw, t)
    rename: dict[str, str] = {}  # row GEMM -> the collective that now carries its output
    gathered: dict[str, str] = {}  # replicated tensor -> collective before the column GEMMs reading it
    ops: list[Op] = []
    for op in block.ops:
        op = op.model_copy(update={"inputs": [rename.get(i, i) for i in op.inputs],
                                   "saves": [rename.get(s, s) for s in op.saves]})
        kind = op_role.get(op.id)
        if kind == COLUMN:
            op = _scaled(op, t, out_too=True)
            src = op.inputs[0] if op.inputs else BLOCK_INPUT
            if src not in gathered:
                gathered[src] = _before_column(ops, op, src, full[src], t, sp, bus, par.async_tp_allreduce)
            if sp:
                op = op.model_copy(update={"inputs": [gathered[src] if i == src else i for i in op.inputs]})
            ops.append(op)
        elif kind == ROW:
            ops.append(_scaled(op, t, out_too=False))
            rename[op.id] = _after_row(ops, op, t, sp, bus)
        else:
            ops.append(_scaled(op, t, out_too=True) if op.id in split or sp else op)
    div = t if sp else 1
    return Block(name=block.name, input_bytes=block.input_bytes // div, output_bytes=block.output_bytes // div,
                 ops=ops)


def _before_column(ops: list[Op], gemm: Op, src: str, nbytes: int, t: int, sp: bool, bus, async_grad: bool) -> str:
    overlap = gemm.fwd_s if async_grad else 0.0  # the weight gradient's GEMM, beside the async backward collective
    if sp:
        c = costs.all_gather_s(nbytes, t, bus)
        ops.append(_collective(f"{gemm.module}:tp_all_gather#0", c, c, nbytes, [src], overlap=overlap))
    else:
        c = costs.all_reduce_s(nbytes, t, bus)
        ops.append(_collective(f"{gemm.module}:tp_grad_all_reduce#0", 0.0, c, 0, [src], overlap=overlap))
    return ops[-1].id if sp else src


def _after_row(ops: list[Op], gemm: Op, t: int, sp: bool, bus) -> str:
    nbytes = gemm.out_bytes
    if sp:
        c = costs.all_gather_s(nbytes, t, bus)
        ops.append(_collective(f"{gemm.module}:tp_reduce_scatter#0", c, c, nbytes // t, [gemm.id]))
    else:
        c = costs.all_reduce_s(nbytes, t, bus)
        ops.append(_collective(f"{gemm.module}:tp_all_reduce#0", c, 0.0, nbytes, [gemm.id]))
    return ops[-1].id
