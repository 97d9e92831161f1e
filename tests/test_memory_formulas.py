"""Per-layer activation bytes against Korthikanti et al. (2022), Table 2, in exact integer arithmetic.

The analytic profile also counts what the paper neglects and PyTorch keeps: LayerNorm statistics (fp32 mean and
rstd, 8 bytes per token per LayerNorm). Every identity below adds exactly that term.
"""

from __future__ import annotations

import pytest

from lynx_planner import policy
from lynx_planner.analytic import gpt_profile
from lynx_planner.models.catalog import MODELS
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.schema import ParallelConfig
from lynx_planner.simulator import in_flight

CONFIGS = [  # model, tp, sequence parallel, micro-batch, sequence length
    ("gpt-1.3b", 1, False, 1, 2048),
    ("gpt-13b", 2, False, 2, 2048),
    ("gpt-22b", 8, False, 1, 2048),
    ("gpt-22b", 8, True, 4, 2048),
    ("gpt-175b", 8, True, 1, 2048),
    ("gpt-6.7b", 4, False, 1, 1024),
]


def layer(model: str, tp: int, sp: bool, mb: int, seq: int):
    par = ParallelConfig(tp=tp, pp=2, micro_batch_size=mb, seq_len=seq, num_microbatches=4, sequence_parallel=sp)
    prof = gpt_profile(MODELS[model], par, HARDWARE["a100-80g-nvlink"], attention="math", dropout=0.1)
    cfg = MODELS[model]
    return policy.analyse(prof.blocks["gpt_layer"]), seq, mb, cfg.hidden, cfg.heads


def ln_stats(s: int, b: int, t: int, sp: bool) -> int:
    return 2 * 8 * s * b // (t if sp else 1)


@pytest.mark.parametrize("model,tp,sp,mb,seq", CONFIGS)
def test_no_recomputation(model, tp, sp, mb, seq):
    info, s, b, h, a = layer(model, tp, sp, mb, seq)
    kept = policy.cost(info, policy.none_keep(info), ()).kept_bytes - ln_stats(s, b, tp, sp)
    if tp == 1:
        assert kept * h == s * b * h * (34 * h + 5 * a * s)  # sbh(34 + 5as/h)
    elif sp:
        assert kept * tp * h == s * b * h * (34 * h + 5 * a * s)  # (sbh/t)(34 + 5as/h)
    else:
        assert kept * h * tp == s * b * h * (10 * h * tp + 24 * h + 5 * a * s)  # sbh(10 + 24/t + 5as/(ht))


@pytest.mark.parametrize("model,tp,sp,mb,seq", CONFIGS)
def test_selective_recomputation(model, tp, sp, mb, seq):
    info, s, b, h, a = layer(model, tp, sp, mb, seq)
    keep = policy.selective_keep(info)
    kept = policy.cost(info, keep, policy.closure(info, keep)).kept_bytes - ln_stats(s, b, tp, sp)
    if sp:
        assert kept * tp == 34 * s * b * h  # sbh(34/t)
    else:
        assert kept * tp == s * b * h * (10 * tp + 24)  # sbh(10 + 24/t)
    assert set(policy.closure(info, keep)) == {"attn.core:baddbmm#0", "attn.core:_softmax#0",
                                               "attn.core.dropout:native_dropout#0"}


@pytest.mark.parametrize("model,tp,sp,mb,seq", CONFIGS)
def test_full_recomputation(model, tp, sp, mb, seq):
    info, s, b, h, _ = layer(model, tp, sp, mb, seq)
    kept = policy.cost(info, frozenset(), policy.full_recompute(info)).kept_bytes
    assert kept * (tp if sp else 1) == 2 * s * b * h  # 2sbh: the layer input (split along s with SP)


def test_flash_attention_keeps_no_quadratic_term():
    info, s, b, h, a = layer("gpt-13b", 1, False, 1, 2048)
    par = ParallelConfig(tp=1, pp=2, seq_len=2048, num_microbatches=4)
    flash = policy.analyse(gpt_profile(MODELS["gpt-13b"], par, HARDWARE["a100-80g-nvlink"], "flash", 0.1)
                           .blocks["gpt_layer"])
    kept = policy.cost(flash, policy.none_keep(flash), ()).kept_bytes
    lse = 4 * a * s * b
    assert kept - ln_stats(s, b, 1, False) - lse == 34 * s * b * h


@pytest.mark.parametrize("p,m", [(4, 16), (4, 2), (8, 8), (1, 3)])
def test_in_flight_micro_batches_1f1b(p, m):
    assert [in_flight("1f1b", p, s, m) for s in range(p)] == [min(m, p - s) for s in range(p)]
    assert [in_flight("gpipe", p, s, m) for s in range(p)] == [m] * p
