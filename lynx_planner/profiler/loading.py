"""Imports a user's model file and builds the model it defines.

Convention: the file defines `lynx_model(**overrides) -> (module, example_inputs)`, `example_inputs` a tuple of
positional arguments of `module.forward`; or, as a fallback, module-level `model` and `example_inputs`. Overrides
are passed only where `lynx_model` accepts them (by name, or through **kwargs).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import sys
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path

import torch

from ..io import InputError


def user_error(path: Path, exc: BaseException) -> InputError:
    """'path:line: ExceptionType: message', the line being the deepest frame in the user's file."""
    if isinstance(exc, SyntaxError) and exc.filename and Path(exc.filename).resolve() == path:
        return InputError(f"{path}:{exc.lineno}: SyntaxError: {exc.msg}")
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path]
    where = f"{path}:{frames[-1].lineno}" if frames else str(path)
    return InputError(f"{where}: {type(exc).__name__}: {exc}")


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    """Under FakeTensorMode `module.to(dtype)` fails, so the model is built in the wanted default dtype instead."""
    old = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


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
    """The overrides `fn` accepts."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(overrides)
    return {k: v for k, v in overrides.items() if k in params}


def _build(path: Path, overrides: dict, required: tuple[str, ...]) -> tuple[torch.nn.Module, tuple]:
    user = _import(path)
    fn = getattr(user, "lynx_model", None)
    missing = [k for k in required if k in overrides and not (callable(fn) and k in accepted(fn, overrides))]
    if missing:
        raise InputError(f"{path}: the model file does not accept {', '.join(missing)} (add it to lynx_model())")
    if callable(fn):
        result = fn(**accepted(fn, overrides))
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


def load_model_file(path: str | Path, *, fake_mode: object | None = None, dtype: torch.dtype | None = None,
                    required: tuple[str, ...] = (), **overrides: object) -> tuple[torch.nn.Module, tuple]:
    """(module, example_inputs) of a model file. With `fake_mode` (a FakeTensorMode) the file runs under it, so no
    parameter or input is allocated; `dtype` is the default dtype while the model is built; `required` names the
    overrides the file must accept."""
    if not Path(path).is_file():
        raise InputError(f"{path}: no such file")
    path = Path(path).resolve()
    with contextlib.ExitStack() as stack:
        if fake_mode is not None:
            stack.enter_context(fake_mode)
        stack.enter_context(default_dtype(dtype))
        try:
            return _build(path, overrides, required)
        except InputError:
            raise
        except Exception as e:  # the user's code failed: report their line, not ours
            raise user_error(path, e) from None
