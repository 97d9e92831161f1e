"""MODEL → profile in one parallel setup: the one place `lynx profile` and `lynx tune` build profiles. MODEL is a
catalog name, a Hugging Face config.json, a lynx model JSON (`lynx schema model`) — these three are described by a
ModelSpec and profiled analytically — or a .py model file, profiled by running it."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .io import InputError, LayoutError
from .schema import Hardware, ParallelConfig, Profile


def is_model_file(model: str) -> bool:
    """A Python model file (run to profile), as opposed to a description (catalog name or JSON)."""
    return not model.endswith(".json") and (model.endswith(".py") or "/" in model or Path(model).is_file())


def model_spec(model: str):
    """The ModelSpec of a catalog name, a Hugging Face config.json or a lynx model JSON; InputError otherwise."""
    from .models.catalog import MODELS, as_spec

    if model.endswith(".json"):
        import json

        from pydantic import ValidationError

        from .models.hf_config import read_hf_config
        from .models.spec import ModelSpec

        try:
            data = json.loads(Path(model).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InputError(f"{model}: cannot read the model JSON ({e})") from None
        if isinstance(data, dict) and "model_type" in data:
            return read_hf_config(model)
        try:
            return ModelSpec.model_validate(data)
        except ValidationError as e:
            raise InputError(f"{model}: not a Hugging Face config.json (no 'model_type') nor a lynx model JSON: " +
                             "; ".join(f"{'.'.join(map(str, x['loc'])) or 'model'}: "
                                       f"{x['msg'].removeprefix('Value error, ')}" for x in e.errors()[:5])) from None
    if model not in MODELS:
        import difflib

        near = difflib.get_close_matches(model, list(MODELS), n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(near)}? " if near else ""
        raise InputError(f"MODEL: unknown model {model!r} ({hint}`lynx models` lists the catalog; a config.json, a "
                         "lynx model JSON or a .py file that builds a PyTorch model work too)")
    return as_spec(MODELS[model])


def build_profile(model: str, par: ParallelConfig, hw: Hardware, *, attention: str | None = None,
                  dropout: float = 0.0, method: str = "analytic", device: str = "cpu", dtype: str | None = None,
                  autocast: str | None = None, overrides: dict | None = None, threads: int | None = None,
                  repeats: int = 5, progress: bool = False, warn: Callable[[str], None] | None = None,
                  kernels: str = "hf", fp8: bool = False, compile: bool = False) -> Profile:
    """The profile of a catalog model (analytic, bf16) or a model file (real forwards in the training precision; see
    profiler.profile_model_file for `overrides`, `dtype`, `autocast`). Raises InputError for bad input; a model
    file's own exceptions propagate (the CLI reports them). `compile`: a model file's blocks measured compiled."""
    if compile and not is_model_file(model):
        raise InputError(f"--compile: {model!r} is a model description; compiled blocks are measured, which needs a "
                         "model file (MODEL.py) to run")
    if is_model_file(model):
        if kernels != "hf" or fp8:
            raise InputError(f"{'--kernels' if kernels != 'hf' else '--fp8'}: a model file is profiled as it runs; "
                             "kernels are chosen for catalog models and config.json files")
        if not Path(model).is_file():
            raise InputError(f"{model}: no such model file")
        if par.cp > 1:
            raise InputError(f"--cp {par.cp}: context parallelism is priced for model descriptions (catalog names, "
                             "config.json, lynx model JSON); a model file's attention is run on one rank whole")
        try:
            from .profiler import profile_model_file
        except ImportError as e:
            raise InputError(f"{model}: profiling model files is not available in this installation ({e})") from None
        return profile_model_file(model, parallel=par, hardware=hw, method=method, device=device,
                                  attention=attention, overrides=overrides, dtype=dtype, autocast=autocast,
                                  threads=threads, repeats=repeats, progress=progress, warn=warn, compile=compile)
    from pydantic import ValidationError

    from .analytic import profile

    spec = model_spec(model)
    for note in spec.notes:  # the reader's approximations, each with what it leaves out
        if warn is not None:
            warn(f"{model}: {note}")
    if method == "measure":
        raise InputError(f"--method measure: {model!r} is a catalog model; measuring needs a model file "
                         "(MODEL.py) to run. Use --method analytic for catalog models.")
    if dtype is not None or autocast is not None:
        raise InputError(f"{'--dtype' if dtype is not None else '--autocast'}: {model!r} is a catalog model, "
                         "profiled analytically in bf16; the precision options apply to model files")
    # A catalog model is priced as a whole Megatron iteration: optimizer step included, Megatron's rank order.
    par = par.model_copy(update={"optimizer_step": True, "rank_order": "tp-dp-pp"})
    try:
        return profile(spec, par, hw, attention or "flash", dropout, kernels, fp8)
    except ValidationError as e:
        raise InputError(f"{model}: " + "; ".join(x["msg"].removeprefix("Value error, ") for x in e.errors())) \
            from None
    except LayoutError as e:
        raise LayoutError(f"{model}: {e}") from None
    except ValueError as e:
        raise InputError(f"{model}: {e}") from None
