"""`lynx profile model.py`: a planner profile of a PyTorch model file, from real forwards in the training precision.

The model is built as the file builds it, on the profile's device, and converted the way training converts it
(`model.to(dtype)`, or fp32 weights under autocast): bytes, times and op ids then all come from that one precision,
and the ops a block lists are exactly those its layers run in training (a real forward, not a fake or symbolic
trace: fake tensors change what some models do, e.g. Hugging Face's sdpa mask, and break models that deep-copy
layers). One forward of the whole model finds the layers and their arguments; every layer's op ids are read, layers
of one structure that run the same ops share a block type, and one instance per block type is traced (forward and
backward). `lynx_model()` receives only the overrides it accepts; the shapes profiled are those of the example inputs.
The 'measure' method times the ops of the same instances.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from rich.progress import Progress

from .. import policy
from .. import schedules as lynx_schedules
from ..analytic import bytes_per_param
from ..io import InputError, LayoutError
from ..runtime import routing
from ..schema import Block, Hardware, Layer, ModelInfo, ParallelConfig, Profile
from . import compiled as compiled_block
from . import runtime as local_runtime
from . import tp as tensor_parallel
from .loading import Precision, load_model_file, model_dtype, user_error
from .recorder import is_attention_kernel, op_clock, tensors_in
from .structure import LayerSlot, capture_layers, name_blocks, uncovered
from .timing import analytic_times, measure_block, measure_record, measure_split, measure_spread, scaled_to_block
from .tracing import CORE_ATTN, BlockTrace, op_ids, split_arguments, to_block, trace

METHODS = ("analytic", "measure")
DEVICES = ("cpu", "cuda")
UNCOVERED_SHARE = 0.05  # parameters outside the layers above this share: warn
SPREAD_WARNING = 0.10  # measured per-run spread above this: warn
# Attributes naming attention head counts (module attributes and Hugging Face config fields).
_HEAD_ATTRS = ("heads", "num_heads", "n_head", "n_heads", "nhead", "num_attention_heads", "num_key_value_heads",
               "num_kv_heads", "n_kv_heads", "n_head_kv")


def _check_args(method: str, device: str, attention: str | None) -> None:
    if method not in METHODS:
        raise InputError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
    if device not in DEVICES:
        raise InputError(f"device must be one of {', '.join(DEVICES)}, not {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is available")
    if attention not in (None, "flash", "math"):
        raise InputError(f"attention must be 'flash' or 'math', not {attention!r}")


def _user_code(path: str, what: str, fn: Callable, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except InputError:
        raise
    except Exception as e:  # the user's forward failed: name their line if it is in the traceback
        err = user_error(Path(path).resolve(), e)
        raise InputError(f"{err} (while {what})") from None


def _model_info(path: str, model: torch.nn.Module, groups: dict[str, list[LayerSlot]], extra: dict) -> ModelInfo:
    params = sum(p.numel() for p in model.parameters())
    repeated = max(len(slots) for slots in groups.values())
    return ModelInfo(name=Path(path).stem, source=path, params=params,
                     config={"class": type(model).__name__, "num_layers": repeated, **extra})


def _dropout(model: torch.nn.Module) -> float:
    """The largest dropout rate of the model: nn.Dropout modules, and float attributes named like a dropout rate on
    any module (attention dropout that runs functionally: F.dropout, sdpa's dropout_p, as most HF attention
    classes do with `self.attention_dropout`)."""
    rates = [m.p for m in model.modules() if "Dropout" in type(m).__name__ and isinstance(getattr(m, "p", None), float)]
    for m in model.modules():
        rates += [v for name, v in vars(m).items() if isinstance(v, float) and 0 <= v < 1 and not name.startswith("_")
                  and ("dropout" in name or name.endswith(("pdrop", "dropout_p")))]
    return max(rates, default=0.0)


def _attention(traces: dict[str, BlockTrace]) -> str:
    """flash: fused attention kernels; math: attention from batched activation GEMMs around a softmax (q kᵀ, p v);
    none: neither (state-space models such as Mamba)."""
    ops = [op for tr in traces.values() for op in tr.ops]
    if any("scaled_dot_product" in op.name or is_attention_kernel(op.name) for op in ops):
        return "flash"
    # a softmax between the two GEMMs: batched activation GEMMs alone are no attention (Mamba's selective scan)
    return "math" if any(CORE_ATTN in op.tags and "softmax" in op.name for op in ops) else "none"


def _shapes(inputs: tuple) -> tuple[int, int, str]:
    """(micro-batch, sequence) from the first tensor input, read as [batch, seq, ...], and a description."""
    tensors = tensors_in(inputs)
    desc = ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in tensors)
    if not tensors or tensors[0].dim() == 0:
        return 1, 1, desc
    shape = tensors[0].shape
    return max(1, shape[0]), max(1, shape[1] if len(shape) > 1 else 1), desc


def _group_by_ops(path: str, slots: list[LayerSlot], context) -> None:
    """Key each layer's block type by the ops it runs too: layers of one structure may take other paths."""
    for slot in slots:
        ids = _user_code(path, f"running layer {slot.name!r}", op_ids, slot.module, slot.args, slot.kwargs or {},
                         context)
        slot.ops = ids


def _check_faithful(path: str, slot: LayerSlot, traced: BlockTrace) -> None:
    """The traced forward ran the ops the layer's earlier forward ran: else the ops depend on more than the
    arguments (state, caches, randomness in control flow) and a plan could name ops that training never runs."""
    other = [op.id for op in traced.ops if op.id not in set(slot.ops)]
    if other:
        raise InputError(f"{path}: layer {slot.name!r} ran other ops on a second forward with the same arguments "
                         f"({', '.join(other[:4])}): its forward is not deterministic, so lynx cannot make a "
                         "profile whose ops training will run")


def _check_parallel(path: str, model: torch.nn.Module, traces: dict[str, BlockTrace], par: ParallelConfig,
                    n_layers: int) -> None:
    """The option checks catalog models get: heads divisible by tp, sequence by tp with sp, pp <= layers."""
    if par.pp > n_layers:
        raise InputError(f"--pp {par.pp}: {path} has only {n_layers} layers (at most one stage per layer)")
    if par.tp > 1:
        counts: dict[str, int] = {}
        for name, module in [("", model), *model.named_modules(), ("config", getattr(model, "config", None))]:
            for attr in _HEAD_ATTRS:
                value = getattr(module, attr, None) if module is not None else None
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    counts.setdefault(attr, value)
        for tr in traces.values():
            for op in tr.ops:
                if op.heads:
                    counts.setdefault("attention heads", op.heads[0])
                    counts.setdefault("key/value heads", op.heads[1])
        for what, value in counts.items():
            if value % par.tp:
                raise LayoutError(f"--tp {par.tp} does not divide the model's {what} ({value}) in {path}")
    if par.sequence_parallel and par.seq_len % par.tp:
        raise LayoutError(f"--sequence-parallel: --tp {par.tp} does not divide the sequence length {par.seq_len} "
                         f"of {path}'s example inputs")


def _check_plannable(block: Block) -> None:
    info = policy.analyse(block)
    keep = policy.none_keep(info)
    if policy.closure(info, keep):
        raise AssertionError(f"block {block.name}: keeping every saved unit still needs recomputation")


def profile_model_file(path: str, *, parallel: ParallelConfig, hardware: Hardware, method: str = "analytic",
                       device: str = "cpu", attention: str | None = None, dtype: str | None = None,
                       autocast: str | None = None, overrides: dict | None = None, threads: int | None = None,
                       repeats: int = 5, progress: bool = True,
                       warn: Callable[[str], None] | None = None, compile: bool = False,
                       compile_backend: str = "inductor") -> Profile:
    """The profile of a model file. `overrides` are the lynx_model() arguments the user asked for (each must be
    accepted; None: `batch_size`/`seq_len` from `parallel`, where accepted); `attention` is one more. `dtype`/`autocast`
    is the training precision (None: the weights as the file builds them, no autocast). `parallel`'s micro-batch and
    sequence are replaced by the example inputs' shapes. `compile` (with 'measure'): each block type as torch.compile
    runs it (compiled.py: fused times, compiled dropout masks, saved bytes measured; `compile_backend` aot_eager for
    tests and smoke runs without inductor's C++ build). Warnings (parameters outside the layers, a large measured
    spread, compiled saved bytes other than predicted) go to `warn` (default: warnings.warn)."""
    _check_args(method, device, attention)
    if compile and method != "measure":
        raise InputError("--compile measures the compiled blocks: use it with --method measure")
    warn = warn or (lambda message: warnings.warn(message, stacklevel=2))
    precision = Precision(dtype, autocast)
    strict = tuple(overrides or ())
    if overrides is None:
        overrides = {"batch_size": parallel.micro_batch_size, "seq_len": parallel.seq_len}
    overrides = dict(overrides)
    if attention is not None:
        overrides["attention"] = attention
        strict += ("attention",)
    model, inputs = load_model_file(path, device=device, dtype=dtype, strict=strict, **overrides)
    model.train()

    def context():
        return precision.forward_context(device)

    slots = _user_code(path, "running the model's forward", capture_layers, model, inputs, context)
    if not slots:
        raise InputError(f"{path}: the model's forward called none of its submodules: no layers to plan")
    params = sum(p.numel() for p in model.parameters())
    outside, never = uncovered(model, slots)
    if params and outside > UNCOVERED_SHARE * params:
        warn(f"{path}: {outside / params:.1%} of the parameters ({outside:,} of {params:,}) are outside the "
             f"{len(slots)} layers found" + (f"; never called: {', '.join(never[:6])}" if never else "")
             + ": the plan will not cover them (are the repeated blocks in a container lynx does not split?)")
    bar = Progress(transient=True) if progress else None
    with bar or contextlib.nullcontext():
        _group_by_ops(path, slots, context)
        groups = name_blocks(slots)
        task = bar.add_task("trace", total=len(groups)) if bar else None
        traces = {}
        for name, group in groups.items():
            traces[name] = _user_code(path, f"tracing layer {group[0].name!r}", trace, group[0].module,
                                      group[0].args, group[0].kwargs, context)
            _check_faithful(path, group[0], traces[name])
            if bar:
                bar.advance(task)
        spread = 0.0
        if method == "measure":
            times, spreads, split, saved, recorded = {}, {}, {}, {}, {}
            with _threads(threads):
                for name, group in groups.items():
                    t = bar.add_task(f"measure {name}", total=repeats + 2) if bar else None
                    times[name], s, total = measure_spread(
                        [(g.module, g.args, g.kwargs) for g in group], {op.id for op in traces[name].ops},
                        runs=repeats, warmup=2, context=context,
                        advance=lambda t=t: bar.advance(t) if bar else None)
                    spreads[name] = (s, total * len(group))
                    clock = op_clock(torch.device(device).type == "cuda", torch.get_num_threads())
                    times[name] = scaled_to_block(times[name], measure_block(
                        group[0].module, group[0].args, group[0].kwargs, runs=repeats, context=context, clock=clock))
                    if compile:
                        times[name], saved[name] = _compiled(group[0], traces[name], times[name], repeats, context,
                                                             clock, compile_backend)
                    if routing.routed_paths(group[0].module) and not compile:  # the runtime records it op by op
                        recorded[name] = measure_record(group[0].module, group[0].args, group[0].kwargs or {},
                                                        runs=repeats, context=context, clock=clock)
                    if lynx_schedules.get(parallel.schedule).splits_backward:  # B and W cost more than the whole
                        per_stage = -(-len(slots) // (parallel.pp * parallel.virtual_stages))
                        split[name] = measure_split([(g.module, g.args, g.kwargs) for g in group],
                                                    chain=min(len(group), per_stage), runs=2 * repeats,
                                                    context=context)  # a ratio of a few %: more runs
                used_threads = torch.get_num_threads()
            weight = sum(w for _, w in spreads.values())
            spread = sum(s * w for s, w in spreads.values()) / weight if weight > 0 else 0.0
        else:
            times = {name: analytic_times(tr, hardware) for name, tr in traces.items()}
            split, saved, recorded = {}, {}, {}
    batch, seq, described = _shapes(inputs)
    # Neighbouring stages lie tp x dp ranks apart (Megatron's order, torchtitan's mesh: pp outermost), so a pipeline
    # send runs on the hardware's point-to-point link: a calibrated file's measured gloo/NCCL send, which `lynx
    # validate`'s stages use (before, model files priced it on the collective link spanning tp x pp ranks)
    parallel = parallel.model_copy(update={"micro_batch_size": batch, "seq_len": seq, "rank_order": "tp-dp-pp"})
    _check_parallel(path, model, traces, parallel, len(slots))
    blocks = {}
    for name, tr in traces.items():
        block = to_block(name, tr, times[name])
        if name in saved:  # compiled: as compile saves it, checked on the measured (unsharded) module
            block = _as_compiled(path, block, _block_input(groups[name][0]), saved[name], warn)
        blocks[name] = tensor_parallel.shard(block, tr, parallel, hardware)
        if split.get(name) is not None:
            blocks[name] = blocks[name].model_copy(update={"split_backward": round(split[name], 4)})
        if recorded.get(name):
            blocks[name] = blocks[name].model_copy(update={"record_s": recorded[name]})
        _check_plannable(blocks[name])
    seen: set[int] = set()
    bpp = bytes_per_param(parallel)
    layers = []
    for slot in slots:
        module_role = tensor_parallel.roles(traces[slot.block])[0]
        rank_params = tensor_parallel.rank_params(slot.module, module_role, parallel.tp, seen)
        layers.append(Layer(block=slot.block, name=slot.name, params=rank_params, static_bytes=int(rank_params * bpp)))
    extra = {"device": device, "inputs": described, "outside_params": outside,
             **{f"override.{k}": v for k, v in overrides.items() if isinstance(v, (int, float, str, bool))}}
    if method == "measure":
        extra |= {"threads": used_threads, "repeats": repeats, "spread": round(spread, 4)}
        if spread > SPREAD_WARNING:
            warn(f"{path}: measured times vary by {spread:.0%} between runs (interquartile range over the median of "
                 f"each block's {repeats} runs, weighted by its share of the time): the machine is busy, or use more "
                 "--repeats; the times are medians")
    local = None
    if method == "measure" and local_runtime.applies(parallel, device) and autocast is None:
        try:
            local = _local_runtime(slots, parallel, model, inputs, model_dtype(model) or "fp32", used_threads,
                                   repeats, context, path, overrides)
        except Exception as e:  # the profile stands without it (a model torch's pipeline cannot run, say)
            last = (str(e).strip().splitlines() or [type(e).__name__])[-1]
            warn(f"{path}: could not measure the {parallel.pp if parallel.pp > 1 else parallel.dp}-rank job's "
                 f"runtime on this CPU ({last}): the profile prices none of it (schedule, sends, loss, "
                 "communication threads)")
    return Profile(model=_model_info(path, model, groups, extra), parallel=parallel, hardware=hardware, method=method,
                   attention=_attention(traces), dropout=_dropout(model), blocks=blocks, layers=layers,
                   dtype=model_dtype(model), autocast=autocast, compiled=compile, runtime=local)


def _local_runtime(slots: list[LayerSlot], parallel: ParallelConfig, model, inputs: tuple, dtype: str, threads: int,
                   repeats: int, context, path: str, overrides: dict):
    """What the job costs on this CPU besides its layers (profiler/runtime.py), with the shapes its chunks send: the
    input of the middle layer (a boundary between chunks) and the last layer's output (the loss's input)."""
    middle = split_arguments(slots[len(slots) // 2].args, slots[len(slots) // 2].kwargs or {})[0]
    last = slots[-1]
    with torch.no_grad(), context():
        out = last.module(*last.args, **(last.kwargs or {}))
    out = tensors_in(out if isinstance(out, tuple) else (out,))
    largest = max(slots, key=lambda s: sum(p.numel() for p in s.module.parameters()))
    tensors = [p.numel() for p in largest.module.parameters()]
    return local_runtime.measure(parallel, model=model, inputs=inputs, boundary=tuple(middle.shape),
                                 output=tuple(out[0].shape), dtype=dtype, threads=threads, repeats=repeats,
                                 unit_params=sum(tensors), model_path=str(Path(path).resolve()), overrides=overrides,
                                 unit_tensors=tensors or None)


def _block_input(slot: LayerSlot) -> torch.Tensor | None:
    return split_arguments(slot.args, slot.kwargs or {})[0]


def _compiled(slot: LayerSlot, traced: BlockTrace, times, repeats: int, context, clock, backend: str):
    """A block type's times as torch.compile runs it, and what _as_compiled needs: the bytes its compiled graph
    saves, the op ids of the tensors it saves, its dropout modules, its ops' recomputation times (profiler/compiled.py)."""
    extern = {op.id for op in traced.ops if op.fwd.gemm_flops + op.fwd.attention_flops > 0}
    torch._dynamo.reset()  # each block type compiled afresh (no recompilation limit across types)
    fwd, bwd, saved, recompute_s = compiled_block.measure(slot.module, slot.args, slot.kwargs or {}, extern,
                                                          runs=repeats, context=context, clock=clock, backend=backend)
    torch._dynamo.reset()
    ops = compiled_block.saved_ops(slot.module, slot.args, slot.kwargs or {}, backend, context)
    dropouts = {p for p, m in slot.module.named_modules() if isinstance(m, torch.nn.Dropout)}
    recompute = compiled_block.recompute_times(times, extern, recompute_s)
    return compiled_block.fused_times(times, extern, (fwd, bwd)), (saved, ops, dropouts, recompute)


def _as_compiled(path: str, block: Block, first: torch.Tensor | None, saved, warn) -> Block:
    """The block as compile saves it (compiled dropout masks; what the partitioner recomputes in the fused backward
    saved by no plan), before tensor-parallel sharding; a warning where a plan that recomputes nothing keeps other
    bytes than the compiled graph saves."""
    measured, compiled_ids, dropouts, recompute = saved
    block = compiled_block.with_bool_masks(block, first.element_size() if first is not None else 4)
    block = compiled_block.with_recompute_times(block, recompute)
    bases = compiled_block.eager_bases(block, compiled_ids, dropouts)
    if bases is None:
        warn(f"{path}: block {block.name!r}: could not tell which ops' outputs its compiled graph saves (a saved tensor "
             "of no op of the profile, or a backend other than inductor and aot_eager); its plans keep what eager "
             "autograd saves (kept elementwise outputs then cost compile a store each)")
    else:
        block = compiled_block.compile_saves(block, bases)
    info = policy.analyse(block)
    predicted = policy.cost(info, policy.none_keep(info), ()).kept_bytes - block.input_bytes
    if predicted != measured:
        warn(f"{path}: block {block.name!r} compiled saves {measured:,} B for backward, the profile predicts "
             f"{predicted:,} B: plans of it keep other bytes than predicted")
    return block


@contextlib.contextmanager
def _threads(n: int | None):
    old = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
