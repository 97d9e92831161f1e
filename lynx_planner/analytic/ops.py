"""The op-list builder of analytic profiles: GEMMs, memory-bound ops, norms, dropout and collectives with roofline
times (costs.py), and Megatron's tensor-parallel collectives. `OpList.gemm` is the one place a GEMM's time is
computed."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import costs
from ..schema import BLOCK_INPUT, Hardware, Op, ParallelConfig

ACT = 2  # bytes per activation element (bf16)
MASK = 1  # bytes per dropout-mask element (bool)
STAT = 4  # bytes per LayerNorm statistic / logsumexp element (fp32)


def bytes_per_param(par: ParallelConfig) -> float:
    """Static bytes per parameter at the setup's sharding level: Megatron's mixed-precision Adam (bf16 weight 2 +
    fp32 grad 4 + fp32 master, m, v 12 = 18 bytes; the distributed optimizer shards the 12 optimizer bytes), or FSDP
    (parallel/fsdp.py)."""
    from ..parallel import bytes_per_param as sharded

    return sharded(par)


def grad_accum_bytes(par: ParallelConfig) -> float:
    """Bytes per weight element that accumulating a micro-batch's weight gradient moves outside its GEMM, averaged
    over the micro-batches: none with Megatron's gradient-accumulation fusion (the weight-gradient GEMM adds into the
    fp32 main_grad); without it, an add pass (read the new 16-bit gradient, read and write the accumulator: 16-bit
    .grad or fp32 main_grad) on every micro-batch but the first, which autograd stores as it is."""
    if par.gradient_accumulation_fusion:
        return 0.0
    acc = 4 if par.grad_reduce_in_fp32 else ACT
    return (ACT + 2 * acc) * (par.num_microbatches - 1) / par.num_microbatches


@dataclass
class _OpList:
    """Appends ops in forward order; `last` is the id of the latest op producing the running activation.
    `accum`: grad_accum_bytes of the setup, added to each weight GEMM's backward."""

    hw: Hardware
    ops: list[Op] = field(default_factory=list)
    last: str = BLOCK_INPUT
    accum: float = 0.0
    context: int = 1  # context-parallel ranks: attention's keys span this many times the local tokens (parallel/cp.py)

    def add(self, id: str, *, inputs: list[str] | None = None, saves: list[str] | None = None, **kw) -> str:
        saves = [id if ref == "self" else ref for ref in saves or []]  # "self": the op's own output
        self.ops.append(Op(id=id, inputs=inputs if inputs is not None else [self.last], saves=saves,
                           module=id.split(":")[0], **kw))
        self.last = id
        return id

    def gemm(self, id: str, m: int, k: int, n: int, saves: list[str], inputs: list[str] | None = None,
             tags: list[str] | None = None, batch: int = 1) -> str:
        """[m, k] @ [k, n], or `batch` such products in one batched kernel (activations both: no weight)."""
        accum = costs.memory_s(self.accum * k * n, self.hw) if self.accum and batch == 1 else 0.0
        return self.add(id, inputs=inputs, saves=saves, fwd_s=costs.gemm_fwd_s(m, k, n, self.hw, batch),
                        bwd_s=costs.gemm_bwd_s(m, k, n, self.hw, batch) + accum, flops=2.0 * batch * m * k * n,
                        out_bytes=ACT * batch * m * n, tags=tags or [])

    def elementwise(self, id: str, out_bytes: int, fwd_rw: float, bwd_rw: float, **kw) -> str:
        return self.add(id, fwd_s=costs.memory_s(fwd_rw, self.hw), bwd_s=costs.memory_s(bwd_rw, self.hw),
                        out_bytes=out_bytes, **kw)

    def layer_norm(self, id: str, tokens: int, hidden: int) -> str:
        x = ACT * tokens * hidden
        return self.elementwise(id, x, 2 * x, 3 * x, saves=[self.last], aux_bytes=2 * STAT * tokens)

    def dropout(self, id: str, elems: int, tags: list[str] | None = None) -> str:
        x = ACT * elems
        return self.elementwise(id, x, 2 * x + MASK * elems, 2 * x + MASK * elems, aux_bytes=MASK * elems,
                                random=True, tags=tags or [])

    def collective(self, id: str, fwd_s: float, bwd_s: float, out_bytes: int, bwd_overlap_s: float = 0.0) -> str:
        # A backward-only collective (fwd_s == 0) passes its input through: nothing reads its output.
        if fwd_s == 0.0:
            self.ops.append(Op(id=id, kind="collective", fwd_s=0.0, bwd_s=bwd_s, bwd_overlap_s=bwd_overlap_s,
                               out_bytes=0, inputs=[self.last], module=id.split(":")[0]))
            return self.last
        return self.add(id, kind="collective", fwd_s=fwd_s, bwd_s=bwd_s, bwd_overlap_s=bwd_overlap_s,
                        out_bytes=out_bytes)


class _TP:
    """Megatron's conjugate collectives around column- and row-parallel GEMMs."""

    def __init__(self, par: ParallelConfig, hw: Hardware, tokens: int, hidden: int):
        self.t, self.sp, self.async_grad = par.tp, par.sequence_parallel, par.async_tp_allreduce
        self.bus = costs.link(hw, par.tp)
        self.full = ACT * tokens * hidden  # bytes of an unsplit [s, b, h] activation

    def before_column(self, ops: _OpList, module: str, wgrad_s: float) -> str:
        """Before a column-parallel GEMM: all-gather (SP) or identity with a backward all-reduce; that backward
        collective runs beside the GEMM's weight gradient (`wgrad_s`) only with the async all-reduce."""
        if self.t == 1:
            return ops.last
        wgrad_s = wgrad_s if self.async_grad else 0.0
        if self.sp:
            c = costs.all_gather_s(self.full, self.t, self.bus)
            return ops.collective(f"{module}:tp_all_gather#0", c, c, self.full, bwd_overlap_s=wgrad_s)
        c = costs.all_reduce_s(self.full, self.t, self.bus)
        return ops.collective(f"{module}:tp_grad_all_reduce#0", 0.0, c, 0, bwd_overlap_s=wgrad_s)

    def after_row(self, ops: _OpList, module: str) -> str:
        """After a row-parallel GEMM: all-reduce (or reduce-scatter with SP) of its partial sums."""
        if self.t == 1:
            return ops.last
        if self.sp:
            c = costs.all_gather_s(self.full, self.t, self.bus)
            return ops.collective(f"{module}:tp_reduce_scatter#0", c, c, self.full // self.t)
        c = costs.all_reduce_s(self.full, self.t, self.bus)
        return ops.collective(f"{module}:tp_all_reduce#0", c, 0.0, self.full)




# Bytes Megatron's vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py, unfused, the default)
# moves per logit. Forward: the cast to fp32 (read 2, write 4), the max (read 4), subtracting it in place (8), exp in
# place (8), the sum (read 4), dividing by it in place (8). Backward: the gradient scaled in place (8) and cast back
# to the logits' bf16 (read 4, write 2). Its max/sum all-reduces over TP carry one number per token.
CE_FWD_BYTES = 2 + 4 + 4 + 8 + 8 + 4 + 8
CE_BWD_BYTES = 8 + 4 + 2


def cross_entropy_s(tokens: int, vocab_per_rank: int, hw: Hardware, tp: int) -> tuple[float, float]:
    """(forward, backward) seconds of the vocab-parallel cross-entropy over `tokens` x `vocab_per_rank` logits: six
    memory-bound passes forward, two backward (CE_FWD_BYTES, CE_BWD_BYTES), plus three all-reduce latencies forward
    (max, predicted logit, sum of exponentials) under TP."""
    elems = tokens * vocab_per_rank
    lat = 3 * costs.link(hw, tp)[1] if tp > 1 else 0.0
    return costs.memory_s(CE_FWD_BYTES * elems, hw) + lat, costs.memory_s(CE_BWD_BYTES * elems, hw)


def ew(ops: _OpList, id: str, out_bytes: int, inputs: list[str] | None = None, saves: list[str] | None = None,
       read: int | None = None, **kw) -> str:
    """A memory-bound op reading `read` bytes (default: as many as it writes); backward reads and writes twice that."""
    rw = out_bytes + (out_bytes if read is None else read)
    return ops.elementwise(id, out_bytes, rw, 2 * rw, inputs=inputs, saves=saves or [], **kw)


def hf_rms_norm(ops: _OpList, prefix: str, src: str, elems: int, rows: int) -> str:
    """Hugging Face's RMSNorm in bf16: x.float(), pow, mean, add eps, rsqrt, mul, back to bf16, times the weight.
    Autograd keeps the fp32 input copy, the fp32 rstd and the bf16 normalised input (the weight product's)."""
    x32 = ew(ops, f"{prefix}:_to_copy#0", STAT * elems, inputs=[src], read=ACT * elems)
    ew(ops, f"{prefix}:pow#0", STAT * elems, saves=[x32])
    ew(ops, f"{prefix}:mean#0", STAT * rows, read=STAT * elems)
    ew(ops, f"{prefix}:add#0", STAT * rows)
    rstd = ew(ops, f"{prefix}:rsqrt#0", STAT * rows, saves=["self"])
    ew(ops, f"{prefix}:mul#0", STAT * elems, inputs=[x32, rstd], saves=[rstd, x32])
    y = ew(ops, f"{prefix}:_to_copy#1", ACT * elems, read=STAT * elems)
    return ew(ops, f"{prefix}:mul#1", ACT * elems, saves=[y])
