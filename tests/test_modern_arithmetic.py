"""The Hugging Face families' arithmetic against independent derivations: parameters per tensor-parallel x
expert-parallel rank from transformers' own parameter list split by Megatron's rules (column/row parallel weights
and experts split, norms, routers and MLA's down-projections replicated), total and active parameters from
transformers' model, causal attention's FLOPs, the all-to-all's bytes (tokens x top-k), sequence parallelism's
per-rank norms, and the tied head's copy on the last stage."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from lynx_planner import costs  # noqa: E402
from lynx_planner.analytic import profile  # noqa: E402
from lynx_planner.models.hardware import HARDWARE  # noqa: E402
from lynx_planner.models.hf_config import spec_from_hf  # noqa: E402
from lynx_planner.schema import ParallelConfig  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_families import CONFIGS  # noqa: E402

HW = HARDWARE["h100-80g-nvlink"]
SEQ, MB = 16, 2
MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "deepseek_v3_dense_first")
# Megatron's rules: what is replicated on every TP rank (norms, routers, the shared expert's gate, MLA's
# down-projections); routed experts split over TP x EP; every other weight of a layer split over TP.
REPLICATED = ("norm", "mlp.gate.", "shared_expert_gate", "q_a_proj", "kv_a_proj_with_mqa", "mlp.router.",
              "feed_forward.router.", "o_proj.bias")  # a row-parallel GEMM's bias: added once, after the reduce


def _spec(family: str, **change):
    return spec_from_hf({**CONFIGS[family], **change}, family, f"hf_families {family}")


def _hf_params(family: str, **change) -> dict[str, int]:
    """Parameter name -> element count of transformers' model (meta device: no memory)."""
    import torch
    import transformers

    cfg = {**CONFIGS[family], **change}
    mt = cfg.pop("model_type")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(mt, **cfg))
    return {n: p.numel() for n, p in model.named_parameters()}


def _rank_share(name: str, n: int, tp: int, ep: int) -> int:
    if any(r in name for r in REPLICATED):
        return n
    if ".experts." in name:  # routed experts (Llama 4's under feed_forward)
        assert n % (tp * ep) == 0
        return n // (tp * ep)
    assert n % tp == 0, name
    return n // tp


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("family", list(CONFIGS))
def test_params_per_rank_follow_megatrons_split_of_transformers_weights(family, tp):
    if family == "olmo2" and tp > 1:
        pytest.skip("OLMo 2's q/k norm over all heads has no Megatron split; lynx shards it per rank (docs/models.md)")
    ep = 2 if family in MOE else 1
    par = ParallelConfig(seq_len=SEQ, micro_batch_size=MB, tp=tp, dp=2, ep=ep)
    ana = profile(_spec(family), par, HW)
    hf = _hf_params(family)
    layers = {l.name: l.params for l in ana.layers}
    for i in range(CONFIGS[family]["num_hidden_layers"]):
        prefix = f"model.layers.{i}."
        want = sum(_rank_share(n, c, tp, ep) for n, c in hf.items() if n.startswith(prefix))
        assert layers[f"model.layers.{i}"] == want, (family, i)
    assert layers["model.embed_tokens"] == hf["model.embed_tokens.weight"] // tp
    assert layers["lm_head"] == hf["lm_head.weight"] // tp
    assert layers["model.norm"] == hf["model.norm.weight"]


@pytest.mark.parametrize("family", list(CONFIGS))
@pytest.mark.parametrize("tied", [False, True])
def test_total_and_active_params_equal_transformers(family, tied):
    """Total: transformers' count (a tied head counted once). Active: the total less, in every layer that has routed
    experts (found in transformers' model, not lynx's spec), the share of its experts a token does not visit."""
    hf = _hf_params(family, tie_word_embeddings=tied)
    spec = _spec(family, tie_word_embeddings=tied)
    assert spec.params() == sum(hf.values())
    cfg = CONFIGS[family]
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
    if experts:
        top_k = cfg["num_experts_per_tok"]
        routed = sum(n for k, n in hf.items() if ".experts." in k)
        assert spec.active_params() == sum(hf.values()) - routed * (experts - top_k) // experts
    # one tensor on one stage: an untied head at pp 1, nothing more where the head is the embedding
    one_stage = profile(spec, ParallelConfig(seq_len=SEQ, micro_batch_size=MB), HW)
    assert sum(l.params for l in one_stage.layers) == sum(hf.values())


def test_tied_head_holds_its_copy_of_the_embedding_on_the_last_stage():
    """Megatron (and torchtitan's pipeline split): with pp > 1 the last stage keeps its own copy of the tied word
    embedding as the output weight (kept equal by an all-reduce of the gradients); at pp 1 the head is the
    embedding itself."""
    spec = _spec("llama", tie_word_embeddings=True)
    v, h = CONFIGS["llama"]["vocab_size"], CONFIGS["llama"]["hidden_size"]
    for tp in (1, 2):
        pp1 = profile(spec, ParallelConfig(seq_len=SEQ, micro_batch_size=MB, tp=tp), HW)
        pp2 = profile(spec, ParallelConfig(seq_len=SEQ, micro_batch_size=MB, tp=tp, pp=2, num_microbatches=2), HW)
        assert pp1.layers[-1].params == 0
        assert pp2.layers[-1].params == v * h // tp > 0


def _ops(family: str, **par):
    """The ops of the (last) decoder layer's block."""
    p = profile(_spec(family), ParallelConfig(seq_len=SEQ, micro_batch_size=MB, **par), HW)
    return {op.id: op for op in p.blocks[p.layers[-3].block].ops}


@pytest.mark.parametrize("family", ["llama", "qwen3", "mixtral"])
def test_attention_is_priced_causal(family):
    """Causal attention computes the lower triangle of the s x s scores: half of 4 b s^2 heads d FLOPs (QK^T and PV,
    2 FLOPs a multiply-add), per TP rank heads / tp."""
    cfg = CONFIGS[family]
    heads, d = cfg["num_attention_heads"], cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    for tp in (1, 2):
        core = _ops(family, tp=tp)["self_attn:_scaled_dot_product_flash_attention#0"]
        causal = 4 * MB * SEQ * SEQ * (heads // tp) * d / 2
        assert core.fwd_s == pytest.approx(costs.attention_s(causal, HW, per_head_flops=causal / (MB * heads // tp)))


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "deepseek_v3"])
def test_expert_and_shared_expert_gemms_are_split_by_tp(family):
    """A rank's routed-expert GEMMs: tokens x top_k rows (balanced routing) through h -> 2 x ffn / tp (gate and up)
    and ffn / tp -> h; the shared expert's (Qwen2-MoE, DeepSeek) through its ffn / tp."""
    cfg = CONFIGS[family]
    h, k = cfg["hidden_size"], cfg["num_experts_per_tok"]
    f = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    shared = cfg.get("shared_expert_intermediate_size") or cfg.get("n_shared_experts", 0) * f
    prefix = "mlp.shared_expert" if family == "qwen2_moe" else "mlp.shared_experts"
    for tp in (1, 2):
        ops = _ops(family, tp=tp)
        assert ops["mlp.experts:_grouped_mm#0"].flops == 2 * SEQ * MB * k * h * 2 * f // tp
        assert ops["mlp.experts:_grouped_mm#1"].flops == 2 * SEQ * MB * k * f // tp * h
        if shared:
            assert ops[f"{prefix}.gate_proj:mm#0"].flops == 2 * SEQ * MB * h * shared // tp
            assert ops[f"{prefix}.down_proj:mm#0"].flops == 2 * SEQ * MB * shared // tp * h


def test_ep_all_to_all_moves_every_tokens_top_k_copies():
    """Dispatch and combine each move tokens x top_k rows of h bf16 values over the EP group (TP x EP ranks)."""
    cfg = CONFIGS["mixtral"]
    rows = SEQ * MB * cfg["num_experts_per_tok"]
    for tp, ep in ((1, 2), (2, 2), (1, 4)):
        ops = _ops("mixtral", tp=tp, dp=4, ep=ep)
        want = costs.all_to_all_s(2 * rows * cfg["hidden_size"], ep, costs.link(HW, tp * ep))
        for op in ("mlp.experts:ep_dispatch#0", "mlp.experts:ep_combine#0"):
            assert ops[op].fwd_s == pytest.approx(want) and ops[op].bwd_s == pytest.approx(want)


@pytest.mark.parametrize("family", ["llama", "mixtral", "deepseek_v3"])
def test_sequence_parallel_splits_norms_and_residuals(family):
    """With sequence parallelism each TP rank normalises and adds its s / tp tokens: a norm's fp32 copy and the
    residual adds hold 1 / tp of the tokens' bytes; without it, all of them."""
    h = CONFIGS[family]["hidden_size"]
    tokens = SEQ * MB
    for sp, share in ((False, tokens), (True, tokens // 2)):
        ops = _ops(family, tp=2, sequence_parallel=sp)
        assert ops["input_layernorm:_to_copy#0"].out_bytes == 4 * share * h  # fp32
        assert ops["post_attention_layernorm:_to_copy#0"].out_bytes == 4 * share * h
        assert ops[":add#0"].out_bytes == ops[":add#1"].out_bytes == 2 * share * h  # bf16 residual
