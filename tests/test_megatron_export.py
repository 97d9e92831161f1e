"""`lynx export --to megatron` builds the profiled model: Megatron-LM's own parser, validate_args and
TransformerConfig build (with its pipeline-layout validation) accept the exported flags of Llama, Mixtral (EP),
DeepSeek-V3 (reduced depth) and interleaved plans, and the parsed arguments describe the model as its Hugging Face
config.json does (read here from the config's own fields, not from lynx's ModelSpec). Skipped where megatron-core
0.19.2 is not installed (.ci/run installs it); what Megatron cannot build is refused (exit 2)."""

from __future__ import annotations


import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import megatron_parser
from lynx_planner import analytic, export, solvers
from lynx_planner.cli import app
from lynx_planner.io import InputError, dumps
from lynx_planner.models.catalog import HF_CONFIGS
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.models.hf_config import spec_from_hf
from lynx_planner.schema import ParallelConfig

MEGATRON = megatron_parser.load()
needs_megatron = pytest.mark.skipif(MEGATRON is None, reason="megatron-core is not installed (pip install --no-deps "
                                    "--ignore-requires-python megatron-core==0.19.2; .ci/run does)")
H100 = HARDWARE["h100-80g-nvlink"]
DATA = Path(__file__).resolve().parent / "data" / "hf"


def hf(name: str, **changes) -> dict:
    return {**HF_CONFIGS[name][1], **changes}


def profile_of(cfg: dict, kernels: str = "hf", fp8: bool = False, **par):
    spec = spec_from_hf(cfg, "test", "test")
    return analytic.profile(spec, ParallelConfig(**par), H100, kernels=kernels, fp8=fp8)


def plan_of(prof, algo: str = "none"):
    return solvers.plan(prof, "p.json", "0" * 64, algo, 1 << 50)


def world(prof) -> int:
    return prof.parallel.tp * prof.parallel.pp * prof.parallel.dp


def windows(cfg: dict) -> list[int | None]:
    """Each layer's sliding window (keys a query sees, itself included; None: full attention), from the config's
    own fields as transformers reads them."""
    n, w = cfg["num_hidden_layers"], cfg.get("sliding_window")
    if cfg.get("layer_types"):
        return [w if t == "sliding_attention" else None for t in cfg["layer_types"]]
    if cfg["model_type"] == "gpt_oss":  # transformers' default: sliding first, alternating
        return [w if i % 2 == 0 else None for i in range(n)]
    if cfg["model_type"] in ("mistral", "phi3"):
        return [w] * n
    if cfg["model_type"] == "qwen2" and cfg.get("use_sliding_window"):  # from max_window_layers on
        return [w if i >= cfg["max_window_layers"] else None for i in range(n)]
    return [None] * n


def assert_describes(args, config, cfg: dict) -> None:
    """The parsed arguments are the config.json's model."""
    import torch
    import torch.nn.functional as F
    from megatron.core.tokenizers.utils.build_tokenizer import vocab_size_with_padding
    from megatron.core.transformer.utils import is_layer_window_attention

    mt, heads, n = cfg["model_type"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    assert (config.num_layers, config.hidden_size, config.num_attention_heads) == (n, cfg["hidden_size"], heads)
    assert config.normalization == "RMSNorm" and config.layernorm_epsilon == cfg.get("rms_norm_eps", 1e-5)
    assert config.gated_linear_unit
    x = torch.linspace(-8, 8, 101)
    if mt == "gpt_oss":  # gate * sigmoid(1.702 gate) * (up + 1), both clamped
        assert torch.allclose(config.activation_func(x), x * torch.sigmoid(1.702 * x))
        assert config.glu_linear_offset == 1.0 and config.activation_func_clamp_value == cfg.get("swiglu_limit", 7.0)
    else:  # SwiGLU
        assert config.activation_func is F.silu and config.glu_linear_offset == 0.0
        assert config.activation_func_clamp_value is None
    assert args.position_embedding_type == "rope" and args.rotary_base == cfg.get("rope_theta", 10000)
    assert args.rotary_percent == cfg.get("partial_rotary_factor", 0.5 if mt == "glm4_moe" else 1.0)
    assert args.untie_embeddings_and_output_weights == (not cfg.get("tie_word_embeddings", False))
    biased = cfg.get("attention_bias", mt == "gpt_oss")
    assert config.add_bias_linear == (mt == "gpt_oss" and biased)  # gpt-oss: attention, router and experts
    assert config.add_qkv_bias == (mt in ("qwen2", "qwen2_moe") or (mt in ("glm4_moe", "gpt_oss") and biased))
    assert vocab_size_with_padding(args.vocab_size, args, logging_enabled=False) == cfg["vocab_size"]
    assert (config.attention_dropout, config.hidden_dropout) == (0.0, 0.0)
    assert config.softmax_type == ("learnable" if mt == "gpt_oss" else "vanilla")  # gpt-oss's sinks
    got = [config.window_size[0] + 1 if is_layer_window_attention(config.window_size, config.window_attn_skip_freq,
                                                                   i + 1) else None for i in range(n)]
    assert got == windows(cfg) and (config.window_size is None or config.window_size[1] == 0)
    assert (config.mtp_num_layers or 0) == cfg.get("num_nextn_predict_layers", 0)
    if "kv_lora_rank" in cfg:  # MLA
        assert config.multi_latent_attention
        assert (config.q_lora_rank, config.kv_lora_rank, config.qk_head_dim, config.qk_pos_emb_head_dim,
                config.v_head_dim) == (cfg.get("q_lora_rank"), cfg["kv_lora_rank"], cfg["qk_nope_head_dim"],
                                       cfg["qk_rope_head_dim"], cfg["v_head_dim"])
    else:
        assert not config.multi_latent_attention
        assert config.num_query_groups == cfg.get("num_key_value_heads", heads)
        assert config.kv_channels == cfg.get("head_dim", cfg["hidden_size"] // heads)
    experts = cfg.get("num_local_experts") or cfg.get("n_routed_experts") or cfg.get("num_experts")
    if experts is None:
        assert config.num_moe_experts is None and config.ffn_hidden_size == cfg["intermediate_size"]
        return
    assert (config.num_moe_experts, config.moe_router_topk) == (experts, cfg["num_experts_per_tok"])
    assert config.moe_ffn_hidden_size == cfg.get("moe_intermediate_size", cfg["intermediate_size"])
    dense = cfg.get("first_k_dense_replace", 0)
    freq = config.moe_layer_freq
    pattern = freq if isinstance(freq, list) else [1] * n
    assert pattern == [0] * dense + [1] * (n - dense)
    if dense:
        assert config.ffn_hidden_size == cfg["intermediate_size"]  # the dense layers' MLP
    shared = cfg.get("n_shared_experts", 0) * cfg.get("moe_intermediate_size", 0) \
        or cfg.get("shared_expert_intermediate_size")
    assert config.moe_shared_expert_intermediate_size == shared
    assert (config.moe_router_topk_scaling_factor or 1.0) == cfg.get("routed_scaling_factor", 1.0)
    if mt in ("deepseek_v3", "kimi_k2", "glm4_moe"):  # sigmoid scores, an expert bias, group-limited top-k
        assert (config.moe_router_score_function, config.moe_router_enable_expert_bias) == ("sigmoid", True)
        assert (config.moe_router_num_groups or 1, config.moe_router_group_topk or 1) == \
            (cfg.get("n_group", 1), cfg.get("topk_group", 1))
    else:
        assert config.moe_router_score_function == "softmax" and not config.moe_router_enable_expert_bias
        assert config.moe_router_pre_softmax == (not cfg.get("norm_topk_prob", mt != "deepseek_v2"))


def parsed(prof, flags):
    return megatron_parser.parse(flags, world(prof))


CASES = {
    # name: (config.json fields, parallel setup, plan algorithm)
    "llama3-8b": (hf("llama3-8b"), dict(tp=2, pp=4, num_microbatches=8, seq_len=4096), "heu"),
    "llama3-8b-te-fp8": (hf("llama3-8b"), dict(tp=8, pp=4, sequence_parallel=True, num_microbatches=8,
                                               seq_len=8192, kernels="te", fp8=True), "none"),
    "llama3-8b-interleaved": (hf("llama3-8b"), dict(tp=1, pp=2, num_microbatches=4, seq_len=2048,
                                                      schedule="interleaved-1f1b", virtual_stages=2), "none"),
    "mixtral-8x7b-ep": (hf("mixtral-8x7b"), dict(tp=2, pp=2, dp=4, ep=4, sequence_parallel=True,
                                                 num_microbatches=4, seq_len=4096), "full"),
    "mixtral-8x7b-tp-no-sp": (hf("mixtral-8x7b", num_hidden_layers=4), dict(tp=2, pp=2, num_microbatches=4,
                                                                             seq_len=1024), "none"),
    "deepseek-v3-5-layers": (hf("deepseek-v3", num_hidden_layers=5),
                             dict(tp=2, pp=2, dp=2, ep=2, sequence_parallel=True, num_microbatches=4,
                                  seq_len=4096), "none"),
    "deepseek-v3-5-layers-mtp": (hf("deepseek-v3", num_hidden_layers=5, num_nextn_predict_layers=1),
                                 dict(tp=2, pp=2, dp=2, ep=2, sequence_parallel=True, num_microbatches=4,
                                      seq_len=4096), "full"),
    # windows: Mistral's on every layer; Qwen2's from max_window_layers on (a pattern that does not repeat)
    "mistral-7b-window": (hf("llama3-8b", model_type="mistral", num_hidden_layers=4, sliding_window=4096,
                             vocab_size=32000, rope_theta=10000.0),
                          dict(tp=2, pp=2, num_microbatches=4, seq_len=8192), "none"),
    "qwen2-window-layers": (hf("qwen2.5-72b", num_hidden_layers=6, use_sliding_window=True, sliding_window=2048,
                               max_window_layers=2),
                            dict(tp=8, pp=2, num_microbatches=4, seq_len=4096), "none"),
}
# The published configs (tests/data/hf) Megatron builds, each on a layout that fits (the others are refused by
# name: test_published_families.py)
PUBLISHED = {"deepseek-v3.json": dict(tp=8, pp=16, dp=8, ep=8), "kimi-k2.json": dict(tp=8, pp=16, dp=8, ep=8),
             "deepseek-v2-lite.json": dict(tp=2, pp=2, dp=4, ep=4), "glm4.5-air.json": dict(tp=4, pp=4, dp=8, ep=8),
             "gpt-oss-120b.json": dict(tp=4, pp=4, dp=8, ep=8), "phi3-mini-4k.json": dict(tp=2, pp=2)}


@needs_megatron
@pytest.mark.parametrize("name", CASES)
def test_megatron_builds_the_profiled_model(name):
    cfg, par, algo = CASES[name]
    prof = profile_of(cfg, **par)
    plan = plan_of(prof, algo) if algo != "heu" else solvers.plan(prof, "p.json", "0" * 64, "heu", 40 << 30)
    got = export.megatron(plan, prof)
    args, config = parsed(prof, got.flags + (got.recompute.flags if got.recompute else []))
    assert_describes(args, config, cfg)
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.data_parallel_size) == \
        (prof.parallel.tp, prof.parallel.pp, prof.parallel.dp)
    assert args.expert_model_parallel_size == prof.parallel.ep
    if prof.parallel.virtual_stages > 1:
        assert args.virtual_pipeline_model_parallel_size == prof.parallel.virtual_stages
    assert args.transformer_impl == "transformer_engine" and config.fp8 == ("hybrid" if prof.fp8 else None)


@needs_megatron
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_megatron_builds_each_published_family(name):
    """Sliding windows and their pattern, sinks, MTP modules, partial rotary, biases, gpt-oss's activation: parsed
    back, they are the published config's (assert_describes reads the config's own fields)."""
    cfg = json.loads((DATA / name).read_text())
    par = dict(sequence_parallel=True, num_microbatches=8, seq_len=4096) | PUBLISHED[name]
    prof = profile_of(cfg, **par)
    got = export.megatron(plan_of(prof), prof)
    args, config = parsed(prof, got.flags)
    assert_describes(args, config, cfg)
    tp, ep = prof.parallel.tp, prof.parallel.ep
    # experts with biases (gpt-oss): Megatron has no expert TP for them, each expert whole on one of ep x tp ranks
    etp = 1 if cfg["model_type"] == "gpt_oss" else tp
    assert (args.expert_model_parallel_size, args.expert_tensor_parallel_size) == (ep * tp // etp, etp)


# (name, stage bounds over the profile's layers: [embedding, decoder layers..., final norm, output layer])
LAYOUTS = [("llama3-8b", [0, 6, 15, 25, 35]),  # E,t*5 | t*9 | t*10 | t*8,L (norm with the loss)
           ("llama3-8b", [0, 1, 12, 23, 35]),  # the embedding alone on stage 0
           ("llama3-8b", [0, 11, 22, 33, 35]),  # final norm and output layer alone on the last stage
           ("deepseek-v3-5-layers", [0, 4, 8]),  # the three dense layers (t, not E) with the embedding
           ("deepseek-v3-5-layers", [0, 2, 8]),
           ("deepseek-v3-5-layers-mtp", [0, 4, 9]),  # E,t*3 | t*2,m,L: the MTP module with the loss
           ("deepseek-v3-5-layers-mtp", [0, 6, 9]),  # E,t*5 | m,L
           ("deepseek-v3-5-layers-mtp", [0, 7, 9])]  # E,t*5,m | L: the MTP module on a stage of its own rank


@needs_megatron
@pytest.mark.parametrize("name,bounds", LAYOUTS)
def test_layout_strings_pass_megatrons_layout_validation(name, bounds):
    cfg, par, _ = CASES[name]
    prof = profile_of(cfg, **par)
    got = export.megatron(plan_of(prof), prof)
    layout = export.layout_flag(prof, bounds)[0]
    flags = [f for f in got.flags if not f.startswith(("--decoder-", "--pipeline-model-parallel-layout"))] + [layout]
    args, config = parsed(prof, flags)
    stages = config.pipeline_model_parallel_layout.layout  # [pp rank][virtual stage] -> layer types
    names = [l.name for l in prof.layers]
    n = cfg["num_hidden_layers"]  # model.layers.N past them: the MTP modules (DeepSeek's checkpoint names)
    for kind, is_kind in (("decoder", lambda i: i < n), ("mtp", lambda i: i >= n)):
        assert [sum(t.name == kind for t in stage[0]) for stage in stages] == \
            [sum(names[i].startswith("model.layers.") and is_kind(int(names[i].split(".")[2]))
                 for i in range(bounds[s], bounds[s + 1])) for s in range(len(bounds) - 1)]


def test_decoder_layers_are_t_whatever_their_mlp():
    """DeepSeek's dense first layers are decoder layers (`t`), the embedding and loss are named once each."""
    cfg, par, _ = CASES["deepseek-v3-5-layers"]
    prof = profile_of(cfg, **par)
    assert export.layout_flag(prof, [0, 4, 8]) == ['--pipeline-model-parallel-layout "E,t*3|t*2,L"']
    assert export.split_flags(prof, [0, 4, 8]) == ["--decoder-first-pipeline-num-layers 3"]
    assert export.split_flags(prof, [0, 1, 8]) == ['--pipeline-model-parallel-layout "E|t*5,L"']
    assert export.split_flags(prof, [0, 7, 8]) == ['--pipeline-model-parallel-layout "E,t*5|L"']
    cfg, par, _ = CASES["deepseek-v3-5-layers-mtp"]  # the MTP module (m) after the decoder layers, before the loss
    prof = profile_of(cfg, **par)
    assert export.split_flags(prof, [0, 4, 9]) == ["--decoder-first-pipeline-num-layers 3"]  # m with the loss
    assert export.split_flags(prof, [0, 7, 9]) == ['--pipeline-model-parallel-layout "E,t*5,m|L"']


def test_a_final_norm_apart_from_the_loss_is_a_note():
    """Megatron builds the final norm on the stage of the output layer: a plan that puts it on the stage before says
    so in the export's notes; a plan with both on the last stage has nothing to say."""
    cfg, par, _ = CASES["deepseek-v3-5-layers"]
    prof = profile_of(cfg, **par)
    names = [l.name for l in prof.layers]
    assert names[-2].endswith("norm") and len(names) == 8  # embedding, 5 decoder layers, final norm, output layer
    notes = export.layout_notes(prof, [0, 7, 8])
    assert len(notes) == 1 and f"final norm ({names[-2]}) on stage 0" in notes[0] and "output layer on stage 1" in notes[0]
    assert export.layout_notes(prof, [0, 4, 8]) == []


def test_an_old_decoder_profile_without_its_architecture_is_refused(tmp_path):
    prof = profile_of(hf("llama3-8b", num_hidden_layers=4), pp=2, num_microbatches=4, seq_len=1024)
    old = prof.model_copy(update={"model": prof.model.model_copy(update={"architecture": None})})
    p = tmp_path / "p.json"
    p.write_text(dumps(old))
    assert runner.invoke(app, ["plan", str(p), "--algo", "none", "-o", str(tmp_path / "plan.json")]).exit_code == 0
    r = runner.invoke(app, ["export", str(tmp_path / "plan.json"), "--to", "megatron"])
    assert r.exit_code == 2 and "model.architecture" in r.output and "Traceback" not in r.output, r.output


def test_a_field_without_a_megatron_flag_is_refused():
    """An architecture field the Megatron export does not know (a feature added later) is never dropped."""
    prof = profile_of(hf("llama3-8b", num_hidden_layers=4), pp=2, num_microbatches=4, seq_len=1024)
    arch = dict(prof.model.architecture, sliding_window=4096)
    prof = prof.model_copy(update={"model": prof.model.model_copy(update={"architecture": arch})})
    with pytest.raises(Exception, match="sliding_window"):
        export.megatron(plan_of(prof), prof, "p.json")


runner = CliRunner()


REFUSED = [  # (config.json, what the refusal names): features Megatron-core 0.19's GPTModel does not build
    (json.loads((DATA / "olmo2-7b.json").read_text()), "norm_layout: 'post'"),
    (json.loads((DATA / "gemma3-27b.json").read_text())["text_config"] | {"model_type": "gemma3_text"},
     "norm_layout: 'sandwich'"),
    (json.loads((DATA / "llama4-scout.json").read_text())["text_config"] | {"model_type": "llama4_text"},
     "'chunked'"),
    (hf("llama3-8b", num_hidden_layers=4, attention_bias=True), "but not on dense MLP"),
    (json.loads((DATA / "deepseek-v2-lite.json").read_text()) | {"num_hidden_layers": 4, "n_group": 8,
                                                                  "topk_group": 3,
                                                                  "topk_method": "group_limited_greedy"},
     "moe.n_group: 8"),
]


@pytest.mark.parametrize("cfg,named", REFUSED, ids=lambda x: x if isinstance(x, str) else x["model_type"])
def test_what_megatron_does_not_build_is_refused_by_name(cfg, named):
    prof = profile_of(cfg, tp=2, pp=2, num_microbatches=4, seq_len=1024, **({"dp": 2, "ep": 2} if
                                                                              "n_group" in named else {}))
    with pytest.raises(InputError, match="not exporting a different model") as err:
        export.megatron(plan_of(prof), prof, "p.json")
    assert named in str(err.value), str(err.value)
