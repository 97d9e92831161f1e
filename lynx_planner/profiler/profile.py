"""`lynx profile model.py`: a planner profile of a PyTorch model file.

The model is built under FakeTensorMode in bf16 (the training dtype the analytic profiles assume), split into
layers, and one instance of each block type is traced on CPU fakes; so bytes and FLOPs come without allocating.
`lynx_model()` receives `batch_size` and `seq_len` from the parallel config, and `attention` when one is asked for,
if it accepts them. The 'measure' method builds the model a second time for real on the device (fp32 on CPU, where
bf16 kernels are slow; bf16 on CUDA) and times every op.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from rich.progress import Progress
from torch._subclasses.fake_tensor import FakeTensorMode

from .. import policy
from ..analytic import bytes_per_param
from ..io import InputError
from ..schema import Block, Hardware, Layer, ModelInfo, ParallelConfig, Profile
from . import tp as tensor_parallel
from .loading import load_model_file, user_error
from .structure import LayerSlot, capture_layers, name_blocks
from .timing import analytic_times, measure_times
from .tracing import BlockTrace, to_block, trace

METHODS = ("analytic", "measure")
DEVICES = ("cpu", "cuda")


def _check_args(method: str, device: str, attention: str | None) -> None:
    if method not in METHODS:
        raise InputError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
    if device not in DEVICES:
        raise InputError(f"device must be one of {', '.join(DEVICES)}, not {device!r}")
    if method == "measure" and device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is available")
    if attention not in (None, "flash", "math"):
        raise InputError(f"attention must be 'flash' or 'math', not {attention!r}")


def _layers(path: str, model: torch.nn.Module, inputs: tuple) -> list[LayerSlot]:
    try:
        return capture_layers(model, inputs)
    except Exception as e:  # the user's forward failed: name their line if it is in the traceback
        err = user_error(Path(path).resolve(), e)
        raise InputError(f"{err} (while running the model's forward under FakeTensorMode)") from None


def _model_info(path: str, model: torch.nn.Module, groups: dict[str, list[LayerSlot]]) -> ModelInfo:
    params = sum(p.numel() for p in model.parameters())
    repeated = max(len(slots) for slots in groups.values())
    return ModelInfo(name=Path(path).stem, source=path, params=params,
                     config={"class": type(model).__name__, "num_layers": repeated})


def _dropout(model: torch.nn.Module) -> float:
    rates = [m.p for m in model.modules() if "Dropout" in type(m).__name__ and isinstance(getattr(m, "p", None), float)]
    return max(rates, default=0.0)


def _attention(traces: dict[str, BlockTrace]) -> str:
    flash = any("scaled_dot_product" in op.name for tr in traces.values() for op in tr.ops)
    return "flash" if flash else "math"


def _measured(path: str, groups: dict[str, list[LayerSlot]], traces: dict[str, BlockTrace], device: str,
              overrides: dict, progress: Progress | None) -> dict[str, dict]:
    """Per block type: measured op times on real instances."""
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model, inputs = load_model_file(path, dtype=dtype, **overrides)
    model = model.to(device).train()
    inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
    slots = {s.path: s for s in capture_layers(model, inputs)}
    runs, warmup = 5, 2
    times = {}
    for name, group in groups.items():
        task = progress.add_task(f"measure {name}", total=runs + warmup) if progress else None
        instances = [(slots[s.path].module, slots[s.path].args, slots[s.path].kwargs) for s in group]
        known = {op.id for op in traces[name].ops}
        times[name] = measure_times(instances, known, runs=runs, warmup=warmup,
                                    advance=lambda t=task: progress.advance(t) if progress else None)
    return times


def _check_plannable(block: Block) -> None:
    info = policy.analyse(block)
    keep = policy.none_keep(info)
    if policy.closure(info, keep):
        raise AssertionError(f"block {block.name}: keeping every saved unit still needs recomputation")


def profile_model_file(path: str, *, parallel: ParallelConfig, hardware: Hardware, method: str = "analytic",
                       device: str = "cpu", attention: str | None = None, progress: bool = True) -> Profile:
    _check_args(method, device, attention)
    overrides = {"batch_size": parallel.micro_batch_size, "seq_len": parallel.seq_len}
    if attention is not None:
        overrides["attention"] = attention
    fake = FakeTensorMode()
    model, inputs = load_model_file(path, fake_mode=fake, dtype=torch.bfloat16, required=("attention",), **overrides)
    model.train()
    with fake:
        slots = _layers(path, model, inputs)
    groups = name_blocks(slots)
    bar = Progress(transient=True) if progress else None
    with bar or contextlib.nullcontext():
        task = bar.add_task("trace", total=len(groups)) if bar else None
        traces = {}
        for name, group in groups.items():
            traces[name] = trace(group[0].module, group[0].args, group[0].kwargs)
            if bar:
                bar.advance(task)
        times = (_measured(path, groups, traces, device, overrides, bar) if method == "measure"
                 else {name: analytic_times(tr, hardware) for name, tr in traces.items()})
    blocks = {}
    for name, tr in traces.items():
        blocks[name] = tensor_parallel.shard(to_block(name, tr, times[name]), tr, parallel, hardware)
        _check_plannable(blocks[name])
    seen: set[int] = set()
    bpp = bytes_per_param(parallel)
    layers = []
    for slot in slots:
        module_role = tensor_parallel.roles(traces[slot.block])[0]
        params = tensor_parallel.rank_params(slot.module, module_role, parallel.tp, seen)
        layers.append(Layer(block=slot.block, name=slot.path, params=params, static_bytes=int(params * bpp)))
    return Profile(model=_model_info(path, model, groups), parallel=parallel, hardware=hardware, method=method,
                   attention=_attention(traces), dropout=_dropout(model), blocks=blocks, layers=layers)
