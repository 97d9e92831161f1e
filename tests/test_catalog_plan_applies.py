"""A plan made from an analytic description (a config.json, as for the catalog's llama3-8b at a narrower width)
applies to the Hugging Face model built from that config: the analytic op ids are those lynx's profiler records for
the HF family, so the keep/recompute sets land on the real ops, with bit-identical gradients. The same plan applies
to torchtitan's Llama 3 of the same depth (its ops mapped by role, runtime/names.py) with bit-identical gradients
(torchtitan extra; skipped without it)."""

from __future__ import annotations

import copy
import importlib.util
import json

import pytest
import torch
from conftest import lynx

from lynx_planner import policy
from lynx_planner.io import load_model
from lynx_planner.runtime import apply_plan, runtime_of
from lynx_planner.runtime.names import block_policy
from lynx_planner.schema import LayerPolicy, Plan, Profile
from lynx_planner.simulator import layer_run

transformers = pytest.importorskip("transformers")

CONFIG = {"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "hidden_act": "silu",
          "tie_word_embeddings": False}
SEQ, BATCH = 16, 2
needs_torchtitan = pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None,
                                      reason="torchtitan is not installed (pip install 'lynx-planner[torchtitan]')")


def hf_llama() -> torch.nn.Module:
    cfg = dict(CONFIG)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg, max_position_embeddings=SEQ,
                                               use_cache=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)


def grads(model: torch.nn.Module, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(tokens).logits.float().square().mean().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("algo,limit", [("heu", "3.0MiB"), ("full", None)])
def test_plan_of_a_config_json_applies_to_the_hf_model(tmp_path, algo, limit):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    prof, plan_path = tmp_path / "profile.json", tmp_path / "plan.json"
    r = lynx("profile", tmp_path / "config.json", "--hardware", "h100-80g-nvlink", "--seq-len", str(SEQ),
             "--micro-batch-size", str(BATCH), "-o", prof)
    assert r.exit_code == 0, r.output
    r = lynx("plan", prof, "--algo", algo, "-o", plan_path, *(("--memory-limit", limit) if limit else ()))
    assert r.exit_code == 0, r.output
    plan = load_model(plan_path, Plan)
    recomputed = [p for st in plan.stages for p in st.policies if p.recompute]
    assert recomputed, "the plan must recompute something for this test to mean anything"

    tokens = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ))
    reference = grads(hf_llama(), tokens)
    planned = apply_plan(hf_llama(), plan_path, stage=0)
    assert grads(planned, tokens).keys() == reference.keys()
    for name, g in grads(planned, tokens).items():
        assert torch.equal(g, reference[name]), name


def test_the_loss_counts_on_the_last_stage_and_no_plan_names_it(tmp_path):
    """The stacks compute the cross-entropy outside `lm_head`: no plan keeps or recomputes it (a plan can only act on
    the head's GEMM), yet its fp32 softmax is held on the last stage whatever the plan and its time is in that
    stage's forward and backward."""
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    prof = tmp_path / "profile.json"
    assert lynx("profile", tmp_path / "config.json", "--hardware", "h100-80g-nvlink", "--seq-len", str(SEQ),
                "--micro-batch-size", str(BATCH), "--pp", "2", "-o", prof).exit_code == 0
    profile = load_model(prof, Profile)
    head = profile.blocks["Linear"]
    loss = next(op for op in head.ops if op.id.startswith("loss:"))
    fp32 = 4 * SEQ * BATCH * CONFIG["vocab_size"]
    assert loss.aux_bytes == fp32
    last = len(profile.layers) - 1
    for mode in ("none", "full"):
        run = layer_run(profile, last, LayerPolicy(layers=(last, last + 1), block="Linear", mode=mode,
                                                   recompute=[":mm#0"] if mode == "full" else []), last)
        assert run.kept_bytes == head.input_bytes + fp32  # held whatever the plan
        assert sum(run.fwd[0::2]) == pytest.approx(sum(op.fwd_s for op in head.ops))
        assert sum(run.bwd[0::2]) == pytest.approx(sum(op.bwd_s for op in head.ops))
    info = policy.analyse(head)
    assert loss.id not in info.units and loss.id not in policy.full_recompute(info)
    assert "outside the layer" in policy.validate(info, [loss.id], [])  # an old plan naming it: refused by check
    assert "outside the layer" in policy.validate(info, [], [":mm#0", loss.id])
    for algo, limit in (("heu", "1.6MiB"), ("none", None), ("full", None)):
        out = tmp_path / f"{algo}.json"
        r = lynx("plan", prof, "--algo", algo, "-o", out, *(("--memory-limit", limit) if limit else ()))
        assert r.exit_code == 0, r.output
        plan = load_model(out, Plan)
        named = [op for st in plan.stages for p in st.policies for op in (*p.keep, *p.recompute)]
        assert named and not [op for op in named if op.startswith("loss:")], algo
        assert plan.predicted.stages[-1].activation_bytes >= fp32


@pytest.fixture(scope="module")
def heu_plan(tmp_path_factory):
    """The analytic profile of CONFIG and its HEU plan at a limit that makes it recompute."""
    d = tmp_path_factory.mktemp("analytic")
    (d / "config.json").write_text(json.dumps(CONFIG))
    assert lynx("profile", d / "config.json", "--hardware", "h100-80g-nvlink", "--seq-len", str(SEQ),
                "--micro-batch-size", str(BATCH), "-o", d / "profile.json").exit_code == 0
    r = lynx("plan", d / "profile.json", "--algo", "heu", "--memory-limit", "3.0MiB", "-o", d / "plan.json")
    assert r.exit_code == 0, r.output
    return d / "plan.json"


@needs_torchtitan
def test_analytic_heu_plan_applies_to_torchtitans_llama(heu_plan, tmp_path):
    """HF op ids (bf16: the norms' upcasts and casts back, RoPE's casts) land on the torchtitan ops of the same role:
    each kept HF tensor's counterpart is a tensor torchtitan's block saves too (from a profile of that block)."""
    from lynx_planner.integrations.torchtitan import debug_llama3

    plan = load_model(heu_plan, Plan)
    kept_hf = [op for p in plan.stages[0].policies if p.block == "LlamaDecoderLayer" for op in p.keep]
    assert kept_hf and any(p.recompute for p in plan.stages[0].policies if p.block == "LlamaDecoderLayer")
    (tmp_path / "tt.py").write_text(  # torchtitan's Llama 3 with separate q, k, v projections
        "import torch\nfrom lynx_planner.integrations.torchtitan import debug_llama3\n\n"
        "def lynx_model():\n    return debug_llama3(layers=1, fuse_qkv=False), (torch.randint(0, 2048, (2, 16)),)\n")
    r = lynx("profile", tmp_path / "tt.py", "--dtype", "bf16", "-o", tmp_path / "tt.json")
    assert r.exit_code == 0, r.output
    block = load_model(tmp_path / "tt.json", Profile).blocks["Llama3TransformerBlock"]
    saved = {ref for op in block.ops for ref in op.saves}

    torch.manual_seed(3)
    base = debug_llama3(layers=CONFIG["num_hidden_layers"], fuse_qkv=False, dtype=torch.bfloat16)
    # role by role: keeping every tensor HF's block saves is keeping every tensor torchtitan's block saves
    hf_block = load_model(heu_plan.parent / "profile.json", Profile).blocks["LlamaDecoderLayer"]
    keep_all = LayerPolicy(layers=(1, 2), block="LlamaDecoderLayer", mode="selective",
                           keep=list(policy.analyse(hf_block).units))
    assert set(block_policy(keep_all, base.layers["0"], "layers.0").keep) == set(policy.analyse(block).units)
    tokens = torch.randint(0, 2048, (BATCH, SEQ))
    planned = apply_plan(copy.deepcopy(base), heu_plan, stage=0)
    layers = runtime_of(planned).layers
    assert [l.path for l in layers] == ["tok_embeddings", *(f"layers.{i}" for i in range(4)), "norm", "lm_head"]
    for layer in layers[1:5]:
        assert layer.keep and layer.keep <= saved, sorted(layer.keep - saved)

    def step(model):
        model.zero_grad(set_to_none=True)
        model(tokens).float().square().mean().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    reference, got = step(base), step(planned)
    assert got.keys() == reference.keys()
    for name, g in got.items():
        assert torch.equal(g, reference[name]), name
    assert runtime_of(planned).recomputations(0)  # the plan recomputed in torchtitan's blocks

    # the same through torchtitan's AC hook (what parallelize does with the trainer config's AC)
    from lynx_planner.integrations.torchtitan import LynxAC
    hooked = copy.deepcopy(base)
    LynxAC.Config(plan=str(heu_plan)).build().apply(hooked)
    assert [(l.path, l.keep) for l in runtime_of(hooked).layers] == [(l.path, l.keep) for l in layers]
    got = step(hooked)
    assert got.keys() == reference.keys() and all(torch.equal(g, reference[n]) for n, g in got.items())

    # a selective final norm (HF's LlamaRMSNorm ids) on torchtitan's RMSNorm: both upcasts kept, rsqrt recomputed
    info = policy.analyse(load_model(heu_plan.parent / "profile.json", Profile).blocks["LlamaRMSNorm"])
    keep = frozenset(u for u in info.units if "rsqrt" not in u)
    last = plan.stages[0].policies[-2]
    assert last.block == "LlamaRMSNorm"
    plan.stages[0].policies[-2] = last.model_copy(update={"mode": "selective", "keep": sorted(keep),
                                                          "recompute": list(policy.closure(info, keep))})
    planned = apply_plan(copy.deepcopy(base), plan, stage=0)
    assert runtime_of(planned).layers[5].keep == {":_to_copy#0", ":mul#0"}  # the upcast; what the weight reads
    got = step(planned)
    for name, g in got.items():
        assert torch.equal(g, reference[name]), name
    assert 5 in runtime_of(planned).recomputations(0)
