"""Helpers of the runtime tests: plans built from policy.py (no solver), tiny GPT stages, a live-bytes tracker."""

from __future__ import annotations

import copy
import socket
from dataclasses import dataclass

import torch
from torch import nn

from lynx_planner import policy
from lynx_planner.analytic import gpt_profile
from lynx_planner.models.catalog import GPTConfig
from lynx_planner.models.gpt_block import GPTBlock
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.profiler.memory import LiveBytes  # noqa: F401  (re-exported for the runtime tests)
from lynx_planner.schema import (
    LayerPolicy,
    ParallelConfig,
    Plan,
    PlanParallel,
    Predicted,
    Profile,
    SolverInfo,
    StagePlan,
    StagePrediction,
)

HIDDEN, HEADS, SEQ, VOCAB, DROPOUT = 64, 4, 32, 128, 0.1


def tiny_profile(num_layers: int, dropout: float = DROPOUT, micro_batch_size: int = 1) -> Profile:
    """The analytic profile of the tiny GPT the tests build (bf16 activations, 1-byte dropout masks)."""
    cfg = GPTConfig("tiny", num_layers, HIDDEN, HEADS, vocab=VOCAB)
    par = ParallelConfig(seq_len=SEQ, micro_batch_size=micro_batch_size)
    return gpt_profile(cfg, par, HARDWARE["a100-80g-nvlink"], dropout=dropout)


@dataclass(frozen=True)
class Spec:
    """One layer's plan entry: 'none', 'full' or 'selective' (Megatron's keep set unless `keep` is given)."""

    mode: str
    at: str = "on_demand"
    keep: tuple[str, ...] | None = None


def layer_policy(info: policy.BlockInfo, index: int, spec: Spec) -> LayerPolicy:
    if spec.mode == "none":
        keep, recompute = policy.none_keep(info), ()
    elif spec.mode == "full":
        keep, recompute = frozenset(), policy.full_recompute(info)
    else:
        keep = frozenset(spec.keep) if spec.keep is not None else policy.selective_keep(info)
        recompute = policy.closure(info, keep)
    return LayerPolicy(layers=(index, index + 1), block=info.block.name, mode=spec.mode,
                       keep=[o.id for o in info.block.ops if o.id in keep],
                       recompute=list(recompute), at=spec.at)


def plan_from_policies(profile: Profile, stages: list[list[Spec]], first_layer: int = 1,
                       profile_path: str = "profile.json", profile_sha256: str = "0" * 64,
                       num_microbatches: int = 1, schedule: str = "1f1b") -> Plan:
    """A plan whose stages hold consecutive layers from `first_layer` (1: the first gpt_layer), `predicted` zero."""
    stage_plans, index = [], first_layer
    for s, specs in enumerate(stages):
        policies = []
        for spec in specs:
            info = policy.analyse(profile.blocks[profile.layers[index].block])
            policies.append(layer_policy(info, index, spec))
            index += 1
        first = index - len(specs)
        stage_plans.append(StagePlan(stage=s, layers=(first, index), policies=policies,
                                     layer_names=[layer.name for layer in profile.layers[first:index]]))
    zero = [StagePrediction(stage=s, peak_memory_bytes=0, static_bytes=0, activation_bytes=0, busy_time_s=0,
                            exposed_recompute_s=0, hidden_recompute_s=0) for s in range(len(stages))]
    return Plan(algo="test", profile_sha256=profile_sha256, profile_path=profile_path, memory_limit_bytes=0,
                parallel=PlanParallel(tp=1, pp=len(stages), dp=1, num_microbatches=num_microbatches,
                                      schedule=schedule),
                stages=stage_plans, predicted=Predicted(iteration_time_s=0, ideal_iteration_time_s=0, stages=zero),
                solver=SolverInfo(name="test", status="heuristic", search_time_s=0))


def predicted_kept_bytes(profile: Profile, stage: StagePlan, in_flight: int) -> int:
    """The plan's activation bytes of a stage: the sum of its layers' kept bytes, times the in-flight micro-batches."""
    total = 0
    for p in stage.policies:
        info = policy.analyse(profile.blocks[p.block])
        kept = policy.cost(info, frozenset(p.keep) if p.mode != "full" else frozenset(), tuple(p.recompute))
        total += kept.kept_bytes * (p.layers[1] - p.layers[0])
    return total * in_flight


class Stage(nn.Module):
    """Gpt layers under the model's paths ('layers.<i>'), as the analytic profile names them."""

    def __init__(self, n_layers: int, dropout: float = DROPOUT, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.layers = nn.ModuleList(GPTBlock(HIDDEN, HEADS, SEQ, dropout=dropout) for _ in range(n_layers))
        self.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def inputs(n: int, dtype: torch.dtype = torch.bfloat16, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(SEQ, 1, HIDDEN, generator=g).to(dtype).requires_grad_() for _ in range(n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StageModule(nn.Module):
    """Some layers of a model under the model's paths ('layers.<i>'), batch-first at its boundary: a pipeline stage
    (or one chunk of an interleaved rank)."""

    def __init__(self, model: nn.Module, indices: range):
        super().__init__()
        self.layers = nn.ModuleDict({str(i): copy.deepcopy(model.layers[i]) for i in indices})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(0, 1).contiguous()
        for layer in self.layers.values():
            x = layer(x)
        # a copy, never a view (a micro-batch of one is contiguous either way): zero bubble's input-gradient pass
        # detaches the stage's outputs in place
        return x.transpose(0, 1).clone(memory_format=torch.contiguous_format)
