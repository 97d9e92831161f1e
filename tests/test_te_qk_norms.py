"""`--kernels te` with per-head q/k norms (Megatron's --qk-layernorm: a TENorm on each head's q and k before the
fused rotary): a Qwen3-32B layer saves what Megatron's modules keep, derived here by hand; the features the te graph
does not build (norms over all heads, post/sandwich norms, output gates) are refused by name."""

from __future__ import annotations

import pytest
from conftest import lynx

from lynx_planner import analytic
from lynx_planner.models.catalog import MODELS
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.policy import analyse, cost, none_keep
from lynx_planner.schema import ParallelConfig

H100 = HARDWARE["h100-80g-nvlink"]
QWEN3 = MODELS["qwen3-32b"]  # h 5120, a 64 heads of d 128 (a·d = 8192, not h), kv 8, f 25600


def layer_bytes(prof) -> int:
    block = prof.blocks[prof.layers[1].block]
    info = analyse(block)
    return cost(info, none_keep(info), ()).kept_bytes


@pytest.mark.parametrize("tp,s,b", [(8, 8192, 1), (4, 4096, 2)])
def test_te_layer_with_qk_norms_is_megatrons_arithmetic(tp, s, b):
    """bf16, sequence parallel, per TP rank (tokens s·b, widths split by t): the layer input and its normalised
    output 2·h each; q_layernorm's input (the query's reshape copy) 2·a·d and k_layernorm's (a contiguous copy of
    the key view) 2·kv·d; q and k after the fused rotary 2·a·d and 2·kv·d, v 2·kv·d; the attention output 2·a·d;
    the residual and its normalised output 2·h each; fc1's output 2·2f, SwiGLU's 2·f. Statistics in fp32: the two
    fused norms' rstd (one per token each), the q/k norms' rstd (one per head and token: a + kv), the attention's
    logsumexp (a per token)."""
    h, a, kv, d, f = 5120, 64, 8, 128, 25600
    tokens = s * b // tp  # SP splits the norms' tokens; TP the heads and FFN columns: the same s·b/t factor
    expected = tokens * (2 * 4 * h + 2 * a * d + 2 * kv * d + 2 * a * d + 2 * kv * d + 2 * kv * d + 2 * a * d
                         + 2 * 2 * f + 2 * f) + 4 * tokens * (2 + a + kv) + 4 * tokens * a
    prof = analytic.profile(QWEN3, ParallelConfig(tp=tp, sequence_parallel=True, seq_len=s, micro_batch_size=b),
                            H100, kernels="te")
    assert layer_bytes(prof) == expected
    without = QWEN3.model_copy(update={"qk_norm": False})
    base = analytic.profile(without, ParallelConfig(tp=tp, sequence_parallel=True, seq_len=s, micro_batch_size=b),
                            H100, kernels="te")
    assert layer_bytes(prof) - layer_bytes(base) == tokens * (2 * a * d + 2 * kv * d) + 4 * tokens * (a + kv)


def test_what_te_does_not_build_is_refused(tmp_path):
    r = lynx("profile", "tests/data/hf/olmo2-7b.json", "--kernels", "te", "--pp", 2, "-o", tmp_path / "p.json")
    assert r.exit_code == 2 and "q/k norms over all heads" in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "p.json").exists()
    par = ParallelConfig(seq_len=1024, micro_batch_size=1)
    for update, message in (({"norm_layout": "sandwich"}, "sandwich norms"), ({"norm_layout": "post"}, "post norms"),
                            ({"attn_output_gate": True}, "output gates")):
        with pytest.raises(ValueError, match=message):
            analytic.profile(QWEN3.model_copy(update=update), par, H100, kernels="te")


def test_a_qwen3_te_plan_checks_and_exports(tmp_path):
    r = lynx("profile", "qwen3-32b", "--kernels", "te", "--tp", 8, "--sequence-parallel", "--pp", 4, "--seq-len", 4096,
             "--num-microbatches", 8, "--hardware", "h100-80g-nvlink", "-o", tmp_path / "p.json")
    assert r.exit_code == 0, r.output
    r = lynx("plan", tmp_path / "p.json", "--algo", "none", "-o", tmp_path / "plan.json")
    assert r.exit_code == 0, r.output
    assert lynx("check", tmp_path / "plan.json").exit_code == 0
    r = lynx("export", tmp_path / "plan.json", "--to", "megatron")
    assert r.exit_code == 0 and "--qk-layernorm" in r.output and "--transformer-impl transformer_engine" in r.output
