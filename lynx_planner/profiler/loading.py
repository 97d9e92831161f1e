"""Imports a user's model file and builds the model it defines, converted to the training precision.

Convention: the file defines `lynx_model(**overrides) -> (module, example_inputs)`, `example_inputs` a tuple of
positional arguments of `module.forward`; or, as a fallback, module-level `model` and `example_inputs`. Overrides
are passed only where `lynx_model` accepts them (by name, or through **kwargs); an override the user asked for
explicitly (`strict`) that the file cannot take is an error naming it.

The model is built exactly as the file builds it (never under a changed default dtype), then moved to the device and
converted the way training converts it: `model.to(dtype)` (parameters and floating buffers) and floating example
inputs alike; autocast is applied around forwards by the caller (see `Precision`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import sys
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from ..io import InputError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class Precision:
    """The training precision: the weights' dtype (None: as the file builds them) and an optional autocast dtype."""

    dtype: str | None = None
    autocast: str | None = None

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in DTYPES:
            raise InputError(f"--dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if self.autocast is not None and self.autocast not in ("bf16", "fp16"):
            raise InputError(f"--autocast must be bf16 or fp16, not {self.autocast!r}")
        if self.autocast is not None and self.dtype not in (None, "fp32"):
            raise InputError(f"--autocast {self.autocast} runs fp32 weights under autocast; it cannot be combined "
                             f"with --dtype {self.dtype}")

    def forward_context(self, device: str | torch.device) -> contextlib.AbstractContextManager:
        """What the training forward runs under (autocast, or nothing)."""
        if self.autocast is None:
            return contextlib.nullcontext()
        kind = torch.device(device).type
        return torch.autocast(kind, dtype=DTYPES[self.autocast])


def user_error(path: Path, exc: BaseException) -> InputError:
    """'path:line: ExceptionType: message', the line being the deepest frame in the user's file."""
    if isinstance(exc, SyntaxError) and exc.filename and Path(exc.filename).resolve() == path:
        return InputError(f"{path}:{exc.lineno}: SyntaxError: {exc.msg}")
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path]
    where = f"{path}:{frames[-1].lineno}" if frames else str(path)
    return InputError(f"{where}: {type(exc).__name__}: {exc}")


def _import(path: Path) -> object:
    spec = importlib.util.spec_from_file_location(f"lynx_model_{uuid.uuid4().hex}", path)
    if spec is None or spec.loader is None:
        raise InputError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))  # so the file can import its neighbours
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def accepted(fn: object, overrides: dict) -> dict:
    """The overrides `fn` accepts (by name or through **kwargs)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(overrides)
    named = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in overrides.items() if k in named}


def _build(path: Path, overrides: dict, strict: tuple[str, ...]) -> tuple[torch.nn.Module, tuple]:
    user = _import(path)
    fn = getattr(user, "lynx_model", None)
    takes = accepted(fn, overrides) if callable(fn) else {}
    missing = [k for k in strict if k in overrides and k not in takes]
    if missing:
        where = "lynx_model()" if callable(fn) else "its module-level model/example_inputs"
        raise InputError(f"{path}: the model file does not accept {', '.join(missing)} (it is fixed by {where}; "
                         f"add the parameter to lynx_model() or leave the option out)")
    if callable(fn):
        result = fn(**takes)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise InputError(f"{path}: lynx_model() must return (module, example_inputs)")
        module, inputs = result
    elif hasattr(user, "model") and hasattr(user, "example_inputs"):
        module, inputs = user.model, user.example_inputs
    else:
        raise InputError(f"{path}: defines neither lynx_model() nor model/example_inputs")
    if not isinstance(module, torch.nn.Module):
        raise InputError(f"{path}: the model is a {type(module).__name__}, not a torch.nn.Module")
    return module, inputs if isinstance(inputs, tuple) else (inputs,)


def _convert(x: object, device: str, dtype: torch.dtype | None) -> object:
    if not isinstance(x, torch.Tensor):
        return x
    if dtype is not None and x.is_floating_point():
        return x.to(device=device, dtype=dtype)
    return x.to(device)


def load_model_file(path: str | Path, *, device: str = "cpu", dtype: str | None = None,
                    strict: tuple[str, ...] = (), **overrides: object) -> tuple[torch.nn.Module, tuple]:
    """(module, example_inputs) of a model file on `device`, converted to `dtype` ('fp32', 'bf16', 'fp16'; None: as
    built). `strict` names the overrides the file must accept. The global RNG is seeded first, so that two loads
    build the same model and inputs."""
    if not Path(path).is_file():
        raise InputError(f"{path}: no such file")
    path = Path(path).resolve()
    torch_dtype = DTYPES[dtype] if dtype is not None else None
    torch.manual_seed(0)
    try:
        module, inputs = _build(path, overrides, strict)
        module = module.to(device)
        if torch_dtype is not None:  # floating tensors only: Module.to(dtype) would cast complex buffers (torchtitan's
            # rotary cache) to a real dtype, dropping their imaginary part
            module = module._apply(lambda t: t.to(torch_dtype) if t.is_floating_point() else t)
        return module, tuple(_convert(x, device, torch_dtype) for x in inputs)
    except InputError:
        raise
    except SystemExit as e:  # not a model: say so rather than exiting with the file's status
        raise InputError(f"{path}: the model file called sys.exit({e.code!r}) while building the model") from None
    except Exception as e:  # the user's code failed: report their line, not ours
        raise user_error(path, e) from None


def model_dtype(module: torch.nn.Module) -> str | None:
    """The dtype name of the module's floating-point parameters (the most common one), or None."""
    counts: dict[torch.dtype, int] = {}
    for p in module.parameters():
        if p.is_floating_point():
            counts[p.dtype] = counts.get(p.dtype, 0) + p.numel()
    if not counts:
        return None
    return DTYPE_NAMES.get(max(counts, key=counts.__getitem__))
