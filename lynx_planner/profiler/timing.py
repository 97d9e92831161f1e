"""Forward and backward time of each op: a roofline estimate, or a measurement on a real device.

analytic: GEMMs by FLOPs at the hardware's GEMM efficiency (each kernel on its shape where the hardware has the shape
model of costs.py), attention kernels by FLOPs at the attention efficiency
(halved when causal), every other op by the bytes it reads and writes at the memory efficiency. The backward of an op
is the work of the backward kernels its autograd node ran in the traced backward (see recorder.py), costed alike.

measure: real forward and backward of the block's instances (round robin over the layers of the type), after
warm-up runs; each kernel is timed between device synchronisations by the recorder (on a CPU with one thread: by
this thread's CPU time, recorder.op_clock), and an op's time is the median
over runs. Backward kernels are charged to the forward op whose autograd node ran them (node pre-hooks). Kernels
without an op of the traced graph (views, device-specific extra kernels) are charged to the preceding op.
The spread of a block is the interquartile range over the median of its per-run total (forward + backward); the
profile's spread is their mean weighted by each block type's share of the model's time (tiny blocks are noisy and
matter little): on a shared machine it says how far to trust the medians.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable

import torch
from torch.utils._pytree import tree_map

from .. import costs
from ..schema import Hardware
from .recorder import Cost, tensors_in
from .tracing import BlockTrace, fresh_arguments, run_block, split_arguments

Times = dict[str, tuple[float, float]]  # op id -> (forward, backward) seconds


def roofline_s(cost: Cost, hw: Hardware, backward: bool = False) -> float:
    """With the hardware's shape model (costs.py), each GEMM kernel on its own shape (a backward's dgrad and wgrad
    kernels at gemm_backward_efficiency); without it, all GEMM FLOPs at the flat efficiency."""
    attention = cost.attention_flops / 2 if cost.causal else cost.attention_flops
    gemm = costs.gemm_s(cost.gemm_flops, hw)
    if hw.gemm_half_dim is not None and cost.gemms:
        gemm = sum(costs.gemm_fwd_s(m, k, n, hw) for m, k, n in cost.gemms)
        gemm /= (hw.gemm_backward_efficiency or 1.0) if backward else 1.0
    return gemm + costs.attention_s(attention, hw) + costs.memory_s(cost.rw_bytes, hw)


def analytic_times(traced: BlockTrace, hw: Hardware) -> Times:
    return {op.id: (roofline_s(op.fwd, hw), roofline_s(op.bwd, hw, backward=True)) for op in traced.ops}


def _one_run(module: torch.nn.Module, args: tuple, kwargs: dict, known: set[str], context=None) -> Times:
    rec = run_block(module, args, kwargs, timed=True, context=context)[0]
    fwd: dict[str, float] = {}
    bwd: dict[str, float] = {}
    last = None
    for r in rec.records:
        if r.id in known and not r.view:
            last = r.id
        if last is not None:
            fwd[last] = fwd.get(last, 0.0) + r.fwd.seconds
            bwd[last] = bwd.get(last, 0.0) + r.bwd.seconds
    return {op: (fwd[op], bwd[op]) for op in fwd}


def measure_times(instances: list[tuple[torch.nn.Module, tuple, dict]], known: set[str], *, runs: int = 5,
                  warmup: int = 2, advance: Callable[[], None] = lambda: None,
                  context: Callable | None = None) -> Times:
    """Median per-op (forward, backward) seconds over `runs` timed runs (see `measure_spread`)."""
    return measure_spread(instances, known, runs=runs, warmup=warmup, advance=advance, context=context)[0]


def measure_spread(instances: list[tuple[torch.nn.Module, tuple, dict]], known: set[str], *, runs: int = 5,
                   warmup: int = 2, advance: Callable[[], None] = lambda: None,
                   context: Callable | None = None) -> tuple[Times, float, float]:
    """Median per-op (forward, backward) seconds over `runs` timed runs, the spread of the per-run totals and their
    median;
    `advance` is called after each run, `context()` wraps each forward (autocast)."""
    samples: list[Times] = []
    for i in range(warmup + runs):
        module, args, kwargs = instances[i % len(instances)]
        result = _one_run(module, args, kwargs, known, context)
        if i >= warmup:
            samples.append(result)
        advance()
    times = {op: (statistics.median(s.get(op, (0.0, 0.0))[0] for s in samples),
                  statistics.median(s.get(op, (0.0, 0.0))[1] for s in samples)) for op in known}
    totals = [sum(f + b for f, b in s.values()) for s in samples]
    middle = statistics.median(totals)
    q1, _, q3 = statistics.quantiles(totals, n=4) if len(totals) > 1 else (middle, middle, middle)
    return times, (q3 - q1) / middle if middle > 0 else 0.0, middle


def _split_backward(outputs: list[torch.Tensor], grads: list[torch.Tensor], inputs: list[torch.Tensor],
                    params: list[torch.nn.Parameter]) -> None:
    """The backward as torch.distributed.pipelining splits it in a zero-bubble schedule: input gradients (B, the
    graph retained), then the weight gradients from the intermediates B captured (W)."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    _, groups = stage_backward_input(outputs, grads, inputs, iter(params))
    stage_backward_weight(iter(params), groups)


def _chain(instances: list[tuple[torch.nn.Module, tuple, dict]], x: torch.Tensor, context: Callable | None) -> object:
    """The instances called in turn, each on the previous one's output in place of its own block input."""
    out: object = x
    for module, args, kwargs in instances:
        first, _ = split_arguments(args, kwargs)
        a, k = tree_map(lambda t: out if t is first else t, (args, kwargs))
        with context() if context is not None else contextlib.nullcontext():
            out = module(*a, **k)
    return out


def measure_split(instances: list[tuple[torch.nn.Module, tuple, dict]], *, chain: int = 1, runs: int = 5,
                  warmup: int = 2, context: Callable | None = None) -> float | None:
    """Median time of the backward split into B and W (as torch.distributed.pipelining runs a zero-bubble schedule)
    over the median of the whole backward, of `chain` instances called in turn (a stage's worth: what W re-reads
    grows with the span between B and W, +1-4% for one GPT block, +4-8% for three on a CPU). The two run in turn on
    the same inputs, so that drift and load fall on both alike; CPU time of this thread on a CPU, wall time between
    synchronisations on a GPU. None where the split does not apply: no parameters, or a block input that needs no
    gradient (torch runs such a stage's backward whole, in W). Instances chain only where a block's output is one
    tensor shaped as its input."""
    module, args, kwargs = instances[0]
    params = [p for inst in instances for p in inst[0].parameters() if p.requires_grad]
    first, _ = split_arguments(args, kwargs)
    if not params or first is None or not first.is_floating_point():
        return None
    with torch.no_grad(), context() if context is not None else contextlib.nullcontext():
        probe = module(*args, **kwargs)
    if not (isinstance(probe, torch.Tensor) and probe.shape == first.shape and probe.dtype == first.dtype):
        chain = 1
    chained = [instances[i % len(instances)] for i in range(max(1, chain))]
    params = list({id(p): p for inst in chained for p in inst[0].parameters() if p.requires_grad}.values())
    device = params[0].device
    clock = time.thread_time if device.type == "cpu" else time.perf_counter
    times: dict[str, list[float]] = {"whole": [], "split": []}
    for i in range(warmup + runs):
        for kind, into in times.items():
            x = first.detach().requires_grad_(True)
            outputs = [t for t in tensors_in(_chain(chained, x, context)) if t.requires_grad]
            if not outputs:
                return None
            # one scalar, as a last stage's loss (torch's B detaches its outputs in place, which a view refuses)
            loss = sum(t.float().sum() for t in outputs)
            _synchronize(device)
            t0 = clock()
            if kind == "whole":
                torch.autograd.backward([loss])
            else:
                _split_backward([loss], [torch.ones_like(loss)], [x], params)
            _synchronize(device)
            if i >= warmup:
                into.append(clock() - t0)
            for p in params:
                p.grad = None
    return statistics.median(times["split"]) / statistics.median(times["whole"])


def scaled_to_block(times: Times, block: tuple[float, float]) -> Times:
    """Per-op times scaled so that forwards and backwards each sum to the block's uninstrumented time: the recorder
    gives each op's share, the plain run the total (recording between kernels costs the backward about 3-10% on a
    CPU: benchmarks/profile_accuracy.py)."""
    sums = [sum(t[i] for t in times.values()) for i in (0, 1)]
    scale = [block[i] / sums[i] if sums[i] > 0 and block[i] > 0 else 1.0 for i in (0, 1)]
    return {op: (f * scale[0], b * scale[1]) for op, (f, b) in times.items()}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure_block(module: torch.nn.Module, args: tuple, kwargs: dict, *, runs: int = 5,
                  warmup: int = 2, context: Callable | None = None,
                  clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """Median (forward, backward) seconds of the whole block, without any instrumentation; `context()` wraps the
    forward (autocast)."""
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    fwd, bwd = [], []
    for i in range(warmup + runs):
        a, k = fresh_arguments(args, kwargs)
        _synchronize(device)
        t0 = clock()
        with context() if context is not None else contextlib.nullcontext():
            out = module(*a, **k)
        _synchronize(device)
        t1 = clock()
        grads_of = [t for t in tensors_in(out) if t.requires_grad]
        if grads_of:
            torch.autograd.backward(grads_of, [torch.ones_like(t) for t in grads_of])
        _synchronize(device)
        t2 = clock()
        if i >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    return statistics.median(fwd), statistics.median(bwd)


def measure_record(module: torch.nn.Module, args: tuple, kwargs: dict, *, runs: int = 5, warmup: int = 2,
                   context: Callable | None = None, clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds a forward that the torch runtime records op by op (runtime/region.py, as it runs a layer whose
    ops follow the MoE routing and that keeps some ops) takes beyond the plain forward's median; the two interleaved.
    0 where it is not slower."""
    from ..runtime.opids import ModuleScope
    from ..runtime.region import Region

    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    scope = ModuleScope(module)
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(warmup + runs):
        for recorded in (False, True):
            a, k = fresh_arguments(args, kwargs)
            # an op id no op has: every saved tensor dropped, as selective plans drop some (the region is never
            # backwarded: its graph is freed with `out`)
            run = Region(module, scope, frozenset({"-"}), lambda *_: None, routed="record").forward if recorded \
                else module
            _synchronize(device)
            t0 = clock()
            with context() if context is not None else contextlib.nullcontext():
                out = run(*a, **k)
            _synchronize(device)
            if i >= warmup:
                times[recorded].append(clock() - t0)
            del out
    return max(0.0, statistics.median(times[True]) - statistics.median(times[False]))
