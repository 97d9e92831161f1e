"""Hugging Face models built from configs (GPT-2, Llama): profiles and saved-byte accuracy."""

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from lynx_planner import policy  # noqa: E402
from lynx_planner.models.hardware import HARDWARE  # noqa: E402
from lynx_planner.profiler import load_model_file, profile_model_file  # noqa: E402
from lynx_planner.profiler.memory import saved_bytes_after_forward  # noqa: E402
from lynx_planner.profiler.structure import capture_layers, name_blocks  # noqa: E402
from lynx_planner.profiler.tracing import trace  # noqa: E402
from lynx_planner.schema import ParallelConfig  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CASES = [("hf_gpt2.py", "GPT2Block", "transformer.h.0"), ("hf_llama.py", "LlamaDecoderLayer", "model.layers.0")]


@pytest.mark.parametrize("file,block,first", CASES)
def test_profile(file, block, first):
    par = ParallelConfig(seq_len=64, micro_batch_size=1, tp=2)
    p = profile_model_file(str(EXAMPLES / file), parallel=par, hardware=HARDWARE["h100-80g-nvlink"],
                           progress=False)
    assert first in [layer.name for layer in p.layers]
    assert sum(layer.block == block for layer in p.layers) == 4
    info = policy.analyse(p.blocks[block])
    assert policy.closure(info, policy.none_keep(info)) == ()
    assert any(op.kind == "collective" for op in p.blocks[block].ops)


@pytest.mark.parametrize("file,block,first", CASES)
@pytest.mark.parametrize("attention", ["flash", "math"])
def test_saved_bytes_match_real_forward(file, block, first, attention):
    torch.manual_seed(0)
    model, inputs = load_model_file(EXAMPLES / file, batch_size=2, seq_len=32, hidden=64, layers=2,
                                    attention=attention)
    slot = name_blocks(capture_layers(model.train(), inputs))[block][0]
    traced = trace(slot.module, slot.args, slot.kwargs)
    real = saved_bytes_after_forward(slot.module, slot.args, slot.kwargs)
    assert abs(traced.saved_bytes - real) <= 0.01 * real
