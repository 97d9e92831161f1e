"""`lynx profile --compile`: a block type's profile as torch.compile runs it, so that HEU plans for the kernels that
will run.

Each block type's instance is compiled as the runtime compiles a planned layer (runtime/compiled.py): its forward in a
selective-checkpoint region whose policy saves every op, as a plan that recomputes nothing does. That compiled block
is measured, and the eager profile's ops are adjusted to it:

- times: inductor fuses the elementwise ops (norms, rotary, activations, residual adds) into a few loops and calls
  library kernels for the GEMMs and attention. The GEMM and attention ops ("extern": ops with FLOPs) keep their
  eager times (the same kernels); the rest of the compiled block's measured forward and backward time is shared among
  the other ops in proportion to their eager times. A recomputed elementwise op then costs its share of the fused
  loops, not a kernel of its own: what it costs inside a compiled backward.
- bytes: a dropout compiles to one `native_dropout` saving a bool mask (1 byte an element) where the eager CPU
  dropout saves its scaled mask in the activations' dtype; the mask op's bytes become the bool mask's. The compiled
  block's saved tensors are measured (the autograd graph behind its output, block input, other arguments and
  parameters excluded) and returned beside the prediction, so that a difference is reported, not hidden.

A recomputed random op also saves its RNG state compiled (5,056 B on the CPU generator, 16 B on CUDA); the profile
does not count it.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from ..opid import make_id, split_id
from ..schema import Block
from .recorder import tensors_in
from .tracing import fresh_arguments, split_arguments

Times = dict[str, tuple[float, float]]


def fused_times(times: Times, extern: set[str], compiled: tuple[float, float]) -> Times:
    """Per-op (forward, backward) seconds under compile: `extern` ops keep theirs; the other ops share what the
    compiled block's time leaves after the extern ops (never below 0) in proportion to their eager times."""
    out = dict(times)
    for i in (0, 1):
        fixed = sum(t[i] for op, t in times.items() if op in extern)
        rest = sum(t[i] for op, t in times.items() if op not in extern)
        scale = max(0.0, compiled[i] - fixed) / rest if rest > 0 else 0.0
        for op, t in out.items():
            if op not in extern:
                out[op] = (t[0] * scale, t[1]) if i == 0 else (t[0], t[1] * scale)
    return out


def dropout_masks(block: Block) -> list[str]:
    """The ops holding an eager CPU dropout's scaled mask: `div_#k` after `bernoulli_#k` in the same module."""
    ids = {op.id for op in block.ops}
    masks = []
    for op in block.ops:
        path, name, k = split_id(op.id)
        if name == "div_" and make_id(path, "bernoulli_", k) in ids:
            masks.append(op.id)
    return masks


def with_bool_masks(block: Block, itemsize: int) -> Block:
    """The block with each dropout mask as compiled dropout saves it: bool, 1 byte an element (eager: `itemsize`)."""
    masks = set(dropout_masks(block))
    ops = [op.model_copy(update={"out_bytes": op.out_bytes // itemsize}) if op.id in masks else op
           for op in block.ops]
    return block.model_copy(update={"ops": ops})


def saved_bytes(out: object, ignore: list[torch.Tensor]) -> int:
    """Bytes of the storages the autograd graph behind `out` holds for backward (a compiled graph's saved tensors are
    its CompiledFunctionBackward's; eager nodes' too), `ignore`'s storages excluded. Reading a saved tensor unpacks
    it: not for graphs under saved-tensor hooks that recompute on unpacking (lynx's eager runtime)."""
    skip = {t.untyped_storage()._cdata for t in ignore}
    counted: dict[int, int] = {}
    todo, done = [t.grad_fn for t in tensors_in(out) if t.grad_fn is not None], set()
    while todo:
        node = todo.pop()
        if node is None or node in done:
            continue
        done.add(node)
        for t in _saved_by(node):
            if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in skip:
                counted[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
        todo.extend(f for f, _ in node.next_functions)
    return sum(counted.values())


def _saved_by(node: object) -> list:
    """The tensors an autograd node saved: a custom or compiled function's `saved_tensors`, an eager node's
    `_saved_<name>` attributes."""
    saved = list(getattr(node, "saved_tensors", None) or ())
    for name in dir(node):
        if name.startswith("_saved_"):
            value = getattr(node, name)
            saved += list(value) if isinstance(value, (tuple, list)) else [value]
    return saved


def keep_all(module: nn.Module, ops: list[str], backend: str = "inductor") -> Callable:
    """`module` compiled as the runtime compiles a planned layer that keeps every op (runtime/compiled.py)."""
    from ..runtime import compiled

    make = compiled.context_fn("block", module, frozenset(ops), frozenset(), lambda op: True)

    def region(*args, **kwargs):
        return compiled.run(module, args, kwargs, make)

    return torch.compile(region, backend=backend)


def measure(module: nn.Module, args: tuple, kwargs: dict, ops: list[str], *, runs: int = 5, warmup: int = 2,
            context: Callable | None = None, clock: Callable[[], float] = time.perf_counter,
            backend: str = "inductor") -> tuple[float, float, int]:
    """Median (forward, backward) seconds of the compiled block (compiled in the first warm-up run) and the bytes its
    graph saves for backward (block input, other tensor arguments and parameters excluded)."""
    region = keep_all(module, ops, backend)
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fwd, bwd, saved = [], [], 0
    for i in range(max(1, warmup) + runs):
        a, k = fresh_arguments(args, kwargs)
        sync()
        t0 = clock()
        with context() if context is not None else contextlib.nullcontext():
            out = region(*a, **k)
        sync()
        t1 = clock()
        if i == 0:
            first, others = split_arguments(a, k)
            saved = saved_bytes(out, [t for t in (first, *others) if t is not None] + list(module.parameters()))
        grads_of = [t for t in tensors_in(out) if t.requires_grad]
        if grads_of:
            torch.autograd.backward(grads_of, [torch.ones_like(t) for t in grads_of])
        sync()
        t2 = clock()
        if i >= max(1, warmup):
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    for p in module.parameters():
        p.grad = None
    return statistics.median(fwd), statistics.median(bwd), saved


__all__ = ["dropout_masks", "fused_times", "keep_all", "measure", "saved_bytes", "with_bool_masks"]
