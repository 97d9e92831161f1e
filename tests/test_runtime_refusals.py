"""What the runtime must find in a module tree, on modules built by hand or taken from transformers (not from lynx's
code): a recomputing layer without a counterpart refused, routed experts found (fused 3-D weights, a ModuleList of
identical experts) and nothing else taken for experts, a checkpoint_wrapper around the planned layers refused when
the plan is applied."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from lynx_planner.io import load_model
from lynx_planner.runtime import PlanMismatchError, apply_plan
from lynx_planner.runtime.routing import expert_lists, routed_paths
from lynx_planner.schema import Plan

PLAN = "plans/gpt-1.3b-a100-80g-pcie-tp2-pp2-mb2-m8-heu.json"  # lynx's names: embedding, layers.N, lm_head


def _reference_gpt():
    from lynx_planner.models.gpt_block import GPT

    torch.manual_seed(2)
    return GPT(vocab=128, hidden=64, heads=4, layers=24, seq_len=32, attention="flash", dropout=0.1)


def test_a_recomputing_layer_without_a_counterpart_is_refused():
    """lynx's one final layer (lm_head) against the reference GPT's two (norm, head): left alone when the plan does
    not recompute it, refused, naming it, when the plan recomputes it."""
    plan = load_model(PLAN, Plan)
    apply_plan(_reference_gpt(), plan, stage=1)  # lm_head's mode is none: fine
    last = plan.stages[1].policies[-1]
    assert plan.stages[1].layer_names[-1] == "lm_head" and last.mode == "none"
    plan.stages[1].policies[-1] = last.model_copy(update={"mode": "full", "keep": [], "recompute": []})
    with pytest.raises(PlanMismatchError, match=r"'lm_head'.*recomputes \(full\) but has no counterpart"):
        apply_plan(_reference_gpt(), plan, stage=1)


class _FusedExperts(nn.Module):
    """All experts' weights in 3-D tensors, as transformers' grouped experts hold them."""

    def __init__(self, n: int = 4, h: int = 8, f: int = 16):
        super().__init__()
        self.num_experts = n
        self.gate_up_proj = nn.Parameter(torch.zeros(n, 2 * f, h))
        self.down_proj = nn.Parameter(torch.zeros(n, h, f))


class _Layer(nn.Module):
    def __init__(self, experts: nn.Module):
        super().__init__()
        self.norms = nn.ModuleList([nn.LayerNorm(8), nn.LayerNorm(16)])  # a list, not of identical modules
        self.drops = nn.ModuleList([nn.Dropout(0.1) for _ in range(4)])  # identical, but no weights
        self.mlp = nn.Module()
        self.mlp.experts = experts


def test_fused_three_d_experts_are_routed():
    layer = _Layer(_FusedExperts())
    assert routed_paths(layer) == ("mlp", "mlp.experts")
    assert expert_lists(layer) == {}


def test_a_list_of_identical_experts_is_routed_and_other_lists_are_not():
    layer = _Layer(nn.ModuleList([nn.Linear(8, 8) for _ in range(4)]))
    assert expert_lists(layer) == {"mlp.experts": ["0", "1", "2", "3"]}
    assert routed_paths(layer) == ("mlp", "mlp.experts")
    plain = _Layer(nn.Linear(8, 8))  # no experts: neither the norms (unlike) nor the dropouts (no weights) are
    assert expert_lists(plain) == {} and routed_paths(plain) == ()


def test_transformers_mixtral_layer_has_routed_experts_and_llama_none():
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1)
    mix = transformers.MixtralForCausalLM(transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2,
                                                                     **common))
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    assert "mlp.experts" in routed_paths(mix.model.layers[0])
    assert routed_paths(llama.model.layers[0]) == ()


def test_a_checkpoint_wrapper_around_the_planned_layers_is_refused_when_applied():
    """torch's checkpoint_wrapper around the module holding the planned layers (not on each layer): found in the
    layers' ancestors by apply_plan, before any forward runs."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    class Outer(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = checkpoint_wrapper(inner)

    model = Outer(_reference_gpt())
    with pytest.raises(PlanMismatchError, match="checkpoint_wrapper"):
        apply_plan(copy.deepcopy(model), load_model(PLAN, Plan), stage=0)
