"""A decoder written independently of the zoo (tests/models/own_llama.py: RMSNorm, fp32 rotary tables, GQA, SwiGLU),
profiled from the command line with --method measure on the CPU: the profile's saved bytes are what autograd saves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from typer.testing import CliRunner

from lynx_planner import policy
from lynx_planner.cli import app
from lynx_planner.io import load_model
from lynx_planner.profiler import load_model_file
from lynx_planner.profiler.loading import Precision
from lynx_planner.schema import Profile

MODEL = str(Path(__file__).resolve().parent / "models" / "own_llama.py")


def autograd_saved_bytes(module: torch.nn.Module, args: tuple, kwargs: dict, precision: Precision) -> int:
    """Bytes of the distinct storages autograd saves in one forward of `module`, other than its parameters and
    arguments (the block input is counted apart, as the profile's input_bytes)."""
    outside = {StorageWeakRef(t.untyped_storage()) for t in [*module.parameters(), *module.buffers(),
                                                             *[a for a in args if isinstance(a, torch.Tensor)]]}
    saved: dict = {}

    def pack(t):
        key = StorageWeakRef(t.untyped_storage())
        if key not in outside:
            saved[key] = t.untyped_storage().nbytes()
        return t

    x = args[0].detach().requires_grad_(args[0].is_floating_point())
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), precision.forward_context("cpu"):
        module(x, *args[1:], **kwargs)
    return sum(saved.values())


@pytest.mark.parametrize("dtype,autocast", [("fp32", None), ("bf16", None), ("fp32", "bf16")])
def test_measured_profile_matches_what_autograd_saves(tmp_path, dtype, autocast):
    out = tmp_path / "p.json"
    args = ["profile", MODEL, "-o", str(out), "--method", "measure", "--device", "cpu", "--threads", "1",
            "--repeats", "2", "--dtype", dtype] + (["--autocast", autocast] if autocast else [])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "inputs int64[2, 64]" in result.output and "measured on cpu (1 thread, 2 runs" in result.output
    prof = load_model(out, Profile)
    assert (prof.dtype, prof.autocast) == (dtype, autocast)
    assert [layer.name for layer in prof.layers] == ["embed", "blocks.0", "blocks.1", "blocks.2", "norm", "head"]
    assert prof.parallel.seq_len == 64 and prof.parallel.micro_batch_size == 2 and prof.model.config["threads"] == 1
    block = prof.blocks[prof.layers[1].block]
    assert sum(op.fwd_s for op in block.ops) > 0 and sum(op.bwd_s for op in block.ops) > 0
    info = policy.analyse(block)
    predicted = policy.cost(info, policy.none_keep(info), ()).kept_bytes - block.input_bytes

    model, inputs = load_model_file(MODEL, dtype=dtype)
    captured = {}
    handle = model.blocks[1].register_forward_pre_hook(lambda m, a: captured.setdefault("args", a))
    with torch.no_grad(), Precision(dtype, autocast).forward_context("cpu"):
        model(*inputs)
    handle.remove()
    real = autograd_saved_bytes(model.blocks[1].train(), captured["args"], {}, Precision(dtype, autocast))
    print(f"{dtype} {autocast}: predicted {predicted} B, autograd saves {real} B")
    assert abs(predicted - real) <= 0.02 * real, (predicted, real)
