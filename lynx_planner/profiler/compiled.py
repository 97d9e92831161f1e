"""`lynx profile --compile`: a block type's profile as torch.compile runs it, so that HEU plans for the kernels that
will run.

Each block type's instance is compiled as the runtime compiles a layer that recomputes nothing: plainly, the
partitioner choosing what to save (runtime/compiled.py). That compiled block is measured, and the eager profile's ops
are adjusted to it:

- saved tensors: compile's partitioner saves fewer tensors than eager autograd does. It recomputes cheap elementwise
  ops (a norm's normalised input, a residual add, an activation) inside the fused backward from tensors it saves
  anyway, and saves other ones (the output projection's where it recomputes the residual add from it). Which ones it
  saves is learned from the partitioner itself: the block is compiled once more in a selective-checkpoint region
  whose policy leaves every op to the partitioner (PREFER_SAVE, as if unplanned) and stamps each traced node with its
  op id, and the forward graph's saved nodes name their ops (`saved_ops`). An op whose output the eager backward
  saves and compile does not then stands, in every op's `saves`, for the ops it is recomputed from (`compile_saves`):
  it is no saved unit of the compiled profile, so no plan keeps it (a kept op is `MUST_SAVE` in the runtime's policy,
  which would materialise a tensor compile fuses away), and keeping everything is compile's own choice, bytes
  included. A recomputed op's inputs are then recomputed or kept as the plan says, the fused op with them.
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

from .. import policy
from ..opid import make_id, split_id
from ..schema import BLOCK_INPUT, Block
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


STAMP = "lynx_op"  # node meta key: the op id a traced node belongs to


def _stamping_policy(module: nn.Module) -> Callable[[], tuple]:
    """A selective-checkpoint context_fn that leaves every op to the partitioner (PREFER_SAVE: no tag it acts on, as
    if unplanned) and stamps the graph nodes each op traced (the nodes since the previous op's) with its op id."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    from ..runtime.compiled import OpNames

    def make() -> tuple:
        names = OpNames(module)

        def policy_fn(ctx, func, *args, **kwargs):
            mode = get_proxy_mode()
            if not ctx.is_recompute and mode is not None:
                op = names(func)
                for node in reversed(mode.tracer.graph.nodes):
                    if STAMP in node.meta or node.op == "placeholder":
                        break
                    node.meta[STAMP] = op
            return CheckpointPolicy.PREFER_SAVE

        return create_selective_checkpoint_contexts(policy_fn)

    return make


def _partition_recorder(found: list[list[str | None]]) -> Callable:
    """The partitioner compile uses, recording the op stamps of the forward graph's saved tensor nodes."""
    from functorch.compile import min_cut_rematerialization_partition

    def partition(joint, joint_inputs, **kwargs):
        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
        out = next(n for n in fw.graph.nodes if n.op == "output")
        saved = [_storage_owner(n) for n in out.args[0][kwargs["num_fwd_outputs"]:]
                 if isinstance(n.meta.get("val"), torch.Tensor)]
        found.append([n.meta.get(STAMP) for n in saved if n.op != "placeholder"])
        return fw, bw
    return partition


def _storage_owner(node):
    """The node whose output a saved view node views (the profile names storage owners, not views)."""
    while node.op == "call_function" and node.args and (getattr(node.target, "is_view", False)
                                                        or node.target is torch.ops.aten._unsafe_view.default):
        node = node.args[0]
    return node


def _recording_backend(backend: str, found: list) -> tuple[object, contextlib.AbstractContextManager]:
    """`backend` with its partitioner recording (inductor's custom partitioner hook, aot_eager rebuilt with it; None
    for another backend), and the config under which it compiles (no caches: a cached graph is not partitioned
    again)."""
    from torch._functorch import config as functorch_config

    no_cache = functorch_config.patch(enable_autograd_cache=False)
    record = _partition_recorder(found)
    if backend == "inductor":
        from torch._inductor import config as inductor_config
        from torch._inductor.custom_graph_pass import CustomPartitionerFn

        class Recording(CustomPartitionerFn):
            def __call__(self, gm, joint_inputs, **kwargs):
                return record(gm, joint_inputs, **kwargs)

            def uuid(self):
                return None  # no code caching

        return "inductor", _both(no_cache, inductor_config.patch(custom_partitioner_fn=Recording(),
                                                                 fx_graph_cache=False))
    if backend == "aot_eager":
        from torch._dynamo.backends.common import aot_autograd
        from torch._dynamo.backends.debugging import boxed_nop

        return aot_autograd(fw_compiler=boxed_nop, bw_compiler=boxed_nop, partition_fn=record,
                            keep_inference_input_mutations=True), no_cache
    return None, no_cache  # another backend's partitioner cannot be read


@contextlib.contextmanager
def _both(a, b):
    with a, b:
        yield


def saved_ops(module: nn.Module, args: tuple, kwargs: dict, backend: str = "inductor",
              context: Callable | None = None) -> list[str | None] | None:
    """The op ids (as the compiled forward names them) of the tensors compile saves for the block's backward when
    no plan tags its ops, one per saved tensor (None: a saved node no op traced); its arguments and parameters
    excluded. None: `backend` is neither inductor nor aot_eager, whose partitioner it cannot read. See the module
    docstring."""
    from ..runtime import compiled

    found: list[list[str | None]] = []
    compiler, config = _recording_backend(backend, found)
    if compiler is None:
        return None
    make = _stamping_policy(module)

    def region(*a, **k):
        return compiled.run(module, a, k, make)

    a, k = fresh_arguments(args, kwargs)
    with config, context() if context is not None else contextlib.nullcontext():
        out = torch.compile(region, backend=compiler)(*a, **k)
    del out
    return [op for graph in found for op in graph]  # no graph: nothing needs a backward


def compile_saves(block: Block, saved: set[str]) -> Block:
    """The block with its backward's saved tensors as compile saves them: `saved` are the ops (eager ids, their
    storages' owners) whose outputs compile saves; an op some backward saves that is not among them is recomputed in
    the fused backward, so in every op's `saves` it stands for the ops it is recomputed from (those compile saves,
    the block input, collectives and ops outside the layer, or further such ops). Ops keep their ids and times."""
    info = policy.analyse(block)
    outside = {op.id for op in block.ops if policy.OUTSIDE in op.tags}
    memo: dict[str, tuple[str, ...]] = {}

    def sources(ref: str) -> tuple[str, ...]:
        base = info.base[ref]
        if base == BLOCK_INPUT or base in saved or base in info.collective or base in outside:
            return (ref,)
        if base not in memo:
            memo[base] = tuple(dict.fromkeys(s for i in info.inputs[base] for s in sources(i)))
        return memo[base]

    ops = []
    for op in block.ops:
        saves = list(dict.fromkeys(s for ref in op.saves for s in sources(ref)))
        ops.append(op.model_copy(update={"saves": saves}) if saves != op.saves else op)
    return block.model_copy(update={"ops": ops})


def eager_bases(block: Block, compiled_ids: list[str | None] | None, dropouts: set[str]) -> set[str] | None:
    """The block's ops (storage owners) that `saved_ops`' compiled op ids stand for (a compiled dropout's mask: the
    eager scaled mask op); None where a saved tensor names no op of the block, or `compiled_ids` is None."""
    from ..runtime.compiled import eager_ids

    if compiled_ids is None:
        return None
    info = policy.analyse(block)
    out = set()
    for op in compiled_ids:
        if op is None:
            return None
        ids = [i for i in eager_ids(op, split_id(op)[0] in dropouts) if i in info.base]
        masks = [i for i in ids if split_id(i)[1] == "div_"]  # native_dropout saves the mask
        if not ids:
            return None
        out.add(info.base[(masks or ids)[0]])
    return out


def measure(module: nn.Module, args: tuple, kwargs: dict, extern: set[str], *, runs: int = 5, warmup: int = 2,
            context: Callable | None = None, clock: Callable[[], float] = time.perf_counter,
            backend: str = "inductor") -> tuple[float, float, int, float]:
    """Median (forward, backward) seconds of the compiled block, compiled plainly as the runtime compiles a layer
    that recomputes nothing (in the first warm-up run); the bytes its graph saves for backward (block input, other
    tensor arguments and parameters excluded); and what recomputing every op but `extern` adds to its backward: the
    median of paired differences (each run beside a plain one, never below 0) of the block compiled as the runtime
    compiles a plan keeping only `extern`'s outputs (MUST_SAVE) and recomputing the rest in the fused backward."""
    from ..runtime import compiled

    def plain(*a, **k):
        return module(*a, **k)

    make = compiled.context_fn("block", module, frozenset(extern), frozenset(), lambda op: True)

    def recomputing(*a, **k):
        return compiled.run(module, a, k, make)

    regions = [torch.compile(plain, backend=backend), torch.compile(recomputing, backend=backend)]
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fwd, bwd, extra, saved = [], [], [], 0
    for i in range(max(1, warmup) + runs):
        got = []
        for j, region in enumerate(regions):
            a, k = fresh_arguments(args, kwargs)
            sync()
            t0 = clock()
            with context() if context is not None else contextlib.nullcontext():
                out = region(*a, **k)
            sync()
            t1 = clock()
            if i == 0 and j == 0:
                first, others = split_arguments(a, k)
                saved = saved_bytes(out, [t for t in (first, *others) if t is not None] + list(module.parameters()))
            grads_of = [t for t in tensors_in(out) if t.requires_grad]
            if grads_of:
                torch.autograd.backward(grads_of, [torch.ones_like(t) for t in grads_of])
            sync()
            got.append((t1 - t0, clock() - t1))
        if i >= max(1, warmup):
            fwd.append(got[0][0])
            bwd.append(got[0][1])
            extra.append(got[1][1] - got[0][1])
    for p in module.parameters():
        p.grad = None
    return statistics.median(fwd), statistics.median(bwd), saved, max(0.0, statistics.median(extra))


def recompute_times(times: Times, extern: set[str], recompute_s: float) -> dict[str, float]:
    """Per-op recomputation seconds under compile of the ops not in `extern`: `recompute_s` (what recomputing them
    all adds to the compiled backward) shared in proportion to their eager forward times. Their forward share of the
    compiled block (fused_times) also pays for what a recomputation does not repeat: the forward's stores, the
    compiled call's own cost."""
    rest = {op: t[0] for op, t in times.items() if op not in extern}
    total = sum(rest.values())
    return {op: (recompute_s * t / total if total > 0 else 0.0) for op, t in rest.items()}


def with_recompute_times(block: Block, recompute: dict[str, float]) -> Block:
    ops = [op.model_copy(update={"recompute_s": recompute[op.id]}) if op.id in recompute and not op.view else op
           for op in block.ops]
    return block.model_copy(update={"ops": ops})


__all__ = ["compile_saves", "dropout_masks", "eager_bases", "fused_times", "measure", "recompute_times", "saved_bytes",
           "saved_ops", "with_bool_masks", "with_recompute_times"]
