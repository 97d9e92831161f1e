"""Megatron-LM's own argument parser, validate_args and TransformerConfig build (megatron-core 0.19.2's wheel ships
megatron/training/arguments.py), made to run on this CPU-only Python 3.11 with small shims, none of which changes
what is checked: typing.override (Python 3.12) as the identity; a Hopper GPU's compute capability, where
validate_args asks the device; TE's fused rotary kernel as present (the config build asks whether TE is installed,
not what the model is). `parse(flags, world_size)` returns (args, config) or raises Megatron's own error.

Install: pip install --no-deps --ignore-requires-python megatron-core==0.19.2 (its wheel says Python >= 3.12).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shlex
import typing
import warnings


def load():
    """Megatron's modules, or None where megatron-core is not installed."""
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    if not hasattr(typing, "override"):
        typing.override = lambda f: f  # type: ignore[attr-defined]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from megatron.training import arguments
            from megatron.training.argument_utils import core_transformer_config_from_args
            import megatron.core.models.common.embeddings.rope_utils as rope_utils
        except ImportError:
            return None
    arguments.get_device_arch_version = lambda: 9  # megatron's own helper, as its module sees it
    if rope_utils.fused_apply_rotary_pos_emb is None:
        rope_utils.fused_apply_rotary_pos_emb = lambda *a, **k: None
    return arguments, core_transformer_config_from_args


def parse(flags: list[str], world_size: int):
    arguments, build_config = load()
    argv = [tok for flag in flags for tok in shlex.split(flag)]
    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    args = parser.parse_args(argv)
    args._is_global_batch_size_explicitly_specified = args.global_batch_size is not None
    args.rank, args.world_size = 0, world_size
    import torch

    capability = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)  # only while Megatron asks: restored below
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            arguments.validate_args(args, {})
            config = build_config(args)  # builds TransformerConfig: its __post_init__ validates the pipeline layout
    finally:
        torch.cuda.get_device_capability = capability
    return args, config
