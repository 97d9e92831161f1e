"""Plans applied to real module trees (runtime/names.py): a plan profiled from a Hugging Face Llama on HF's and
torchtitan's Llama, a catalog GPT plan on the reference GPT, and the refusals that name what has no counterpart."""

from __future__ import annotations

import copy
import importlib.util
import json

import pytest
import torch
from conftest import lynx
from runtime_utils import Spec, plan_from_policies
from torch import nn

from lynx_planner.io import load_model
from lynx_planner.runtime import PlanMismatchError, apply_plan, runtime_of
from lynx_planner.runtime.names import module_convention, plan_convention
from lynx_planner.schema import Plan, Profile

HAS_TORCHTITAN = importlib.util.find_spec("torchtitan") is not None
needs_torchtitan = pytest.mark.skipif(not HAS_TORCHTITAN, reason="torchtitan is not installed (pip install "
                                      "'lynx-planner[torchtitan]')")

# HF op ids (as lynx's profiler records a LlamaDecoderLayer) a selective plan keeps: all have torchtitan counterparts
KEEP = ("input_layernorm:mul#1", "self_attn.q_proj:mm#0", "self_attn.k_proj:mm#0", "self_attn.v_proj:mm#0",
        "self_attn:_scaled_dot_product_flash_attention#0", "self_attn.o_proj:mm#0", ":add#0",
        "mlp.gate_proj:mm#0", "mlp.up_proj:mm#0", "mlp.down_proj:mm#0")


@pytest.fixture(scope="module")
def hf_profile(tmp_path_factory) -> Profile:
    path = tmp_path_factory.mktemp("hf") / "profile.json"
    result = lynx("profile", "examples/hf_llama.py", "-o", path)
    assert result.exit_code == 0, result.output
    return load_model(path, Profile)


def hf_plan(profile: Profile, keep=KEEP) -> Plan:
    """Layers 2..5 of the profile (model.layers.0-3): none, full, selective (KEEP; layer above), selective."""
    return plan_from_policies(profile, [[Spec("none"), Spec("full"), Spec("selective", keep=keep, at="layer_above"),
                                         Spec("selective", keep=keep)]], first_layer=2)


def grads_after_step(model: nn.Module, tokens: torch.Tensor, call=None) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    out = call(model, tokens) if call else model(tokens)
    logits = out.logits if hasattr(out, "logits") else out
    logits.float().square().mean().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def hf_llama(layers: int = 4) -> nn.Module:
    from examples.hf_llama import lynx_model
    torch.manual_seed(1)
    return lynx_model(layers=layers)[0]


def test_hf_plan_names_and_hf_model_layout(hf_profile):
    plan = hf_plan(hf_profile)
    assert plan_convention(plan).name == "hf"
    assert module_convention(hf_llama())[0].name == "hf"


def test_hf_plan_on_wrapped_hf_llama_equal_gradients(hf_profile):
    """The plan's paths under a wrapper (`model.` + HF's own `model.`): found by structure."""
    class Wrapper(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.model = inner

        def forward(self, tokens):
            return self.model(tokens).logits

    base = Wrapper(hf_llama())
    tokens = torch.randint(0, 1024, (2, 128))
    planned = apply_plan(copy.deepcopy(base), hf_plan(hf_profile))
    assert [l.path for l in runtime_of(planned).layers] == [f"model.model.layers.{i}" for i in range(4)]
    assert_same_grads(grads_after_step(base, tokens), grads_after_step(planned, tokens))
    assert runtime_of(planned).recomputations(0) == {3: ["on_demand"], 4: ["layer_above"], 5: ["on_demand"]}


def test_layout_mismatch_names_both_trees(hf_profile):
    plan = hf_plan(hf_profile)
    base = hf_llama()
    with pytest.raises(PlanMismatchError, match=r"'model.layers.0' \(hf layout\).*megatron layout: 'decoder.layers.0' is missing "
                       r"\(the module has 'model', 'model.embed_tokens', 'model.layers', 'model.layers.0'"):
        apply_plan(copy.deepcopy(base), plan, names="megatron")
    with pytest.raises(PlanMismatchError, match="not a known convention"):
        apply_plan(copy.deepcopy(base), plan, names="fairseq")


def test_catalog_gpt_plan_on_reference_gpt_equal_gradients():
    """gpt-1.3b's shipped HEU plan (24 layers, lynx's names) on a narrow reference GPT of the same depth."""
    from lynx_planner.models.gpt_block import GPT
    plan = load_model("plans/gpt-1.3b-a100-80g-pcie-tp2-pp2-mb2-m8-heu.json", Plan)
    assert plan_convention(plan).name == "lynx"
    torch.manual_seed(2)
    base = GPT(vocab=128, hidden=64, heads=4, layers=24, seq_len=32, attention="flash", dropout=0.1)
    assert module_convention(base)[0].name == "reference-gpt"
    tokens = torch.randint(0, 128, (2, 32))
    for stage in (0, 1):
        planned = apply_plan(copy.deepcopy(base), plan, stage=stage)
        layers = runtime_of(planned).layers
        # every layer of the stage's plan, in the reference GPT's names: lynx's 'embedding' is its 'embed', the
        # transformer layers keep theirs; 'lm_head' has no counterpart (the reference GPT's final layers are two,
        # 'norm' and 'head') and is not recomputed, so it is left alone
        st = plan.stages[stage]
        assert not any(pol.mode != "none" and st.layer_names[pol.layers[1] - 1 - st.layers[0]] == "lm_head"
                       for pol in st.policies)
        assert [layer.path for layer in layers] == [{"embedding": "embed"}.get(n, n) for n in st.layer_names
                                                    if n != "lm_head"]
        assert_same_grads(grads_after_step(base, tokens), grads_after_step(planned, tokens))


# ---- torchtitan 0.3: its own Llama 3 debug model (CPU: SDPA inner attention; flex attention has no CPU backward)

def torchtitan_llama(layers: int = 4, fuse_qkv: bool = True) -> nn.Module:
    from lynx_planner.integrations.torchtitan import debug_llama3
    torch.manual_seed(3)
    return debug_llama3(layers=layers, fuse_qkv=fuse_qkv)


@needs_torchtitan
@pytest.mark.parametrize("fuse_qkv", [True, False])
def test_hf_plan_on_torchtitan_llama_equal_gradients(hf_profile, fuse_qkv):
    base = torchtitan_llama(fuse_qkv=fuse_qkv)
    assert module_convention(base)[0].name == "torchtitan"
    tokens = torch.randint(0, 2048, (2, 64))
    planned = apply_plan(copy.deepcopy(base), hf_plan(hf_profile))
    runtime = runtime_of(planned)
    assert [l.path for l in runtime.layers] == [f"layers.{i}" for i in range(4)]
    kept = set(runtime.layers[2].keep)
    qkv = {"attention.qkv_linear.wqkv:mm#0"} if fuse_qkv else {f"attention.qkv_linear.w{x}:mm#0" for x in "qkv"}
    assert kept == qkv | {"attention_norm:mul#1", "attention.inner_attention:_scaled_dot_product_flash_attention#0",
                          "attention.wo:mm#0", ":add#0", "feed_forward.w1:mm#0", "feed_forward.w3:mm#0",
                          "feed_forward.w2:mm#0"}
    assert_same_grads(grads_after_step(base, tokens), grads_after_step(planned, tokens))
    assert runtime.recomputations(0) == {3: ["on_demand"], 4: ["layer_above"], 5: ["on_demand"]}


@needs_torchtitan
def test_torchtitan_refuses_ops_without_counterpart(hf_profile):
    rotary = ("self_attn:neg#0",)  # rotate_half's negation: torchtitan rotates by a complex product
    with pytest.raises(PlanMismatchError, match=r"keeps 'self_attn:neg#0', which has no counterpart"):
        apply_plan(torchtitan_llama(), hf_plan(hf_profile, keep=KEEP + rotary))
    with pytest.raises(PlanMismatchError, match=r"keeps the q projection\(s\) but not all of q, k, v"):
        apply_plan(torchtitan_llama(), hf_plan(hf_profile, keep=("self_attn.q_proj:mm#0",)))


def test_profile_json_names_hf_ops(hf_profile):
    """The table's HF side is what lynx's profiler records for HF's LlamaDecoderLayer (a rename there breaks it)."""
    from lynx_planner.runtime.names import _LLAMA_ROLES
    recorded = {op.id for op in hf_profile.blocks["LlamaDecoderLayer"].ops}
    missing = [hf for role, (hf, _) in _LLAMA_ROLES.items() if hf not in recorded and role != "attention_math"]
    assert not missing, json.dumps(missing)


def test_a_layer_the_convention_does_not_name_maps_under_the_prefix():
    """GPT-2's embedding dropout (`transformer.drop`, its own layer in a measured profile) has no role in the hf-gpt2
    convention; on the same layout under a prefix (validate's stage chain: `model.`) it is the same path there, and a
    plan recomputing it applies instead of being refused."""
    transformers = pytest.importorskip("transformers")
    from types import SimpleNamespace

    from lynx_planner.runtime.names import layer_paths

    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64))
    wrapped = nn.Module()
    wrapped.model = gpt2
    names = ["transformer.wte", "transformer.wpe", "transformer.drop", "transformer.h.0", "transformer.h.1",
             "transformer.ln_f", "lm_head"]
    plan = SimpleNamespace(stages=[SimpleNamespace(layer_names=names)])
    modes = ["none", "none", "full", "selective", "none", "none", "none"]
    assert layer_paths(wrapped, plan, names, modes) == ["model." + n for n in names]
