"""Traces one block (forward and backward) into the profile's op graph: ids, bytes, saved tensors, FLOPs, tags.

Run on a module built under FakeTensorMode (CPU fakes) nothing is allocated, so a 20B-class layer traces on a laptop;
a real module is traced the same way, for real.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch
from torch._guards import detect_fake_mode
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from ..schema import BLOCK_INPUT, Block, Op
from .recorder import GEMM, Cost, OpRecord, OpRecorder, is_attention_kernel, storage_key, tensor_bytes, tensors_in


def _query_heads(query, key, value):
    """Key/value shapes with the query's head count: grouped-query attention broadcasts its key/value heads, and
    torch before 2.13 rejects the grouped shapes in its attention formulas (an AssertionError mid-profile)."""
    def widened(shape):
        return (*shape[:1], query[1], *shape[2:])
    return query, widened(key), widened(value)


def _forward(q, k, v, *a, out_shape=None, **kw):
    return sdpa_flop_count(*_query_heads(q, k, v))


def _backward(go, q, k, v, *a, out_shape=None, **kw):
    return sdpa_backward_flop_count(go, *_query_heads(q, k, v))


# Keyed by OpOverloadPacket (FlopCounterMode ignores overloads). FlopCounterMode has no formula for the CPU
# flash-attention kernels, and before torch 2.13 none for grouped-query attention on any device. Like torch's, these
# count non-causal attention; the roofline halves causal attention.
_KERNELS = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_flash_attention", "_scaled_dot_product_cudnn_attention")
SDPA_FLOPS = {op: formula for name in _KERNELS for op, formula in (
    (getattr(torch.ops.aten, name, None), _forward), (getattr(torch.ops.aten, name + "_backward", None), _backward))
    if op is not None}  # an older torch lacks some kernels

CORE_ATTN = "core_attn"
_BATCHED_GEMMS = ("bmm", "baddbmm", "matmul")


@dataclass
class TracedOp:
    id: str
    module: str
    name: str
    kind: str
    inputs: list[str]
    out_bytes: int
    random: bool
    inplace: bool
    reads_param: bool
    fwd: Cost
    bwd: Cost
    saves: list[str] = field(default_factory=list)
    aux_bytes: int = 0
    tags: list[str] = field(default_factory=list)
    heads: tuple[int, ...] = ()


@dataclass
class BlockTrace:
    ops: list[TracedOp]
    input_bytes: int
    output_bytes: int

    @property
    def saved_bytes(self) -> int:
        """Bytes autograd holds after the forward (block input and output excluded)."""
        needed = {ref for op in self.ops for ref in op.saves}
        return sum(op.out_bytes * (op.id in needed) + op.aux_bytes for op in self.ops)


def split_arguments(args: tuple, kwargs: dict) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """The block input (first tensor argument) and the other tensor arguments (masks, rotary tables...)."""
    tensors = tensors_in((args, kwargs))
    return (tensors[0] if tensors else None), tensors[1:]


def fresh_arguments(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Detached copies of the tensor arguments, the first one a leaf requiring grad (if floating point)."""
    first, _ = split_arguments(args, kwargs)

    def fresh(x: object) -> object:
        if not isinstance(x, torch.Tensor):
            return x
        grad = x is first and x.is_floating_point() or (x.requires_grad and x is not first)
        return x.detach().requires_grad_(grad)

    return tree_map(fresh, args), tree_map(fresh, kwargs)


def op_ids(module: torch.nn.Module, args: tuple, kwargs: dict,
           context: Callable[[], AbstractContextManager] | None = None) -> tuple[str, ...]:
    """The ids of the ops one forward of `module` runs, views included (what the runtime names), in call order."""
    rec = run_block(module, args, kwargs, backward=False, context=context)[0]
    return tuple(r.id for r in rec.records)


def run_block(module: torch.nn.Module, args: tuple, kwargs: dict, *, timed: bool = False,
              backward: bool = True, context: Callable[[], AbstractContextManager] | None = None,
              ) -> tuple[OpRecorder, object, dict]:
    """One recorded forward (and backward) of `module`; returns the recorder, the output and the saved tensors.
    The forward runs under `context()` (autocast: the training precision), the backward outside it, as in training."""
    args, kwargs = fresh_arguments(args, kwargs)
    first, others = split_arguments(args, kwargs)
    fake = detect_fake_mode((args, kwargs, list(module.parameters())))
    packed: dict = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        packed.setdefault(storage_key(t), t)
        return t

    with contextlib.ExitStack() as stack:
        if fake is not None:
            stack.enter_context(fake)
        flops = None if timed else stack.enter_context(FlopCounterMode(display=False, custom_mapping=SDPA_FLOPS))
        rec = OpRecorder(module, first, others, flop_counter=flops, timed=timed)
        # The pack hook finds saved tensors for the trace, but `packed` holds them alive through the backward, which
        # then cannot free and reuse their memory: in timed runs the backward kernels would write to fresh, cold
        # pages (CPU: +30% on an HF GPT-2 block's backward, mostly page faults in elementwise kernels). Timed runs
        # need no saved-tensor info, so they run without it.
        with (contextlib.nullcontext() if timed else torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)), \
                (context() if context is not None else contextlib.nullcontext()), rec:
            out = module(*args, **kwargs)
        rec.finish_forward()
        saved = {} if timed else _saved_by_op(rec, packed)
        grads_of = [t for t in tensors_in(out) if t.requires_grad]
        if backward and grads_of:
            with rec:
                torch.autograd.backward(grads_of, [torch.ones_like(t) for t in grads_of])
        rec.finish_backward()  # breaks the recorder <-> autograd graph cycle (see OpRecorder.finish_backward)
    return rec, out, saved


def _node_saved_tensors(node: torch.autograd.graph.Node) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for attr in dir(node):
        if attr.startswith("_saved_"):
            with contextlib.suppress(RuntimeError):
                found += tensors_in(getattr(node, attr))
    with contextlib.suppress(RuntimeError, AttributeError):  # custom autograd.Function nodes
        found += tensors_in(node.saved_tensors)
    return found


def _saved_by_op(rec: OpRecorder, packed: dict) -> dict:
    """{op id: (saved producer ids, {storage: aux bytes})}: who saves what, from the autograd nodes.

    Secondary outputs (LayerNorm statistics, dropout masks, logsumexp) count as their producer's aux bytes; primary
    outputs are listed in the saving op's `saves`. A saved storage no node exposes (packed by a hook only) is
    charged to its producer, which keeps the bytes exact."""
    saves: dict[str, list[str]] = {}
    aux: dict[str, dict] = {}
    seen: set = set()

    def charge(consumer: str, t_key) -> None:
        if t_key in rec.params or t_key in rec.excluded or t_key not in rec.owner:
            return
        seen.add(t_key)
        producer, index = rec.owner[t_key]
        if index > 0:
            aux.setdefault(producer, {})[t_key] = rec.storage_bytes[t_key]
        elif producer not in saves.setdefault(consumer, []):
            saves[consumer].append(producer)

    for node, op_id in rec.node_op.items():
        for t in _node_saved_tensors(node):
            charge(op_id, storage_key(t))
    for t_key in packed:
        if t_key not in seen and t_key in rec.owner and rec.owner[t_key][0] != BLOCK_INPUT:
            charge(rec.owner[t_key][0], t_key)
    return {op: (saves.get(op, []), aux.get(op, {})) for op in set(saves) | set(aux)}


def _tag_core_attention(ops: list[TracedOp]) -> None:
    """Attention kernels, and the span from a batched activation-activation GEMM (q kᵀ) to the next one (p v)."""
    open_span = False
    for op in ops:
        gemm = op.kind == GEMM and not op.reads_param and op.name in _BATCHED_GEMMS
        if is_attention_kernel(op.name) or gemm or open_span:
            op.tags.append(CORE_ATTN)
        if gemm:
            open_span = not open_span


def _traced_op(r: OpRecord, saved: dict) -> TracedOp:
    saves, aux = saved.get(r.id, ([], {}))
    return TracedOp(id=r.id, module=r.module, name=r.name, kind=r.kind, inputs=r.inputs, out_bytes=r.out_bytes,
                    random=r.random, inplace=r.inplace, reads_param=r.reads_param, fwd=r.fwd, bwd=r.bwd,
                    saves=saves, aux_bytes=sum(aux.values()), heads=r.heads)


def trace(module: torch.nn.Module, args: tuple, kwargs: dict | None = None,
          context: Callable[[], AbstractContextManager] | None = None) -> BlockTrace:
    """The op graph of one forward of `module` with FLOPs and bytes, and the backward work charged to each op."""
    kwargs = kwargs or {}
    rec, out, saved = run_block(module, args, kwargs, context=context)
    ops = [_traced_op(r, saved) for r in rec.records if not r.view]
    _tag_core_attention(ops)
    first, _ = split_arguments(args, kwargs)
    outs = tensors_in(out)
    return BlockTrace(ops=ops, input_bytes=tensor_bytes(first) if first is not None else 0,
                      output_bytes=tensor_bytes(outs[0]) if outs else 0)


def to_block(name: str, traced: BlockTrace, times: dict[str, tuple[float, float]]) -> Block:
    """The schema block; `times` maps op id -> (forward, backward) seconds (missing: 0)."""
    ops = [
        Op(id=op.id, fwd_s=times.get(op.id, (0.0, 0.0))[0], bwd_s=times.get(op.id, (0.0, 0.0))[1],
           flops=op.fwd.gemm_flops + op.fwd.attention_flops, out_bytes=op.out_bytes, aux_bytes=op.aux_bytes,
           inputs=op.inputs, saves=op.saves, random=op.random, inplace=op.inplace, tags=op.tags, module=op.module)
        for op in traced.ops
    ]
    return Block(name=name, input_bytes=traced.input_bytes, output_bytes=traced.output_bytes, ops=ops)


def trace_block(module: torch.nn.Module, example_input: torch.Tensor | tuple, *, kwargs: dict | None = None,
                name: str | None = None) -> Block:
    """The op graph of `module` (times 0): what the runtime matches plans against. `example_input` is the block's
    input tensor or its tuple of positional arguments."""
    args = example_input if isinstance(example_input, tuple) else (example_input,)
    return to_block(name or type(module).__name__, trace(module, args, kwargs), {})
