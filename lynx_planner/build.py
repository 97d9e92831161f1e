"""MODEL (a catalog name or a model file) → profile in one parallel setup: the one place `lynx profile` and
`lynx tune` build profiles."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .io import InputError
from .schema import Hardware, ParallelConfig, Profile


def is_model_file(model: str) -> bool:
    return model.endswith(".py") or "/" in model or Path(model).is_file()


def build_profile(model: str, par: ParallelConfig, hw: Hardware, *, attention: str | None = None,
                  dropout: float = 0.0, method: str = "analytic", device: str = "cpu", dtype: str | None = None,
                  autocast: str | None = None, overrides: dict | None = None, threads: int | None = None,
                  repeats: int = 5, progress: bool = False, warn: Callable[[str], None] | None = None) -> Profile:
    """The profile of a catalog model (analytic, bf16) or a model file (real forwards in the training precision; see
    profiler.profile_model_file for `overrides`, `dtype`, `autocast`). Raises InputError for bad input; a model
    file's own exceptions propagate (the CLI reports them)."""
    if is_model_file(model):
        if not Path(model).is_file():
            raise InputError(f"{model}: no such model file")
        try:
            from .profiler import profile_model_file
        except ImportError as e:
            raise InputError(f"{model}: profiling model files is not available in this installation ({e})") from None
        return profile_model_file(model, parallel=par, hardware=hw, method=method, device=device,
                                  attention=attention, overrides=overrides, dtype=dtype, autocast=autocast,
                                  threads=threads, repeats=repeats, progress=progress, warn=warn)
    from pydantic import ValidationError

    from .analytic import profile
    from .models.catalog import MODELS

    if model not in MODELS:
        raise InputError(f"MODEL: unknown model {model!r} (expected one of {', '.join(MODELS)}, or a .py file "
                         "that builds a PyTorch model)")
    if method == "measure":
        raise InputError(f"--method measure: {model!r} is a catalog model; measuring needs a model file "
                         "(MODEL.py) to run. Use --method analytic for catalog models.")
    if dtype is not None or autocast is not None:
        raise InputError(f"{'--dtype' if dtype is not None else '--autocast'}: {model!r} is a catalog model, "
                         "profiled analytically in bf16; the precision options apply to model files")
    try:
        return profile(MODELS[model], par, hw, attention or "flash", dropout)
    except ValidationError as e:
        raise InputError(f"{model}: " + "; ".join(x["msg"].removeprefix("Value error, ") for x in e.errors())) \
            from None
    except ValueError as e:
        raise InputError(f"{model}: {e}") from None
