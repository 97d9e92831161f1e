"""The fake trace of the reference GPT block agrees with the analytic profile and with a real forward."""

import contextlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from lynx_planner import analytic, policy
from lynx_planner.models.catalog import GPTConfig
from lynx_planner.models.gpt_block import GPTBlock
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.profiler import trace_block
from lynx_planner.profiler.memory import saved_bytes_after_forward
from lynx_planner.profiler.timing import analytic_times
from lynx_planner.profiler.tracing import to_block, trace

H100 = HARDWARE["h100-80g-nvlink"]
S, B, HID, HEADS = 128, 2, 256, 4


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """`module.to(dtype)` fails under FakeTensorMode: this unit test builds lynx's own block in the dtype instead."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def fake_block(attention: str, dropout: float) -> tuple[GPTBlock, torch.Tensor]:
    with FakeTensorMode(), default_dtype(torch.bfloat16):
        return GPTBlock(HID, HEADS, S, attention=attention, dropout=dropout), torch.randn(S, B, HID)


@pytest.mark.parametrize("attention", ["math", "flash"])
def test_saved_units_match_analytic(attention):
    block = trace_block(*fake_block(attention, 0.1))
    par = analytic.ParallelConfig(seq_len=S, micro_batch_size=B)
    ref = analytic.gpt_layer_block(GPTConfig("t", 2, HID, HEADS), par, H100, attention, 0.1)
    got, want = policy.analyse(block), policy.analyse(ref)
    assert got.units == want.units
    for unit in want.units:
        if "layer_norm" in unit:  # CPU keeps bf16 LayerNorm statistics, the analytic model fp32
            assert got.unit_bytes[unit] - got.block.ops[got.order[unit]].aux_bytes == (
                want.unit_bytes[unit] - want.block.ops[want.order[unit]].aux_bytes)
            assert 2 * got.block.ops[got.order[unit]].aux_bytes == want.block.ops[want.order[unit]].aux_bytes
        else:
            assert got.unit_bytes[unit] == want.unit_bytes[unit], unit
    assert block.input_bytes == ref.input_bytes and block.output_bytes == ref.output_bytes


def test_flags_and_tags():
    ops = {op.id: op for op in trace_block(*fake_block("math", 0.1)).ops}
    assert ops["attn.core.dropout:native_dropout#0"].random
    assert {i for i, op in ops.items() if "core_attn" in op.tags} == {
        "attn.core:baddbmm#0", "attn.core:_softmax#0", "attn.core.dropout:native_dropout#0", "attn.core:bmm#0"}
    assert ops["attn.qkv:addmm#0"].flops == 2 * S * B * HID * 3 * HID


@pytest.mark.parametrize("attention", ["math", "flash"])
def test_saved_bytes_match_real_forward(attention):
    torch.manual_seed(0)
    block, x = GPTBlock(64, 4, 32, attention=attention, dropout=0.1), torch.randn(32, 2, 64)
    traced = trace(block, (x,))
    assert traced.saved_bytes == saved_bytes_after_forward(block, (x,))


def test_policies_work_on_traced_block():
    block, x = fake_block("flash", 0.0)
    traced = trace(block, (x,))
    info = policy.analyse(to_block("gpt", traced, analytic_times(traced, H100)))
    none = policy.none_keep(info)
    assert policy.closure(info, none) == ()
    full = policy.cost(info, frozenset(), policy.full_recompute(info))
    kept = policy.cost(info, none, ())
    assert full.kept_bytes == info.block.input_bytes < kept.kept_bytes
    assert full.recompute_s > 0 and kept.recompute_s == 0
    sel = policy.selective_keep(info)
    assert policy.validate(info, sorted(sel), list(policy.closure(info, sel))) is None


def test_attention_flops_count_grouped_query_heads_as_the_kernel_runs_them():
    """Torch before 2.13 asserts on grouped-query shapes (profiling a GQA model on an H100 with torch 2.11 stopped
    there): lynx's formulas count every kernel's attention with the key/value heads broadcast to the query's."""
    from lynx_planner.profiler.tracing import SDPA_FLOPS, _query_heads

    b, hq, hkv, s, d = 2, 8, 2, 64, 16
    q, kv = (b, hq, s, d), (b, hkv, s, d)
    assert _query_heads(q, kv, kv) == (q, q, q)  # what torch before 2.13 accepts (2.13 counts grouped shapes alike)
    forward = 2 * (2 * b * hq * s * d * s)  # q kᵀ and p v, non-causal
    kernels = {str(op) for op in SDPA_FLOPS}
    assert "aten._scaled_dot_product_flash_attention" in kernels  # the CUDA kernel, not only the CPU one
    for op, formula in SDPA_FLOPS.items():
        if str(op).endswith("_backward"):
            assert formula(q, q, kv, kv) == 5 * forward // 2  # q kᵀ again, then dv, dp, dq, dk: five of the two GEMMs
        else:
            assert formula(q, kv, kv) == forward
