"""Qwen3-Next (models/families/qwen3_next.py): its layer pattern and active parameters are transformers', the Gated
DeltaNet layer's op graph over several chunks (the sequence padded to them) is lynx's measured profile of the HF
module op by op, every config field is read or refused by name, what is not priced is refused, and the Megatron
export parses back (Megatron's own parser, validate_args, TransformerConfig) into the published config's model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lynx_planner import analytic
from lynx_planner.io import InputError
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.models.hf_config import read_hf_config, spec_from_hf
from lynx_planner.schema import ParallelConfig
from conftest import lynx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
PUBLISHED = HERE / "data" / "hf" / "qwen3-next-80b.json"
CFG = json.loads(PUBLISHED.read_text())
HW = HARDWARE["h100-80g-nvlink"]


def _hf_config(cfg: dict):
    transformers = pytest.importorskip("transformers")
    kw = {k: v for k, v in cfg.items() if k not in ("model_type", "architectures", "torch_dtype",
                                                    "transformers_version")}
    return transformers.AutoConfig.for_model("qwen3_next", **kw)


def test_layer_pattern_is_transformers():
    """full_attention_interval 4: transformers' Qwen3NextConfig derives layer_types from it; lynx's linear layers
    are the same, and each layer type is its own block."""
    hf = _hf_config(CFG).layer_types
    spec = read_hf_config(str(PUBLISHED))
    assert spec.linear_layers == tuple(i for i, t in enumerate(hf) if t == "linear_attention")
    assert len(spec.linear_layers) == 36 and 3 not in spec.linear_layers
    prof = analytic.profile(spec, ParallelConfig(seq_len=256, micro_batch_size=1, tp=2), HW)
    blocks = [l.block for l in prof.layers if l.name.startswith("model.layers.")]
    assert blocks[:4] == ["Qwen3NextDecoderLayer"] * 3 + ["Qwen3NextDecoderLayer_2"]
    assert any(op.id.startswith("linear_attn.") for op in prof.blocks["Qwen3NextDecoderLayer"].ops)
    assert any(op.id.startswith("self_attn.") for op in prof.blocks["Qwen3NextDecoderLayer_2"].ops)


def test_active_params_from_transformers_modules():
    """Active parameters: transformers' count less the routed experts a token does not use ((512 - 10) / 512 of
    each layer's `mlp.experts`), counted from the model built on the meta device."""
    import torch
    import transformers

    config = _hf_config(CFG)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    spec = read_hf_config(str(PUBLISHED))
    assert spec.params() == total
    assert spec.active_params() == total - experts * (512 - 10) // 512
    prof = analytic.profile(spec, ParallelConfig(seq_len=4096, micro_batch_size=1), HW)
    assert prof.model.params == sum(l.params for l in prof.layers) == total


def test_gated_delta_net_over_chunks_matches_the_hf_module():
    """130 tokens: three chunks of 64 (the last padded), the chunk loop's states kept from the second chunk on, the
    output reshaped out of the solves' layout: op ids, saved tensors and bytes as lynx's profiler records
    transformers' module (its torch fallback of the delta rule) in bf16."""
    pytest.importorskip("transformers")
    from lynx_planner.profiler import profile_model_file
    from hf_families import CONFIGS
    from test_analytic_families import kept

    par = ParallelConfig(seq_len=130, micro_batch_size=2)
    real = profile_model_file(str(HERE / "hf_families.py"), parallel=par, hardware=HW, dtype="bf16",
                              progress=False, overrides={"family": "qwen3_next", "batch_size": 2, "seq_len": 130})
    ana = analytic.profile(spec_from_hf(CONFIGS["qwen3_next"], "qwen3_next", "hf_families qwen3_next"), par, HW)
    gdn = ana.blocks["Qwen3NextDecoderLayer"]
    assert sum(op.id.startswith("linear_attn:copy_#") for op in gdn.ops) == 3  # one per chunk
    for name in ("Qwen3NextDecoderLayer", "Qwen3NextDecoderLayer_2"):
        ours, theirs = ana.blocks[name], real.blocks[name]
        assert [op.id for op in ours.ops] == [op.id for op in theirs.ops]
        for a, r in zip(ours.ops, theirs.ops):
            assert (a.out_bytes, a.aux_bytes, sorted(a.saves), sorted(a.inputs), a.inplace) == \
                (r.out_bytes, r.aux_bytes, sorted(r.saves), sorted(r.inputs), r.inplace), a.id
        assert kept(ours) == kept(theirs)


def test_made_up_field_is_named(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CFG, "linear_state_dtype": "float32"}))
    with pytest.raises(InputError, match=r"'linear_state_dtype'.*not modelled"):
        read_hf_config(str(path))
    r = lynx("profile", path, "--tp", 2, "-o", tmp_path / "p.json")
    assert r.exit_code == 2 and "linear_state_dtype" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("field,value", [("use_sliding_window", True), ("attention_bias", True),
                                         ("layer_types", ["linear_attention", "sliding_attention"] * 24),
                                         ("linear_num_value_heads", 24), ("hidden_act", "gelu"),
                                         ("shared_expert_intermediate_size", 0)])
def test_unmodelled_values_refused(field, value):
    with pytest.raises(InputError, match=field):
        spec_from_hf({**CFG, field: value}, "q", "config.json")


@pytest.mark.parametrize("flags,named", [(["--kernels", "te"], "linear attention layers are priced with the hf "
                                          "kernels only"),
                                         (["--cp", 2, "--dp", 2], "context parallelism is not priced"),
                                         (["--tp", 4], "key/value heads (2)")])
def test_what_is_not_priced_is_refused(tmp_path, flags, named):
    out = tmp_path / "p.json"
    r = lynx("profile", PUBLISHED, "--seq-len", 1024, *(["--tp", 2] if "--tp" not in flags else []), *flags,
             "-o", out)
    assert r.exit_code == 2 and named in r.output and "Traceback" not in r.output, r.output
    assert not out.exists()


def test_tune_leaves_out_the_layouts_the_model_cannot_run():
    """A refusal that holds for one layout only (CP for the Gated DeltaNet layers, TP above the key heads) leaves that
    layout out of tune's search instead of ending it; the layouts the model runs in are profiled as before."""
    from lynx_planner import tune
    profiles = tune.Profiles(str(PUBLISHED), HW, 32768, True)
    assert profiles(tune.Layout(2, 4, 8, 1, 8, True, ep=8, cp=2)) is None
    assert profiles(tune.Layout(4, 4, 8, 1, 8, True, ep=8)) is None
    assert profiles(tune.Layout(2, 4, 8, 1, 8, True, ep=8)) is not None


def test_megatron_builds_the_published_model():
    """The export's flags through Megatron's parser, validate_args and TransformerConfig: the shared checks of
    every family (test_megatron_export.assert_describes) and the Gated DeltaNet's, read from the config's own
    fields and transformers' layer_types."""
    import megatron_parser

    if megatron_parser.load() is None:
        pytest.skip("megatron-core is not installed (.ci/run installs it)")
    import test_megatron_export as t
    from lynx_planner import export

    prof = t.profile_of(CFG, tp=2, pp=4, dp=8, ep=8, sequence_parallel=True, num_microbatches=8, seq_len=4096)
    got = export.megatron(t.plan_of(prof), prof)
    args, config = t.parsed(prof, got.flags)
    t.assert_describes(args, config, CFG)
    hf = _hf_config(CFG).layer_types
    assert config.experimental_attention_variant == "gated_delta_net"
    assert config.linear_attention_freq == [int(k == "linear_attention") for k in hf]
    assert (config.linear_conv_kernel_dim, config.linear_key_head_dim, config.linear_value_head_dim,
            config.linear_num_key_heads, config.linear_num_value_heads) == \
        (CFG["linear_conv_kernel_dim"], CFG["linear_key_head_dim"], CFG["linear_value_head_dim"],
         CFG["linear_num_key_heads"], CFG["linear_num_value_heads"])
    assert config.attention_output_gate and config.qk_layernorm and config.moe_shared_expert_gate
    assert config.layernorm_zero_centered_gamma  # Qwen3-Next's (1 + weight) RMSNorms


def test_a_plan_recomputing_gated_delta_net_ops_applies_to_the_hf_model(tmp_path):
    """A HEU plan made from the analytic profile (130 tokens: three chunks), tight enough to recompute inside the
    Gated DeltaNet layers, lands on transformers' module (the same op ids) with bit-identical gradients."""
    import torch

    pytest.importorskip("transformers")
    from hf_families import CONFIGS, lynx_model
    from lynx_planner.io import load_model
    from lynx_planner.runtime import apply_plan
    from lynx_planner.schema import Plan

    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIGS["qwen3_next"]))
    prof, plan_path = tmp_path / "profile.json", tmp_path / "plan.json"
    r = lynx("profile", config, "--hardware", "h100-80g-nvlink", "--seq-len", 130, "--micro-batch-size", 2, "-o", prof)
    assert r.exit_code == 0, r.output
    r = lynx("plan", prof, "--algo", "heu", "--memory-limit", "8MiB", "-o", plan_path)  # none 12.2, full 6.7 MiB
    assert r.exit_code == 0, r.output
    plan = load_model(plan_path, Plan)
    gdn = [p for st in plan.stages for p in st.policies if p.recompute and
           any(op.startswith("linear_attn") for op in p.recompute)]
    assert gdn, "the plan must recompute Gated DeltaNet ops for this test to mean anything"

    def model():
        torch.manual_seed(0)
        return lynx_model("qwen3_next", batch_size=2, seq_len=130)[0].to(torch.bfloat16)

    def grads(m, tokens):
        m.zero_grad(set_to_none=True)
        m(tokens).logits.float().square().mean().backward()
        return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    tokens = torch.randint(0, CONFIGS["qwen3_next"]["vocab_size"], (2, 130))
    reference = grads(model(), tokens)
    planned = grads(apply_plan(model(), plan_path, stage=0), tokens)
    assert planned.keys() == reference.keys()
    for name, g in planned.items():
        assert torch.equal(g, reference[name]), name
