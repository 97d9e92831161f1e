"""`--kernels te` (Megatron-core with Transformer Engine) and `--fp8`: a Llama 3 8B layer saves what Megatron's
arithmetic says, derived here by hand from what each TE module keeps for its backward (Korthikanti et al. 2022,
table 2, extended to SwiGLU and GQA); the kernels are recorded in the profile and plan (absent from the JSON at the
default `hf`), and what they do not price is refused."""

from __future__ import annotations

import json

import pytest
from conftest import lynx

from lynx_planner import analytic, solvers
from lynx_planner.models.catalog import MODELS
from lynx_planner.models.hardware import HARDWARE, default_memory_limit
from lynx_planner.policy import analyse, cost, none_keep
from lynx_planner.schema import ParallelConfig

H100 = HARDWARE["h100-80g-nvlink"]
LLAMA = MODELS["llama3-8b"]  # h 4096, a 32, kv 8, f 14336


def layer_bytes(prof) -> int:
    """Bytes one decoder layer holds from its forward to its backward without recomputation (its input included)."""
    block = prof.blocks[prof.layers[1].block]
    info = analyse(block)
    return cost(info, none_keep(info), ()).kept_bytes


def te(tp: int, sp: bool, fp8: bool = False, s: int = 8192, b: int = 1):
    par = ParallelConfig(tp=tp, sequence_parallel=sp, seq_len=s, micro_batch_size=b)
    return analytic.profile(LLAMA, par, H100, kernels="te", fp8=fp8)


@pytest.mark.parametrize("tp,s,b", [(8, 8192, 1), (2, 4096, 2), (4, 2048, 1)])
def test_te_layer_with_sequence_parallelism_is_megatrons_arithmetic(tp, s, b):
    """Per layer, bf16, sequence parallel (every tensor split by t), bytes of s·b·h/t:
    layer input (the fused norm's input) 2, its normalised output (the QKV GEMM's input) 2, q after rotary 2, k and v
    2·kv/a each, attention output (fused attention and linear_proj) 2, the residual (the MLP norm's input) 2, its
    normalised output (fc1's input) 2, fc1's [gate, up] output (fused SwiGLU's input) 2·2f/h, SwiGLU's output (fc2's
    input) 2·f/h: 12 + 4·kv/a + 6·f/h (34 for Llama 3 8B: Korthikanti's 34 s·b·h/t of a GPT layer). Plus two fp32 rstd
    rows (4 s·b/t each) and the attention's fp32 logsumexp (4 per head and token: 4·s·b·a/t)."""
    h, a, kv, f = 4096, 32, 8, 14336
    sbh_t = s * b * h // tp
    expected = sbh_t * (12 + 4 * kv / a + 6 * f / h) + 2 * 4 * s * b // tp + 4 * s * b * a // tp
    assert 12 + 4 * kv / a + 6 * f / h == 34
    assert layer_bytes(te(tp, True, s=s, b=b)) == expected


def test_te_layer_without_sequence_parallelism():
    """Without SP the norms' inputs and outputs and the residual are whole on every TP rank (Korthikanti's 10 s·b·h
    + 24 s·b·h/t of a GPT layer): 2 + 2 + 2 + 2 = 8 s·b·h, the rest (4 + 4·kv/a + 6·f/h) s·b·h/t."""
    s, b, h, a, kv, f, tp = 4096, 1, 4096, 32, 8, 14336, 4
    sbh = s * b * h
    expected = sbh * 8 + sbh // tp * (4 + 4 * kv / a + 6 * f / h) + 2 * 4 * s * b + 4 * s * b * a // tp
    assert layer_bytes(te(tp, False, s=s)) == expected


def test_fp8_linear_layers_save_their_inputs_in_one_byte():
    """fp8: the fused norms write their output in fp8 (1 instead of 2, twice), linear_proj saves an fp8 copy of the
    attention output (+1: the fused attention still holds the bf16 one), fc2 an fp8 copy of the SwiGLU output
    (f/h instead of 2·f/h): 12 - 1 - 1 + 1 + 4·kv/a + 6·f/h - f/h = 11 + 4·kv/a + 5·f/h."""
    s, b, h, a, kv, f, tp = 8192, 1, 4096, 32, 8, 14336, 8
    sbh_t = s * b * h // tp
    expected = sbh_t * (11 + 4 * kv / a + 5 * f / h) + 2 * 4 * s * b // tp + 4 * s * b * a // tp
    assert layer_bytes(te(tp, True, fp8=True)) == expected


@pytest.mark.parametrize("tp,s,b", [(1, 4096, 1), (4, 8192, 2)])
def test_te_fused_attention_is_priced_causal(tp, s, b):
    """TE's fused attention computes the lower triangle of the s x s scores: half of 4 b s^2 heads d FLOPs (QK^T
    and PV, 2 FLOPs a multiply-add), per TP rank 32 / tp heads of 128, priced as the HF kernels' flash attention."""
    from lynx_planner import costs

    block = te(tp, tp > 1, s=s, b=b).blocks
    core = next(op for blk in block.values() for op in blk.ops if op.id == "self_attention.core_attention:fused_attn#0")
    heads, d = 32 // tp, 128
    causal = 4 * b * s * s * heads * d / 2
    assert core.fwd_s == pytest.approx(costs.attention_s(causal, H100, per_head_flops=causal / (b * heads)))


def test_te_saves_less_than_hf_eager():
    par = ParallelConfig(tp=8, sequence_parallel=True, seq_len=8192)
    hf = layer_bytes(analytic.profile(LLAMA, par, H100))
    assert layer_bytes(te(8, True)) < 0.8 * hf


def test_kernels_are_recorded_only_when_not_hf(tmp_path):
    r = lynx("profile", "llama3-8b", "--tp", 2, "--pp", 2, "--sequence-parallel", "-o", tmp_path / "hf.json")
    assert r.exit_code == 0, r.output
    assert "kernels" not in json.loads((tmp_path / "hf.json").read_text())
    r = lynx("profile", "llama3-8b", "--tp", 2, "--pp", 2, "--sequence-parallel", "--kernels", "te", "--fp8",
             "-o", tmp_path / "te.json")
    assert r.exit_code == 0 and "te kernels, fp8" in r.output, r.output
    prof = json.loads((tmp_path / "te.json").read_text())
    assert (prof["kernels"], prof["fp8"]) == ("te", True)
    r = lynx("plan", tmp_path / "te.json", "--algo", "heu", "-o", tmp_path / "plan.json")
    assert r.exit_code == 0, r.output
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert (plan["kernels"], plan["fp8"]) == ("te", True)
    assert lynx("check", tmp_path / "plan.json").exit_code == 0


@pytest.mark.parametrize("args,message", [
    (["gpt-1.3b", "--kernels", "te"], "gpt family"),
    (["mixtral-8x7b", "--kernels", "te"], "mixture-of-experts"),
    (["llama3-8b", "--fp8"], "--fp8"),
    (["qwen3-32b", "--kernels", "torchtitan"], "Llama 3 block"),
    (["llama3-8b", "--kernels", "torchtitan", "--fp8"], "--fp8"),
    (["examples/gpt_model.py", "--kernels", "te"], "model file"),
])
def test_what_the_kernels_do_not_price_is_refused(tmp_path, args, message):
    r = lynx("profile", *args, "-o", tmp_path / "p.json")
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "p.json").exists()


def test_llama3_405b_as_meta_trained_it_fits_without_recomputation_with_te():
    """Llama 3 405B as the Llama 3 paper trained it (TP 8 with SP, PP 16, CP 1, seq 8192, micro-batch 1; 1F1B here,
    DP 128 with the distributed optimizer) on 80 GB H100s: with TE's kernels no recomputation fits the device (after
    lynx's memory reserve); with Hugging Face's eager kernels it does not."""
    par = ParallelConfig(tp=8, sequence_parallel=True, pp=16, dp=128, distributed_optimizer=True, seq_len=8192,
                         num_microbatches=16, optimizer_step=True, rank_order="tp-dp-pp")
    limit = default_memory_limit(H100)  # what `lynx plan` allows without --memory-limit
    peaks = {}
    for kernels in ("te", "hf"):
        prof = analytic.profile(MODELS["llama3-405b"], par, H100, kernels=kernels)
        peaks[kernels] = solvers.solve(prof, "none", 1 << 50).evaluation.peak_bytes
    assert peaks["te"] < 0.76 * peaks["hf"]
    assert peaks["te"] <= limit < peaks["hf"]


def test_torchtitan_kernels_are_lynxs_measured_profile_of_torchtitans_block(tmp_path):
    """`--kernels torchtitan` of torchtitan's Llama 3 debug model's shape (dim 256, 16 heads, FFN 768, vocabulary
    2048, 6 layers) against lynx's profile of torchtitan's own module in bf16 (examples/torchtitan_llama3.py): the same
    op ids, outputs, saved tensors and statistics, so the same bytes per layer; Hugging Face's kernels differ."""
    pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install 'lynx-planner[torchtitan]')")
    from lynx_planner.io import load_model
    from lynx_planner.models.spec import ModelSpec
    from lynx_planner.schema import Profile

    r = lynx("profile", "examples/torchtitan_llama3.py", "--dtype", "bf16", "-o", tmp_path / "tt.json")
    assert r.exit_code == 0, r.output
    measured = load_model(tmp_path / "tt.json", Profile)
    spec = ModelSpec(name="debug", family="llama", num_layers=6, hidden=256, heads=16, ffn_hidden=768, vocab=2048)
    par = ParallelConfig(seq_len=64, micro_batch_size=2)
    built = analytic.profile(spec, par, measured.hardware, kernels="torchtitan")
    got, want = built.blocks[built.layers[1].block], measured.blocks[measured.layers[1].block]

    def graph(block):
        return [(o.id, o.out_bytes, o.aux_bytes, sorted(o.saves), o.inplace) for o in block.ops]

    assert graph(got) == graph(want)
    assert layer_bytes(built) == layer_bytes(measured)
    assert layer_bytes(analytic.profile(spec, par, measured.hardware)) != layer_bytes(measured)


def test_tune_profiles_every_layout_with_the_kernels_given(tmp_path):
    r = lynx("tune", "llama3-8b", "--gpus", 8, "--hardware", "h100-80g-nvlink", "--global-batch", 16, "--seq-len",
             4096, "--kernels", "te", "--top", 2, "--out", tmp_path / "best")
    assert r.exit_code == 0, r.output
    prof = json.loads((tmp_path / "best" / "profile.json").read_text())
    assert prof["kernels"] == "te" and "self_attention.linear_qkv:gemm#0" in json.dumps(prof["blocks"])
    assert lynx("check", tmp_path / "best" / "plan.json").exit_code == 0
    r = lynx("tune", "examples/gpt_model.py", "--gpus", 2, "--global-batch", 4, "--kernels", "te")
    assert r.exit_code == 2 and "model file" in r.output, r.output


def test_a_torchtitan_kernels_plan_applies_to_torchtitans_model(tmp_path):
    """A HEU plan from `--kernels torchtitan` names torchtitan's own ops: it applies to torchtitan's Llama 3 (bf16) as
    it is, recomputing some of them, with the unplanned model's gradients."""
    pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install 'lynx-planner[torchtitan]')")
    import copy

    import torch

    import lynx_planner
    from conftest import between
    from lynx_planner.integrations.torchtitan import debug_llama3
    from lynx_planner.io import dumps
    from lynx_planner.models.spec import ModelSpec

    spec = ModelSpec(name="debug", family="llama", num_layers=6, hidden=256, heads=16, ffn_hidden=768, vocab=2048)
    prof = analytic.profile(spec, ParallelConfig(seq_len=64, micro_batch_size=2), H100, kernels="torchtitan")
    plan = solvers.plan(prof, "p.json", "0" * 64, "heu", between(prof, 0.5))
    assert any(p.recompute for st in plan.stages for p in st.policies)
    (tmp_path / "plan.json").write_text(dumps(plan))
    torch.manual_seed(0)
    base = debug_llama3(layers=6, dtype=torch.bfloat16)
    planned = lynx_planner.apply_plan(copy.deepcopy(base), str(tmp_path / "plan.json"), stage=0)
    tokens = torch.randint(0, 2048, (2, 64))
    grads = []
    for model in (base, planned):
        model(tokens).float().square().mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    assert all(torch.equal(grads[0][n], grads[1][n]) for n in grads[0])
